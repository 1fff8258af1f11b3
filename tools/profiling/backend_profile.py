"""Per-layer profile of the backend forms a run can deliver, mapped back to the prunable groups.

A backend is a pluggable pair: `build` turns the FP32 model into a deployable file, `time_nodes` runs it and
returns the time of each of its nodes. ONNX Runtime comes first (its profiler: `SessionOptions.enable_profiling`,
one `Node` event per kernel run); another backend (OpenVINO's per-layer PERF_COUNT counters) adds a `BackendForm`
with its own two functions. Node names of the TorchScript export carry the module path
("/vit/layers.0/mlp/fc1/MatMul" is module "vit.layers.0.mlp.fc1"), so node times sum to module rows the planners'
group costs (`summary.group_costs`) read as they read the torch profile's.
"""

from __future__ import annotations

import json
import logging
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from profiling_agent.tools.profiling.identical import identical_layers, pooled_rows
from profiling_agent.tools.profiling.node_samples import node_medians, sample_calls, warm_run_s
from profiling_agent.tools.profiling.shared_export import onnx_export, shared_exports
from profiling_agent.tools.profiling.summary import group_costs
from profiling_agent.tools.runtimes.onnx_runtime import quantize_onnx

log = logging.getLogger(__name__)

Builder = Callable[[nn.Module, torch.Tensor, Path], Path]
NodeTimer = Callable[[Path, torch.Tensor, int, int], dict[str, float]]
ModuleOf = Callable[[str], str]


WRAPPER = "model"  # the export wraps the classifier as `PixelWrapper.model`: node paths start with /model/


def module_path_of(scopes: list[str]) -> str:
    """Join TorchScript scope segments into a module path.

    A called container (an `nn.Sequential` named `layer`) is a scope of its own and names its children
    `layer.0`, `layer.1`: the segments "layer", "layer.0" are the module `layer.0`, not `layer.layer.0`.
    """
    kept = [s for i, s in enumerate(scopes) if not (i + 1 < len(scopes) and scopes[i + 1].startswith(s + "."))]
    return ".".join(kept)


def module_of(node: str) -> str:
    """Return the module path a TorchScript-exported node name carries ('' when it carries none)."""
    parts = [p for p in node.split("/") if p]
    if parts and parts[0] == WRAPPER:
        parts = parts[1:]
    return module_path_of(parts[:-1]) if len(parts) > 1 else ""


@dataclass(frozen=True)
class BackendForm:
    """One deployable form: how to build it and how to time its nodes.

    Attributes:
        name: The form's name as the variants call it (ort_fp32, ort_dynamic; later ov_fp32, ov_int8...).
        backend: The runtime (`onnxruntime`, `openvino`).
        build: build(model, example pixels, folder) -> the file to run.
        time_nodes: time_nodes(file, pixels, warmup, repeats) -> {node name: median ms per run}.
        module_path: node name -> the module path it carries ('' when none); the runtime's naming decides.
    """

    name: str
    backend: str
    build: Builder
    time_nodes: NodeTimer
    module_path: ModuleOf = module_of


def _build_ort_fp32(model: nn.Module, example: torch.Tensor, folder: Path) -> Path:
    return onnx_export(model, example, folder)  # within `profile_backends`, the forms' one export


def _build_ort_dynamic(model: nn.Module, example: torch.Tensor, folder: Path) -> Path:
    src = _build_ort_fp32(model, example, folder)
    folder.mkdir(parents=True, exist_ok=True)
    return Path(quantize_onnx(src, folder / "model_dynamic.onnx", per_channel=True)["path"])


def time_ort_nodes(path: Path, pixels: torch.Tensor, warmup: int = 2, repeats: int = 5) -> dict[str, float]:
    """Run an ONNX file with ONNX Runtime's profiler on; return each node's median kernel time per run, in ms.

    `repeats` samples of `sample_calls` runs each (one run for a full-size model, up to 200 for a fast one), after
    `warmup` untimed ones (at least one); a node's time is its median over the samples of its mean in each.

    The profile file is written to a scratch folder and deleted. Runs are single-threaded and sequential (as the
    side-by-side latency measurements), with intra-op spinning off.
    """
    import onnxruntime as ort  # lazy: onnxruntime; tools.planning.round loads this module without it

    with tempfile.TemporaryDirectory(prefix="ort-profile-") as scratch:
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.log_severity_level = 3
        options.enable_profiling = True
        options.profile_file_prefix = str(Path(scratch) / "ort")
        session = ort.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])
        feed = {session.get_inputs()[0].name: pixels.detach().cpu().numpy()}
        calls = sample_calls(warm_run_s(lambda: session.run(None, feed), warmup))
        for _ in range(calls * repeats):
            session.run(None, feed)
        events = json.loads(Path(session.end_profiling()).read_text())
    runs: dict[str, list[float]] = {}
    for e in events:
        if e.get("cat") == "Node" and str(e.get("name", "")).endswith("_kernel_time"):
            runs.setdefault(e["name"][: -len("_kernel_time")], []).append(float(e["dur"]) / 1e3)
    return node_medians(runs, calls, repeats)


def _time_ort(path: Path, pixels: torch.Tensor, warmup: int, repeats: int) -> dict[str, float]:
    return time_ort_nodes(path, pixels, warmup, repeats)  # looked up per call, so tests can steady the timings


ORT_FORMS = (
    BackendForm("ort_fp32", "onnxruntime", _build_ort_fp32, _time_ort),
    BackendForm("ort_dynamic", "onnxruntime", _build_ort_dynamic, _time_ort),
)


FUSED_LAYER_PARTS = ("convolution", "normalization")  # HF ResNet's ConvLayer: convolution, normalization, activation


def backend_members(group: Mapping[str, Any]) -> tuple[str, ...]:
    """Return the modules whose backend node time a group owns.

    A backend fuses a layer's operations into one node named after one of them: ONNX Runtime names a ResNet
    Conv+BatchNorm+ReLU after the activation, so a member `...layer.0.convolution` owns its whole conv layer
    (`...layer.0`); a head group owns the attention module (its softmax and matmuls).
    """
    members = list(group["members"])
    if group.get("kind") == "head":
        members.append(group["module"])
    for m in group["members"]:
        parent, _, last = m.rpartition(".")
        if last in FUSED_LAYER_PARTS and parent:
            members.append(parent)
    return tuple(dict.fromkeys(members))


def form_profile(
    node_ms: Mapping[str, float],
    groups: Iterable[Mapping[str, Any]],
    modules: ModuleOf = module_of,
    classes: Sequence[Sequence[str]] = (),
) -> dict[str, Any]:
    """Turn node times into module rows, per-group latency shares and the share no module claims.

    `modules` maps a node name to its module path (the form's `module_path`); `classes` are the model's identical
    layers (`identical.identical_layers`), whose module rows are pooled, so their groups read equal shares.

    Returns:
        {"total_ms", "layers": [{"name", "latency_ms", "latency_share"}], "group_latency_share": {group: share},
        "unmapped_share", "top_nodes": the 10 slowest nodes}.
    """
    total = sum(node_ms.values()) or 1.0
    rows: dict[str, float] = {}
    for node, ms in node_ms.items():
        module = modules(node)
        rows[module] = rows.get(module, 0.0) + ms
    rows = pooled_rows(rows, classes)
    layers = [
        {"name": name, "params": 0, "macs": 0, "latency_ms": ms, "latency_share": ms / total}
        for name, ms in sorted(rows.items(), key=lambda kv: -kv[1])
        if name
    ]
    owned = [{**g, "members": backend_members(g)} for g in groups]
    costs = group_costs({"totals": {"params": 0, "macs": 0}, "layers": layers}, owned)
    top = sorted(node_ms.items(), key=lambda kv: -kv[1])[:10]
    return {
        "total_ms": round(sum(node_ms.values()), 4),
        "layers": layers,
        "group_latency_share": {name: round(c["latency_share"], 5) for name, c in costs.items()},
        "unmapped_share": round(rows.get("", 0.0) / total, 5),
        "top_nodes": [{"node": n, "ms": round(ms, 4)} for n, ms in top],
    }


def profile_backends(
    model: nn.Module,
    example: torch.Tensor,
    groups: list[Mapping[str, Any]],
    forms: Iterable[BackendForm] = ORT_FORMS,
    *,
    folder: Path | None = None,
    warmup: int = 2,
    repeats: int = 5,
    built: dict[str, Path] | None = None,
) -> dict[str, Any]:
    """Build and profile each form of the FP32 model; a form that fails is recorded with its reason.

    Args:
        model: The FP32 baseline.
        example: A batch-1 pixel tensor (the batch the planners' torch profile times).
        groups: The profile's prunable groups (dicts with name, kind, module, members).
        forms: The backend forms to profile.
        folder: Where the built files go (a scratch folder when None).
        warmup: Untimed runs per form.
        repeats: Timed runs per form (per node: the median).
        built: Filled with each built form's file (useful only with a `folder` that outlives the call).

    Returns:
        {"forms": {name: form_profile(...) + backend, seconds | error}, "identical_layers": the classes of
        identical layers whose rows were pooled}.
    """
    out: dict[str, Any] = {"forms": {}, "identical_layers": identical_layers(model)}
    with tempfile.TemporaryDirectory(prefix="backend-profile-") as scratch, shared_exports():
        base = folder or Path(scratch)
        for form in forms:
            started = time.process_time()
            try:
                path = form.build(model, example, base / form.name)
                if built is not None:
                    built[form.name] = path
                node_ms = form.time_nodes(path, example, warmup, repeats)
                pooled = form_profile(node_ms, groups, form.module_path, out["identical_layers"])
                row = {"backend": form.backend, **pooled}
            except Exception as exc:  # noqa: BLE001 - a form that cannot be built or run is reported, not fatal
                log.warning("backend profile of %s failed: %s", form.name, exc)
                row = {"backend": form.backend, "error": f"{type(exc).__name__}: {str(exc)[:200]}"}
            row["cpu_seconds"] = round(time.process_time() - started, 2)
            out["forms"][form.name] = row
    return out


# Forms whose profiled totals are within PLAN_TIE of the fastest are tied for planning; the tie goes to the first in
# TIE_ORDER (int8 forms, then FP32 runtimes, then torch), so the plan does not flip with the profile's noise: the
# zoo ResNet's ort_fp32 and ort_dynamic profile 0.10 and 0.09 ms, and round 1's plan changed with the one read
PLAN_TIE = 0.1
TIE_ORDER = ("ov_int8", "ort_dynamic", "ort_static", "ov_bf16", "ov_fp32", "ort_fp32", "torch")


def planned_form(backend_profile: Mapping[str, Any] | None, backend: str, torch_ms: float) -> str:
    """Name the form the planners should read: the fastest profiled form the `--backend` choice can deliver.

    `torch` (or no backend profile) plans on the torch profile; `onnxruntime` on the fastest ONNX Runtime form;
    `auto` on the fastest of those and torch eager (`torch_ms`, the torch profile's batch-1 total). Forms within
    `PLAN_TIE` of the fastest are tied, and the tie goes to the first in `TIE_ORDER`.
    """
    if backend == "torch" or not backend_profile:
        return "torch"
    forms = {
        name: row["total_ms"]
        for name, row in backend_profile.get("forms", {}).items()
        if "error" not in row and (backend in ("auto", row.get("backend")))
    }
    if backend == "auto":
        forms["torch"] = torch_ms
    if not forms:
        return "torch"
    fastest = min(forms.values())
    tied = [name for name, ms in forms.items() if ms <= fastest * (1 + PLAN_TIE)]
    return min(tied, key=lambda n: (TIE_ORDER.index(n) if n in TIE_ORDER else len(TIE_ORDER), forms[n], n))


def monotone_savings(times: Sequence[float], base: float) -> list[float]:
    """Return the share of `base` saved at each ratio, never negative and never smaller than at a lower ratio.

    Pruning more units of a group does not make it slower; a measured table that says so (timer noise on a
    small model or a busy machine) would make the planner aim at a negative reduction, so the savings are the
    running maximum of the measured ones, floored at zero.
    """
    out, best = [], 0.0
    for t in times:
        best = max(best, (times[0] - t) / base)
        out.append(best)
    return out


def planning_costs(profile: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Return the profile's group costs with the latency the planners read.

    From the run's stored planning record (`planning_latency`, measured once by the profile step): `latency_share`
    is the planned form's snapped share, `torch_latency_share` the torch profile's, and `latency_curve` the form's
    snapped savings per ratio. A profile.json written before that record existed: the planned form's profiled
    shares and its latency table, as they were.
    """
    record = profile.get("planning_latency")
    if record:
        return _recorded_costs(profile["group_costs"], record)
    costs = {name: dict(c) for name, c in profile["group_costs"].items()}
    backend = profile.get("backend_profile") or {}
    form = backend.get("planned_on", "torch")
    shares = backend.get("forms", {}).get(form, {}).get("group_latency_share")
    if form == "torch" or not shares:
        return costs
    table = backend.get("latency_table")
    for name, c in costs.items():
        c["torch_latency_share"] = c.get("latency_share", 0.0)
        c["latency_share"] = float(shares.get(name, 0.0))
        if table and table.get("form") == form and name in table["groups"]:
            times, base = table["groups"][name], float(table["total_ms"][0]) or 1.0
            c["latency_curve"] = {"ratios": table["ratios"], "saved_share": monotone_savings(times, base)}
    return costs


def _recorded_costs(group_costs: Mapping[str, Any], record: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    costs = {name: dict(c) for name, c in group_costs.items()}
    for name, c in costs.items():
        if record["form"] != "torch":  # the torch profile's share beside the delivered form's
            c["torch_latency_share"] = float(record["torch_shares"].get(name, 0.0))
        c["latency_share"] = float(record["shares"].get(name, 0.0))
        if name in record.get("curves", {}):
            c["latency_curve"] = dict(record["curves"][name])
    return costs
