"""Sensitivity agent: prune each group alone a little on the calibration images and measure the damage (once)."""

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
from profiling_agent.state import Context, GroupSensitivity, State


def probe_sensitivity(state: State, runtime: Runtime[Context]) -> dict[str, Any]:
    """Probe every prunable group once and keep the result for every planning round (uniform baselines skip it)."""
    from profiling_agent.tools.compression.baselines import is_baseline
    from profiling_agent.tools.compression.families import adapter_for
    from profiling_agent.tools.io import write_json_atomic
    from profiling_agent.tools.profiling.probe_fast import probe_sensitivity_fast as probe

    if state.sensitivity is not None:
        return {"history": event("probe_sensitivity", "already probed")}
    if is_baseline(state.objective.planner):
        message = f"not needed: the uniform {state.objective.planner} baseline ignores sensitivity"
        return {"history": event("probe_sensitivity", message)}
    ctx = context_of(runtime)
    loaded = load_artifact_model(state, state.baseline)
    tensors = prepared(state)
    groups = adapter_for(loaded.model).prunable_groups(loaded.model)
    started, wall = time.process_time(), time.perf_counter()
    report = progress_callback(runtime, "sensitivity probe")

    def progress(done: int, total: int, label: str) -> None:
        report(done, total, f"{label} ({time.process_time() - started:.0f} CPU-s, {time.perf_counter() - wall:.0f} s)")

    result = probe(
        loaded.model,
        groups,
        tensors["calib_pixels"],
        tensors["calib_labels"],
        ratio=ctx.probe_ratio,
        allowed_ids=allowed_ids(state),
        seed=state.dataset.seed,
        progress=progress,
        recover=ctx.recover != "none",  # damage after the least-squares refit the recover step will do
    )
    write_json_atomic(run_dir(state) / "sensitivity.json", result)
    fields = GroupSensitivity.model_fields  # sensitivity.json keeps the probe's extra facts (fast, refit_error)
    rounded = {
        name: {k: (round(v, 5) if isinstance(v, float) else v) for k, v in r.items() if k in fields or k == "error"}
        for name, r in result.items()
    }
    least = min(rounded, key=lambda g: rounded[g]["damage"]) if rounded else "-"
    most = max(rounded, key=lambda g: rounded[g]["damage"]) if rounded else "-"
    cpu, seconds = time.process_time() - started, time.perf_counter() - wall
    fast = sum(1 for r in result.values() if r.get("fast"))
    message = (
        f"{len(rounded)} groups probed at ratio {ctx.probe_ratio:g} in {cpu:.1f} CPU-s ({seconds:.1f} s wall; "
        f"{fast} from their own block onward); least sensitive {least}, most {most}"
    )
    if ctx.recover != "none":
        message += " (after reconstruction)"
    unprunable = {name: r["error"] for name, r in rounded.items() if r.get("error")}
    if unprunable:  # recorded facts: planners leave these groups out
        message += f"; {len(unprunable)} unprunable: " + "; ".join(f"{n} ({why})" for n, why in unprunable.items())
    return {"sensitivity": rounded, "history": event("probe_sensitivity", message)}
