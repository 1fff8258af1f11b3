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
    return {"profile": summary, "history": event("profile", message)}
