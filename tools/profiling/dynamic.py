"""Dynamic profile: the torch.profiler operator table and per-module latency and activation bytes."""

from __future__ import annotations

import contextlib
import os
import statistics
import sys
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile

from profiling_agent.tools.device import resolve_device
from profiling_agent.tools.profiling.static import static_profile, type_name
from profiling_agent.tools.runtimes.forward import (
    example_input,
    forward_logits,
    input_chw,
    median_forward_ms,
    sync_device,
)

# ---------------------------------------------------------------- operator table (torch.profiler)


@contextlib.contextmanager
def _quiet_native_stderr() -> Iterator[None]:
    """Silence native writes to stderr (kineto prints profiler start/stop lines) while the profiler runs.

    Python-level errors still propagate as exceptions; only the C++ library's chatter on fd 2 is dropped.
    """
    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:  # no real stderr (embedded interpreters): nothing to silence
        yield
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def operator_table(model: nn.Module, example: torch.Tensor, *, top_k: int = 15) -> list[dict[str, Any]]:
    """Profile one forward pass with torch.profiler and return the top operators by self time.

    One untimed forward runs first so lazy initialisation stays out of the table. CUDA activity is
    recorded when `example` is on CUDA, and the rows are then sorted by self CUDA time.

    Returns:
        Rows {"op", "calls", "self_cpu_ms", "cpu_total_ms", "self_cpu_memory_bytes", "self_share"} (plus
        "self_cuda_ms", "cuda_total_ms", "self_cuda_memory_bytes" on CUDA); `self_share` is the op's share
        of all ops' self time.
    """
    cuda = example.device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    model.eval()
    with torch.inference_mode():
        forward_logits(model, example)
        sync_device(example.device)
        with _quiet_native_stderr(), profile(activities=activities, profile_memory=True) as prof:
            forward_logits(model, example)
            sync_device(example.device)
    rows = [_operator_row(event, cuda) for event in prof.key_averages()]
    key = "self_cuda_ms" if cuda else "self_cpu_ms"
    total = sum(row[key] for row in rows) or 1.0
    for row in rows:
        row["self_share"] = row[key] / total
    rows.sort(key=lambda row: row[key], reverse=True)
    return rows[:top_k]


def _operator_row(event: Any, cuda: bool) -> dict[str, Any]:
    row = {
        "op": str(event.key),
        "calls": int(event.count),
        "self_cpu_ms": float(event.self_cpu_time_total) / 1e3,
        "cpu_total_ms": float(event.cpu_time_total) / 1e3,
        "self_cpu_memory_bytes": int(event.self_cpu_memory_usage),
    }
    if cuda:
        row["self_cuda_ms"] = float(getattr(event, "self_device_time_total", 0.0)) / 1e3
        row["cuda_total_ms"] = float(getattr(event, "device_time_total", 0.0)) / 1e3
        row["self_cuda_memory_bytes"] = int(getattr(event, "self_device_memory_usage", 0))
    return row


# ---------------------------------------------------------------- per-module timings (hooks)


def _tensors(value: Any) -> Iterable[torch.Tensor]:
    if torch.is_tensor(value):
        yield value
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _tensors(item)
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from _tensors(item)


class _TimingRecorder:
    """Time every module with forward pre/post hooks; self time excludes the time of called children."""

    def __init__(self, model: nn.Module, device: torch.device) -> None:
        self.model = model
        self.device = device
        self.names = {id(module): name for name, module in model.named_modules()}
        self.types = {name: type_name(module) for name, module in model.named_modules()}
        self.active = False
        self.stack: list[list] = []  # [name, start_ns, children_ns, had_child]
        self.passes: list[dict[str, dict[str, Any]]] = []
        self.current: dict[str, dict[str, Any]] = {}
        self.order: dict[str, int] = {}

    def attach(self) -> list[Any]:
        """Register the hooks; return their handles."""
        handles = []
        for module in self.model.modules():
            handles.append(module.register_forward_pre_hook(self._enter))
            handles.append(module.register_forward_hook(self._exit))
        return handles

    def begin(self) -> None:
        """Start recording one forward pass."""
        self.active, self.current, self.stack = True, {}, []

    def end(self) -> None:
        """Finish the pass and keep its numbers."""
        self.active = False
        self.passes.append(self.current)

    def _enter(self, module: nn.Module, args: tuple) -> None:
        if self.active:
            sync_device(self.device)
            self.stack.append([self.names.get(id(module), "?"), time.perf_counter_ns(), 0, False])

    def _exit(self, module: nn.Module, args: tuple, output: Any) -> None:
        if not self.active or not self.stack:
            return
        sync_device(self.device)
        name, start, children, had_child = self.stack.pop()
        elapsed = time.perf_counter_ns() - start
        if self.stack:
            self.stack[-1][2] += elapsed
            self.stack[-1][3] = True
        tensors = list(_tensors(output))
        entry = self.current.setdefault(
            name,
            {
                "incl": 0,
                "self": 0,
                "calls": 0,
                "act_bytes": 0,
                "leaf": True,
                "shape": list(tensors[0].shape) if tensors else [],
            },
        )
        entry["incl"] += elapsed
        entry["self"] += elapsed - children
        entry["calls"] += 1
        entry["act_bytes"] += sum(t.numel() * t.element_size() for t in tensors)
        entry["leaf"] = entry["leaf"] and not had_child
        self.order.setdefault(name, len(self.order))

    def rows(self) -> list[dict[str, Any]]:
        """Return one row per called module, in first-call order, with medians over the passes."""
        rows = []
        for name in sorted(self.order, key=lambda n: self.order[n]):
            seen = [p[name] for p in self.passes if name in p]
            last = seen[-1]
            rows.append(
                {
                    "name": name,
                    "type": self.types.get(name, "?"),
                    "leaf": bool(last["leaf"]),
                    "calls": int(last["calls"]),
                    "latency_ms": statistics.median(p.get(name, {}).get("incl", 0) for p in self.passes) / 1e6,
                    "self_ms": statistics.median(p.get(name, {}).get("self", 0) for p in self.passes) / 1e6,
                    "act_bytes": int(last["act_bytes"]),
                    "output_shape": last["shape"],
                }
            )
        total = sum(row["self_ms"] for row in rows)
        for row in rows:
            row["self_share"] = row["self_ms"] / total if total else 0.0
        return rows


def module_timings(
    model: nn.Module, example: torch.Tensor, *, warmup: int = 2, repeats: int = 5
) -> list[dict[str, Any]]:
    """Time every module of one forward pass with hooks; return medians over `repeats` passes.

    Every called module is timed, leaves and blocks alike; the model itself appears with name "".

    Returns:
        Rows {"name", "type", "leaf", "calls", "latency_ms" (inclusive median), "self_ms" (median time not
        spent in called children), "self_share" (self_ms over the sum of all modules' self_ms, root included, so
        shares sum to 1 even when scheduler stalls hit random modules in some passes), "act_bytes" (bytes of
        its outputs), "output_shape"}. `leaf` is True when no child module ran inside it.
    """
    model.eval()
    recorder = _TimingRecorder(model, example.device)
    handles = recorder.attach()
    try:
        with torch.inference_mode():
            for _ in range(warmup):
                forward_logits(model, example)
            for _ in range(max(repeats, 1)):
                recorder.begin()
                forward_logits(model, example)
                recorder.end()
    finally:
        for handle in handles:
            handle.remove()
    return recorder.rows()


# ---------------------------------------------------------------- full profile


def profile_model(
    model: nn.Module,
    input_shape: Sequence[int] | Mapping[str, Any],
    *,
    device: str = "cpu",
    warmup: int = 2,
    repeats: int = 5,
    top_k: int = 15,
) -> dict[str, Any]:
    """Profile a classifier on one seeded image: static costs, per-module latency, top operators.

    The model is put in eval mode and moved to `device` (in place). Layer rows merge the static rows with the
    timed modules by name; `latency_ms` of a row is the module's self time (children excluded), so row
    latencies add up; `latency_share` divides it by `totals.timed_ms`, the sum of every module's median self
    time (the hooked forward without scheduler stalls); the model's own self time is the share left over.
    `totals.latency_ms` is the median forward latency without hooks.

    Returns:
        A JSON-serializable dict: {"totals", "layers", "operators", "env", "counted"} (and "error" when MACs
        could not be counted).
    """
    chw = input_chw(input_shape)
    dev = resolve_device(device)
    model.eval().to(dev)
    pixels = example_input(chw, device=dev)
    static = static_profile(model, chw)
    latency = median_forward_ms(model, pixels, warmup=warmup, repeats=repeats)
    timings = module_timings(model, pixels, warmup=warmup, repeats=repeats)
    operators = operator_table(model, pixels, top_k=top_k)
    root = next((row for row in timings if row["name"] == ""), None)
    timed_ms = sum(row["self_ms"] for row in timings)
    layers = _merge_layers(static["layers"], timings, static["total_macs"] or 0)
    totals = {
        "params": static["total_params"],
        "macs": static["total_macs"],
        "latency_ms": latency,
        "timed_ms": timed_ms,
        "act_bytes": sum(row["act_bytes"] for row in timings if row["leaf"] and row["name"]),
        "output_bytes": root["act_bytes"] if root else 0,
    }
    result = {
        "totals": totals,
        "layers": layers,
        "operators": operators,
        "env": _environment(dev, chw, warmup, repeats),
        "counted": static["counted"],
    }
    if "error" in static:
        result["error"] = static["error"]
    return result


def _merge_layers(
    static_rows: list[dict[str, Any]], timings: list[dict[str, Any]], total_macs: int
) -> list[dict[str, Any]]:
    by_name: dict[str, dict[str, Any]] = {}
    for row in static_rows:
        by_name[row["name"]] = {
            "name": row["name"],
            "type": row["type"],
            "leaf": row["leaf"],
            "params": row["params"],
            "macs": row["macs"],
            "latency_ms": 0.0,
            "act_bytes": 0,
            "output_shape": [],
        }
    for row in timings:
        if not row["name"]:
            continue
        merged = by_name.setdefault(row["name"], {"name": row["name"], "type": row["type"], "params": 0, "macs": 0})
        merged.update(
            leaf=row["leaf"],
            latency_ms=row["self_ms"],
            latency_share=row["self_share"],
            act_bytes=row["act_bytes"],
            output_shape=row["output_shape"],
            calls=row["calls"],
        )
    for row in by_name.values():
        row["macs_share"] = row["macs"] / total_macs if total_macs else 0.0
        row.setdefault("latency_share", 0.0)
    return list(by_name.values())


def _environment(device: torch.device, chw: tuple[int, int, int], warmup: int, repeats: int) -> dict[str, Any]:
    import transformers  # lazy: transformers; the CLI's flag check runs without it

    return {
        "device": str(device),
        "cuda_device": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "input_shape": list(chw),
        "batch": 1,
        "warmup": warmup,
        "repeats": repeats,
    }
