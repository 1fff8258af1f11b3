"""Profiler agent: static (MACs, params) and dynamic (operators, per-module latency) profile of the baseline."""

from __future__ import annotations

import dataclasses
from typing import Any

from langgraph.runtime import Runtime

from profiling_agent.nodes.common import context_of, emit, event, input_chw, load_artifact_model, run_dir
from profiling_agent.state import Context, State


def profile(state: State, runtime: Runtime[Context]) -> dict[str, Any]:
    """Profile the baseline, write profile.json and keep a compact summary in the state."""
    from profiling_agent.tools.compression.families import adapter_for
    from profiling_agent.tools.device import resolve_device, set_threads
    from profiling_agent.tools.io import write_json_atomic
    from profiling_agent.tools.profiling.dynamic import profile_model
    from profiling_agent.tools.profiling.summary import group_costs, summarize_profile

    ctx = context_of(runtime)
    set_threads(ctx.threads)
    device = resolve_device(ctx.device)
    loaded = load_artifact_model(state, state.baseline)
    shape = input_chw(state)
    emit(runtime, kind="progress", task="profiling", done=0, total=1, label="baseline")
    full = profile_model(loaded.model.to(device), shape, device=str(device))
    adapter = adapter_for(loaded.model)
    groups = [dataclasses.asdict(g) for g in adapter.prunable_groups(loaded.model)]
    # a head group also saves its attention matmuls, which the profiler books on the attention module
    costs = group_costs(
        full, [{**g, "members": (*g["members"], g["module"])} if g["kind"] == "head" else g for g in groups]
    )
    full["groups"] = groups
    full["group_costs"] = costs
    full["protected"] = adapter.protected_modules(loaded.model)
    write_json_atomic(run_dir(state) / "profile.json", full)
    summary = summarize_profile(full, groups)
    summary["path"] = "profile.json"
    emit(runtime, kind="progress", task="profiling", done=1, total=1, label="baseline")
    totals = full.get("totals", {})
    message = (
        f"{totals.get('params', 0):,} params, {totals.get('macs', 0):,} MACs, "
        f"{totals.get('latency_ms', 0):.2f} ms batch-1 on {device}; {len(groups)} prunable groups"
    )
    return {"profile": summary, "history": event("profile", message)}
