"""Profiler agent: static (MACs, params) and dynamic (operators, per-module latency) profile of the baseline."""

from __future__ import annotations

from typing import Any

from langgraph.runtime import Runtime

from profiling_agent.nodes.common import context_of, emit, event, input_chw, load_artifact_model, run_dir
from profiling_agent.state import Context, State


def profile(state: State, runtime: Runtime[Context]) -> dict[str, Any]:
    """Profile the baseline, write profile.json and keep a compact summary in the state."""
    from profiling_agent.tools.device import resolve_device, set_threads
    from profiling_agent.tools.io import write_json_atomic
    from profiling_agent.tools.profiling.summary import planner_profile, summarize_profile

    ctx = context_of(runtime)
    set_threads(ctx.threads)
    device = resolve_device(ctx.device)
    loaded = load_artifact_model(state, state.baseline)
    shape = input_chw(state)
    emit(runtime, kind="progress", task="profiling", done=0, total=1, label="baseline")
    full = planner_profile(loaded.model.to(device), shape, device=str(device))
    groups = full["groups"]
    if full["totals"].get("macs") is None and state.objective.target == "macs":
        raise ValueError(f"--target macs cannot be judged: this model's MACs cannot be counted ({full.get('error')})")
    backend_note = ""
    if ctx.backend != "torch" and device.type == "cpu":
        full["backend_profile"], backend_note = backend_profile(loaded.model, shape, groups, ctx.backend, full)
        if state.objective.target == "latency":
            backend_note += latency_table(loaded.model, shape, full["backend_profile"])
    write_json_atomic(run_dir(state) / "profile.json", full)
    summary = summarize_profile(full, groups)
    summary["path"] = "profile.json"
    emit(runtime, kind="progress", task="profiling", done=1, total=1, label="baseline")
    totals = full.get("totals", {})
    macs = f"{totals['macs']:,} MACs" if totals.get("macs") is not None else f"MACs unknown ({full.get('error')})"
    message = (
        f"{totals.get('params', 0):,} params, {macs}, "
        f"{totals.get('latency_ms', 0):.2f} ms batch-1 on {device}; {len(groups)} prunable groups"
    )
    return {"profile": summary, "history": event("profile", message + backend_note)}


def latency_table(model, shape, backend: dict[str, Any]) -> str:
    """Measure (or read from the cache) the planned form's per-group latency table into `backend`."""
    import torch

    from profiling_agent.tools.models.embedded_data import cache_dir
    from profiling_agent.tools.profiling.backend_profile import ORT_FORMS
    from profiling_agent.tools.profiling.latency_model import cached_table

    form = next((f for f in ORT_FORMS if f.name == backend.get("planned_on")), None)
    if form is None:
        return ""
    example = torch.randn((1, *shape), generator=torch.Generator().manual_seed(0))
    try:
        backend["latency_table"] = cached_table(model.cpu(), example, form, cache_dir() / "latency")
    except Exception as exc:  # noqa: BLE001 - planning falls back to the profile's shares
        return f"; latency table of {form.name} failed ({type(exc).__name__}: {str(exc)[:120]})"
    return f"; latency table of {form.name} at ratios {backend['latency_table']['ratios']}"


def backend_profile(model, shape, groups, backend: str, full: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """Profile the deliverable backend forms per node and name the one the planners read (tools/profiling)."""
    import torch

    from profiling_agent.tools.profiling.backend_profile import planned_form, profile_backends
    from profiling_agent.tools.runtimes.onnx_model import onnxruntime_missing

    if onnxruntime_missing():
        return {"forms": {}, "planned_on": "torch", "note": "onnxruntime is not installed"}, ""
    example = torch.randn((1, *shape), generator=torch.Generator().manual_seed(0))
    out = profile_backends(model.cpu(), example, groups)
    torch_ms = float(full.get("totals", {}).get("latency_ms", 0.0))
    out["planned_on"] = planned_form(out, backend, torch_ms)
    times = ", ".join(f"{name} {row['total_ms']:.2f} ms" for name, row in out["forms"].items() if "total_ms" in row)
    return out, f"; backend profile: {times}; planners read {out['planned_on']}'s latency shares"
