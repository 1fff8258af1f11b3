"""Profiler agent: static (MACs, params) and dynamic (operators, per-module latency) profile of the baseline."""

from __future__ import annotations

from typing import Any

from langgraph.runtime import Runtime

from profiling_agent.nodes.common import context_of, emit, event, input_chw, load_artifact_model, prepared, run_dir
from profiling_agent.state import Context, State
from profiling_agent.tools import run_layout


def profile(state: State, runtime: Runtime[Context]) -> dict[str, Any]:
    """Profile the baseline, write profile.json and keep a compact summary in the state."""
    from profiling_agent.tools.device import resolve_device, set_threads  # lazy: torch; steps load without it
    from profiling_agent.tools.profiling.run_profile import profile_baseline  # lazy: torch; steps load without it

    ctx = context_of(runtime)
    set_threads(ctx.threads)
    device = resolve_device(ctx.device)
    loaded = load_artifact_model(state, state.baseline)
    emit(runtime, kind="progress", task="profiling", done=0, total=1, label="baseline")
    summary, message = profile_baseline(
        loaded.model,
        input_chw(state),
        device,
        ctx.backend,
        state.objective.target,
        run_dir(state) / run_layout.PROFILE,
        depth=state.objective.prunes_depth(),
        int8=(run_dir(state) / run_layout.INT8_REUSE, prepared(state, ("calib",))["calib_pixels"])
        if state.data
        else None,
    )
    emit(runtime, kind="progress", task="profiling", done=1, total=1, label="baseline")
    return {"profile": summary, "history": event("profile", message)}
