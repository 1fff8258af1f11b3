"""Node `probe_sensitivity`: rate each prunable group's damage once (`tools/profiling/probe_fast.py:probe_groups`).

Each group is pruned alone at the context's probe ratio (a block is removed whole) and the damage is measured on
the first calibration images (`FastProbeConfig.eval_images`); when the run recovers, after the least-squares
refit the recover step will do.
"""

from __future__ import annotations

import time
from typing import Any

from langgraph.runtime import Runtime

from profiling_agent.nodes.common import (
    allowed_ids,
    context_of,
    event,
    load_artifact_model,
    prepared,
    progress_callback,
    run_dir,
)
from profiling_agent.state import Context, State
from profiling_agent.tools import run_layout


def probe(state: State, runtime: Runtime[Context]) -> dict[str, Any]:
    """Probe every prunable group once and keep the result for every planning round (uniform baselines skip it)."""
    from profiling_agent.tools.compression.baselines import is_baseline
    from profiling_agent.tools.compression.families import planning_groups
    from profiling_agent.tools.io import write_json_atomic
    from profiling_agent.tools.profiling.probe_fast import probe_groups
    from profiling_agent.tools.profiling.probe_record import probe_record
    from profiling_agent.tools.profiling.sensitivity import ProbeRun

    if state.sensitivity is not None:
        return {"history": event("probe_sensitivity", "already probed")}
    if is_baseline(state.objective.planner):
        message = f"not needed: the uniform {state.objective.planner} baseline ignores sensitivity"
        return {"history": event("probe_sensitivity", message)}
    ctx = context_of(runtime)
    loaded = load_artifact_model(state, state.baseline)
    tensors = prepared(state)
    groups = planning_groups(loaded.model, depth=state.objective.prunes_depth())  # blocks: what removing each costs
    started, wall = time.process_time(), time.perf_counter()
    report = progress_callback(runtime, "sensitivity probe")

    def progress(done: int, total: int, label: str) -> None:
        report(done, total, f"{label} ({time.process_time() - started:.0f} CPU-s, {time.perf_counter() - wall:.0f} s)")

    result = probe_groups(
        loaded.model,
        groups,
        tensors["calib_pixels"],
        tensors["calib_labels"],
        ratio=ctx.probe_ratio,
        recover=ctx.recover != "none",  # damage after the least-squares refit the recover step will do
        run=ProbeRun(allowed_ids=allowed_ids(state), seed=state.dataset.seed, progress=progress),
    )
    write_json_atomic(run_dir(state) / run_layout.SENSITIVITY, result)
    cpu, seconds = time.process_time() - started, time.perf_counter() - wall
    rounded, message = probe_record(result, ctx.probe_ratio, cpu, seconds, refit=ctx.recover != "none")
    sensitivity = {name: row.model_dump(exclude_unset=True) for name, row in rounded.items()}
    return {"sensitivity": sensitivity, "history": event("probe_sensitivity", message)}
