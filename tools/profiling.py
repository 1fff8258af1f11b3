"""Static (MACs, params), operator-level and per-module profiles of image classifiers, as plain JSON-ready dicts."""

from __future__ import annotations

import contextlib
import inspect
import io
import logging
import os
import statistics
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from profiling_agent.tools.device import resolve_device

logger = logging.getLogger(__name__)

MACS_COUNTED = (
    "MACs of one image (batch 1), fp32 architecture. Counted: ptflops module hooks (conv, linear incl. bias adds, "
    "norms, activations, pooling), dynamically quantized Linear as its fp32 Linear, transformers activation "
    "modules (1 per output element), functional matmul/mm/bmm/addmm/baddbmm, torch.add/torch.mul, softmax, "
    "F.* activations and pooling, and scaled_dot_product_attention (QK^T + softmax + AV). Functional MACs go to "
    "the innermost module running. Not counted: ops written as Python operators (x + y, x * y, x @ y), "
    "reshapes, dropout, embedding lookups."
)

# ptflops and the SDPA counter patch torch functions globally: one counting pass at a time per process.
_PATCH_LOCK = threading.Lock()


# ---------------------------------------------------------------- calling the model


_PIXEL_KWARG: dict[type, bool] = {}  # model class -> whether forward takes `pixel_values` (cached: no timing cost)


def _takes_pixel_values(model: nn.Module) -> bool:
    cls = type(model)
    if cls not in _PIXEL_KWARG:
        try:
            _PIXEL_KWARG[cls] = "pixel_values" in inspect.signature(model.forward).parameters
        except (TypeError, ValueError):
            _PIXEL_KWARG[cls] = False
    return _PIXEL_KWARG[cls]


def forward_logits(model: nn.Module, pixels: torch.Tensor) -> torch.Tensor:
    """Run `model` on a pixel batch and return its logits (HF `pixel_values=` call, or positional)."""
    out = model(pixel_values=pixels) if _takes_pixel_values(model) else model(pixels)
    logits = getattr(out, "logits", out)
    if isinstance(logits, (tuple, list)):
        logits = logits[0]
    return logits


class PixelWrapper(nn.Module):
    """Wrap an image classifier so it takes one tensor and returns logits (what ptflops calls)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        """Return the wrapped model's logits."""
        return forward_logits(self.model, pixels)


def input_chw(input_shape: Sequence[int] | Mapping[str, Any]) -> tuple[int, int, int]:
    """Normalize (C, H, W) or {"channels", "height", "width"} to a (C, H, W) tuple of ints."""
    if isinstance(input_shape, Mapping):
        shape = tuple(int(input_shape[k]) for k in ("channels", "height", "width"))
    else:
        shape = tuple(int(v) for v in input_shape)
    if len(shape) != 3 or min(shape) < 1:
        raise ValueError(f"input_shape must be (channels, height, width), got {input_shape!r}")
    return shape  # type: ignore[return-value]


def model_device(model: nn.Module) -> torch.device:
    """Return the device of the model's first parameter or buffer (CPU when it has none)."""
    for tensor in model.parameters():
        return tensor.device
    for tensor in model.buffers():
        return tensor.device
    return torch.device("cpu")


def example_input(input_shape: Sequence[int] | Mapping[str, Any], *, batch: int = 1, seed: int = 0,
                  device: torch.device | str = "cpu") -> torch.Tensor:
    """Build a seeded standard-normal pixel batch of shape (batch, C, H, W)."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randn((batch, *input_chw(input_shape)), generator=generator).to(device)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_forward_ms(model: nn.Module, pixels: torch.Tensor) -> float:
    """Time one forward pass in ms (synchronizing CUDA); call under torch.inference_mode()."""
    _sync(pixels.device)
    start = time.perf_counter()
    forward_logits(model, pixels)
    _sync(pixels.device)
    return (time.perf_counter() - start) * 1e3


def median_forward_ms(model: nn.Module, pixels: torch.Tensor, *, warmup: int = 2, repeats: int = 5) -> float:
    """Return the median forward latency in ms after `warmup` untimed runs."""
    model.eval()
    with torch.inference_mode():
        for _ in range(warmup):
            forward_logits(model, pixels)
        return statistics.median(timed_forward_ms(model, pixels) for _ in range(max(repeats, 1)))


# ---------------------------------------------------------------- parameters


def _linear_packed_params_type() -> type | None:
    try:
        from torch.ao.nn.quantized.modules.linear import LinearPackedParams
    except ImportError:  # pragma: no cover - depends on the torch build
        return None
    return LinearPackedParams


def packed_linear_tensors(module: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None, torch.dtype] | None:
    """Return (weight, bias, storage dtype) of a quantized Linear's packed params, or None for other modules."""
    packed_type = _linear_packed_params_type()
    packed = getattr(module, "_packed_params", None)
    if packed_type is None or not isinstance(packed, packed_type):
        return None
    weight, bias = packed._weight_bias()
    return weight, bias, packed.dtype


def own_params(module: nn.Module, seen: set[int] | None = None) -> int:
    """Count the module's own parameters (not its children's); packed quantized Linear weights count too.

    `seen` holds ids of tensors already counted, so shared (tied) parameters are counted once.
    """
    seen = set() if seen is None else seen
    total = 0
    for param in module.parameters(recurse=False):
        if id(param) not in seen:
            seen.add(id(param))
            total += param.numel()
    packed = packed_linear_tensors(module)
    if packed is not None:
        weight, bias, _ = packed
        total += weight.numel() + (bias.numel() if bias is not None else 0)
    return total


def type_name(module: nn.Module) -> str:
    """Return the module's class name, prefixed "DynamicQuantized" for torch.ao dynamically quantized modules."""
    cls = type(module)
    prefix = "DynamicQuantized" if cls.__module__.startswith("torch.ao.nn.quantized.dynamic") else ""
    return prefix + cls.__name__


def _is_leaf(module: nn.Module) -> bool:
    """Return True when the module has no children (a quantized Linear's packed params do not count)."""
    packed_type = _linear_packed_params_type()
    return not any(packed_type is None or not isinstance(child, packed_type) for child in module.children())


def count_params(model: nn.Module) -> int:
    """Count the logical parameters of a model, quantized Linear weights included (each counted once)."""
    seen: set[int] = set()
    return sum(own_params(module, seen) for module in model.modules())


# ---------------------------------------------------------------- static profile (ptflops)


def _quantized_linear_macs_hook(module: nn.Module, inputs: tuple, output: Any) -> None:
    x = inputs[0]
    tokens = x.numel() // max(x.shape[-1], 1)
    bias = module.bias() if callable(getattr(module, "bias", None)) else None
    per_token = module.in_features * module.out_features + (module.out_features if bias is not None else 0)
    module.__flops__ += int(tokens * per_token)


def _numel_macs_hook(module: nn.Module, inputs: tuple, output: Any) -> None:
    if torch.is_tensor(output):
        module.__flops__ += int(output.numel())


def _is_transformers_activation(cls: type) -> bool:
    return cls.__module__.startswith("transformers.activations")


def _sdpa_macs(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *args: Any, **kwargs: Any) -> int:
    """MACs of scaled dot-product attention as eager attention counts them: QK^T, softmax, AV."""
    batch_heads = query.numel() // (query.shape[-2] * query.shape[-1])
    q_len, dim = query.shape[-2], query.shape[-1]
    k_len, v_dim = key.shape[-2], value.shape[-1]
    return int(batch_heads * q_len * k_len * (dim + 1 + v_dim))


class _MacRecorder:
    """Attribute ptflops module counts and functional-op counts to module names.

    It is also the collector ptflops' functional patches append to: `append(macs)` books the MACs on the
    innermost module running, unless that module's own ptflops hook already counts it (e.g. nn.GELU calling
    F.gelu), which would count it twice.
    """

    def __init__(self, model: nn.Module) -> None:
        self.names = {id(module): name for name, module in model.named_modules()}
        self.module_macs: dict[str, int] = defaultdict(int)
        self.functional_macs: dict[str, int] = defaultdict(int)
        self.skipped = 0
        self.hooked_types: set[type] = set()
        self.stack: list[nn.Module] = []
        self.handles: list[Any] = []
        self.model = model

    def module_hooks(self) -> dict[type, Any]:
        """Return custom ptflops hooks, one per module type present, that also record per-module counts."""
        from ptflops.pytorch_ops import MODULES_MAPPING

        quantized = {type(m) for m in self.model.modules() if packed_linear_tensors(m) is not None}
        hooks = {}
        for cls in {type(m) for m in self.model.modules()}:
            if cls in MODULES_MAPPING:
                base = MODULES_MAPPING[cls]
            elif cls in quantized:
                base = _quantized_linear_macs_hook
            elif _is_transformers_activation(cls):
                base = _numel_macs_hook
            else:
                continue
            hooks[cls] = self._recording(base)
            self.hooked_types.add(cls)
        return hooks

    def _recording(self, base: Any) -> Any:
        def hook(module: nn.Module, inputs: tuple, output: Any) -> None:
            before = module.__flops__
            base(module, inputs, output)
            self.module_macs[self.names.get(id(module), "")] += int(module.__flops__ - before)

        return hook

    def append(self, macs: Any) -> None:
        """Book functional-op MACs on the innermost running module (ptflops collector interface)."""
        top = self.stack[-1] if self.stack else self.model
        if type(top) in self.hooked_types:
            self.skipped += int(macs)
        else:
            self.functional_macs[self.names.get(id(top), "")] += int(macs)

    def attach(self) -> None:
        """Track the running module with forward pre/post hooks on every module."""
        for module in self.model.modules():
            self.handles.append(module.register_forward_pre_hook(self._enter))
            self.handles.append(module.register_forward_hook(self._exit))

    def _enter(self, module: nn.Module, args: tuple) -> None:
        self.stack.append(module)

    def _exit(self, module: nn.Module, args: tuple, output: Any) -> None:
        if self.stack and self.stack[-1] is module:
            self.stack.pop()

    def detach(self) -> None:
        """Remove the tracking hooks."""
        for handle in self.handles:
            handle.remove()
        self.handles.clear()
        self.stack.clear()


@contextlib.contextmanager
def _functional_counting(recorder: _MacRecorder):
    """Patch torch functional ops (ptflops' patches, plus SDPA) to report MACs to `recorder`."""
    from ptflops.pytorch_engine import patch_functional, patch_tensor_ops, unpatch_functional, unpatch_tensor_ops

    sdpa = F.scaled_dot_product_attention

    def counted_sdpa(query, key, value, *args, **kwargs):
        recorder.append(_sdpa_macs(query, key, value))
        return sdpa(query, key, value, *args, **kwargs)

    patch_functional(recorder)
    patch_tensor_ops(recorder)
    F.scaled_dot_product_attention = counted_sdpa
    try:
        yield
    finally:
        F.scaled_dot_product_attention = sdpa
        unpatch_tensor_ops()
        unpatch_functional()


def _count_macs(model: nn.Module, pixels: torch.Tensor) -> tuple[_MacRecorder, int | None, str]:
    """Run ptflops (pytorch backend) once; return the recorder, ptflops' own module total and its output."""
    from ptflops import get_model_complexity_info

    recorder = _MacRecorder(model)
    wrapper = PixelWrapper(model)
    captured = io.StringIO()
    with _PATCH_LOCK, contextlib.redirect_stdout(captured), contextlib.redirect_stderr(captured):
        recorder.attach()
        try:
            with _functional_counting(recorder), torch.inference_mode():
                macs, _ = get_model_complexity_info(
                    wrapper, tuple(pixels.shape[1:]), print_per_layer_stat=False, as_strings=False,
                    input_constructor=lambda _res: pixels, ost=captured, verbose=False,
                    custom_modules_hooks=recorder.module_hooks(), backend="pytorch",
                    backend_specific_config={"count_functional": False},
                )
        finally:
            recorder.detach()
    return recorder, macs, captured.getvalue()


def static_profile(model: nn.Module, input_shape: Sequence[int] | Mapping[str, Any]) -> dict[str, Any]:
    """Count MACs and parameters of one image, per module and in total, with ptflops.

    Rows cover every module with its own parameters or MACs (leaf layers, plus containers that hold
    parameters such as embeddings or run functional ops such as attention matmuls), so per-row MACs and
    params sum exactly to the totals. When counting fails (an unsupported model), `total_macs` is None,
    rows carry params only and `error` says why.

    Args:
        model: The classifier; it stays on its device and in eval mode.
        input_shape: (C, H, W) or {"channels", "height", "width"}.

    Returns:
        {"total_macs", "total_params", "module_macs", "functional_macs", "ptflops_macs", "input_shape",
        "batch", "counted", "layers": [{"name", "type", "macs", "params", "leaf"}]} (plus "error" on failure).
    """
    chw = input_chw(input_shape)
    model.eval()
    pixels = example_input(chw, device=model_device(model))
    error = ""
    try:
        recorder, ptflops_macs, output = _count_macs(model, pixels)
        if ptflops_macs is None:
            error = "ptflops failed: " + (output.strip().splitlines() or ["no output"])[-1]
    except Exception as exc:  # noqa: BLE001 - any failure of the counter must not stop profiling
        recorder, ptflops_macs, error = _MacRecorder(model), None, f"MAC counting failed: {type(exc).__name__}: {exc}"
    if error:
        logger.warning("%s; MACs are not available for this model", error)
    elif sum(recorder.module_macs.values()) != ptflops_macs:
        logger.warning("per-module MACs %d differ from ptflops' total %d", sum(recorder.module_macs.values()),
                       ptflops_macs)
    seen: set[int] = set()
    layers = []
    for name, module in model.named_modules():
        params = own_params(module, seen)
        macs = 0 if error else recorder.module_macs.get(name, 0) + recorder.functional_macs.get(name, 0)
        if params or macs:
            layers.append({"name": name or "(model)", "type": type_name(module), "macs": int(macs),
                           "params": int(params), "leaf": _is_leaf(module)})
    result: dict[str, Any] = {
        "total_macs": None if error else sum(row["macs"] for row in layers),
        "total_params": sum(row["params"] for row in layers),
        "module_macs": None if error else int(sum(recorder.module_macs.values())),
        "functional_macs": None if error else int(sum(recorder.functional_macs.values())),
        "ptflops_macs": None if ptflops_macs is None else int(ptflops_macs),
        "input_shape": list(chw),
        "batch": 1,
        "counted": MACS_COUNTED,
        "layers": layers,
    }
    if error:
        result["error"] = error
    return result


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
    from torch.profiler import ProfilerActivity, profile

    cuda = example.device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    model.eval()
    with torch.inference_mode():
        forward_logits(model, example)
        _sync(example.device)
        with _quiet_native_stderr(), profile(activities=activities, profile_memory=True) as prof:
            forward_logits(model, example)
            _sync(example.device)
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
            _sync(self.device)
            self.stack.append([self.names.get(id(module), "?"), time.perf_counter_ns(), 0, False])

    def _exit(self, module: nn.Module, args: tuple, output: Any) -> None:
        if not self.active or not self.stack:
            return
        _sync(self.device)
        name, start, children, had_child = self.stack.pop()
        elapsed = time.perf_counter_ns() - start
        if self.stack:
            self.stack[-1][2] += elapsed
            self.stack[-1][3] = True
        tensors = list(_tensors(output))
        entry = self.current.setdefault(name, {"incl": 0, "self": 0, "calls": 0, "act_bytes": 0, "leaf": True,
                                               "shape": list(tensors[0].shape) if tensors else []})
        entry["incl"] += elapsed
        entry["self"] += elapsed - children
        entry["calls"] += 1
        entry["act_bytes"] += sum(t.numel() * t.element_size() for t in tensors)
        entry["leaf"] = entry["leaf"] and not had_child
        self.order.setdefault(name, len(self.order))

    def rows(self) -> list[dict[str, Any]]:
        """Return one row per called module, in first-call order, with medians over the passes."""
        rows = []
        for name in sorted(self.order, key=self.order.get):
            seen = [p[name] for p in self.passes if name in p]
            last = seen[-1]
            rows.append({
                "name": name,
                "type": self.types.get(name, "?"),
                "leaf": bool(last["leaf"]),
                "calls": int(last["calls"]),
                "latency_ms": statistics.median(p.get(name, {}).get("incl", 0) for p in self.passes) / 1e6,
                "self_ms": statistics.median(p.get(name, {}).get("self", 0) for p in self.passes) / 1e6,
                "act_bytes": int(last["act_bytes"]),
                "output_shape": last["shape"],
            })
        total = sum(row["self_ms"] for row in rows)
        for row in rows:
            row["self_share"] = row["self_ms"] / total if total else 0.0
        return rows


def module_timings(model: nn.Module, example: torch.Tensor, *, warmup: int = 2,
                   repeats: int = 5) -> list[dict[str, Any]]:
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


def profile_model(model: nn.Module, input_shape: Sequence[int] | Mapping[str, Any], *, device: str = "cpu",
                  warmup: int = 2, repeats: int = 5, top_k: int = 15) -> dict[str, Any]:
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


def _merge_layers(static_rows: list[dict[str, Any]], timings: list[dict[str, Any]],
                  total_macs: int) -> list[dict[str, Any]]:
    by_name: dict[str, dict[str, Any]] = {}
    for row in static_rows:
        by_name[row["name"]] = {"name": row["name"], "type": row["type"], "leaf": row["leaf"], "params": row["params"],
                                "macs": row["macs"], "latency_ms": 0.0, "act_bytes": 0, "output_shape": []}
    for row in timings:
        if not row["name"]:
            continue
        merged = by_name.setdefault(row["name"], {"name": row["name"], "type": row["type"], "params": 0, "macs": 0})
        merged.update(leaf=row["leaf"], latency_ms=row["self_ms"], latency_share=row["self_share"],
                      act_bytes=row["act_bytes"], output_shape=row["output_shape"], calls=row["calls"])
    for row in by_name.values():
        row["macs_share"] = row["macs"] / total_macs if total_macs else 0.0
        row.setdefault("latency_share", 0.0)
    return list(by_name.values())


def _environment(device: torch.device, chw: tuple[int, int, int], warmup: int, repeats: int) -> dict[str, Any]:
    import transformers

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


# ---------------------------------------------------------------- groups and summaries


def _group_fields(group: Any) -> dict[str, Any]:
    if isinstance(group, Mapping):
        return {"name": group["name"], "members": tuple(group.get("members", ())),
                "kind": group.get("kind", ""), "block": group.get("block", "")}
    return {"name": group.name, "members": tuple(group.members), "kind": getattr(group, "kind", ""),
            "block": getattr(group, "block", "")}


def _matches(row_name: str, members: Iterable[str]) -> bool:
    return any(row_name == m or row_name.startswith(m + ".") for m in members)


def group_costs(profile: Mapping[str, Any], groups: Iterable[Any]) -> dict[str, dict[str, Any]]:
    """Sum params, MACs and latency over each group's members, with shares of the model totals.

    A member names a module; its descendants count too (each layer row at most once per group), so a member
    "vit.layers.0.attention" covers q/k/v/o and the attention matmuls booked on the attention module.

    Args:
        profile: The output of `profile_model`.
        groups: PrunableGroup objects or dicts with "name" and "members" (optionally "kind", "block").

    Returns:
        {group name: {"kind", "block", "params", "macs", "latency_ms", "params_share", "macs_share",
        "latency_share", "missing"}}; `missing` lists members that matched no layer row.
    """
    totals = profile["totals"]
    layers = profile["layers"]
    out: dict[str, dict[str, Any]] = {}
    for group in groups:
        fields = _group_fields(group)
        rows = [row for row in layers if _matches(row["name"], fields["members"])]
        missing = [m for m in fields["members"] if not any(_matches(row["name"], (m,)) for row in rows)]
        params = sum(row["params"] for row in rows)
        macs = sum(row["macs"] for row in rows)
        latency = sum(row["latency_ms"] for row in rows)
        out[fields["name"]] = {
            "kind": fields["kind"],
            "block": fields["block"],
            "params": params,
            "macs": macs,
            "latency_ms": latency,
            "params_share": params / totals["params"] if totals.get("params") else 0.0,
            "macs_share": macs / totals["macs"] if totals.get("macs") else 0.0,
            "latency_share": sum(row["latency_share"] for row in rows),
            "missing": missing,
        }
    return out


def _round(value: float, digits: int = 3) -> float:
    return float(f"{value:.{digits}g}") if value else 0.0


def summarize_profile(profile: Mapping[str, Any], groups: Iterable[Any] | None = None,
                      top_k: int = 8) -> dict[str, Any]:
    """Condense a profile into a small JSON dict for an LLM prompt and the graph state.

    Returns:
        {"totals", "env", "top_latency": [{"name", "type", "latency_ms", "latency_share", "macs_share"}],
        "top_macs": [{"name", "macs", "macs_share"}], "operators": [{"op", "self_ms", "share"}],
        "groups": {"columns": [...], "rows": {name: [params_share, macs_share, latency_share]}}}. Shares are
        fractions; latencies are module self times in ms; three significant digits.
    """
    totals, env, layers = profile["totals"], profile["env"], profile["layers"]
    by_latency = sorted(layers, key=lambda row: row["latency_ms"], reverse=True)[:top_k]
    by_macs = sorted((row for row in layers if row["macs"]), key=lambda row: row["macs"], reverse=True)[:top_k]
    summary: dict[str, Any] = {
        "totals": {"params": totals["params"], "macs": totals["macs"], "latency_ms": _round(totals["latency_ms"]),
                   "act_bytes": totals["act_bytes"]},
        "env": {k: env[k] for k in ("device", "threads", "input_shape", "batch")},
        "top_latency": [{"name": r["name"], "type": r["type"], "latency_ms": _round(r["latency_ms"]),
                         "latency_share": _round(r["latency_share"]), "macs_share": _round(r["macs_share"])}
                        for r in by_latency],
        "top_macs": [{"name": r["name"], "macs": r["macs"], "macs_share": _round(r["macs_share"])} for r in by_macs],
        "operators": [{"op": r["op"], "self_ms": _round(r.get("self_cuda_ms", r["self_cpu_ms"])),
                       "share": _round(r["self_share"])} for r in profile.get("operators", [])[:top_k]],
    }
    if groups is not None:
        costs = group_costs(profile, groups)
        summary["groups"] = {
            "columns": ["params_share", "macs_share", "latency_share"],
            "rows": {name: [_round(c["params_share"]), _round(c["macs_share"]), _round(c["latency_share"])]
                     for name, c in costs.items()},
        }
    if "error" in profile:
        summary["error"] = profile["error"]
    return summary


def _human(value: float | None) -> str:
    if value is None:
        return "n/a"
    for unit, scale in (("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.2f}{unit}"
    return f"{value:.0f}"


def format_layer_table(profile: Mapping[str, Any], top: int = 30) -> str:
    """Render the `top` layers by latency as a fixed-width text table, with a totals line."""
    rows = sorted(profile["layers"], key=lambda row: row["latency_ms"], reverse=True)[:top]
    width = max([len("layer"), *(len(row["name"]) for row in rows)])
    width = min(width, 60)
    header = (f"{'layer':<{width}}  {'type':<22}  {'params':>9}  {'MACs':>9}  {'ms':>9}  {'lat %':>6}  "
              f"{'MACs %':>6}")
    lines = [header, "-" * len(header)]
    for row in rows:
        name = row["name"] if len(row["name"]) <= width else "…" + row["name"][-(width - 1):]
        lines.append(f"{name:<{width}}  {row['type'][:22]:<22}  {_human(row['params']):>9}  "
                     f"{_human(row['macs']):>9}  {row['latency_ms']:>9.3f}  {100 * row['latency_share']:>6.1f}  "
                     f"{100 * row['macs_share']:>6.1f}")
    totals = profile["totals"]
    lines.append("-" * len(header))
    lines.append(f"{'total (forward median, no hooks)':<{width}}  {'':<22}  {_human(totals['params']):>9}  "
                 f"{_human(totals['macs']):>9}  {totals['latency_ms']:>9.3f}")
    return "\n".join(lines)
