"""Node `probe_sensitivity`: rate each prunable group's damage once (`tools/profiling/probe_fast.py:probe_groups`).

Each group is pruned alone at the context's probe ratio (a block is removed whole) and the damage is measured on
the first calibration images (`FastProbeConfig.eval_images`); when the run recovers, after the least-squares
refit the recover step will do. For a ViT or DeiT under a latency target, each token-merging rate the profile found
to pay (`planning_latency.tokens`) is also judged on the trial slice: the run's `token_axis`.
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
from profiling_agent.state import Context, State, TokenAxis
from profiling_agent.tools import run_layout
from profiling_agent.tools.io import read_json, write_json_atomic
from profiling_agent.tools.profiling.probe_record import probe_record


def probe(state: State, runtime: Runtime[Context]) -> dict[str, Any]:
    """Probe every prunable group once and keep the result for every planning round (uniform baselines skip it)."""
    from profiling_agent.tools.compression.baselines import is_baseline  # lazy: torch_pruning; steps load without it
    from profiling_agent.tools.compression.families import planning_groups  # lazy: torch; steps load without it
    from profiling_agent.tools.profiling.probe_fast import probe_groups  # lazy: torch; steps load without it
    from profiling_agent.tools.profiling.sensitivity import ProbeRun  # lazy: torch; steps load without it

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
    update: dict[str, Any] = {"sensitivity": sensitivity}
    try:
        axis = token_axis_of(state, loaded.model)
    except Exception as exc:  # noqa: BLE001 - the planners then leave tokens alone; the run goes on
        axis, message = None, f"{message}; token merging's damage could not be measured ({type(exc).__name__}: {exc})"
    if axis is not None:
        update["token_axis"] = axis.model_dump()
        paying = axis.paying()
        message += (
            f"; token merging: {len(paying)} of {len(axis.rates) - 1} rates and schedules pay on {axis.form} at batch "
            f"{axis.batch}" + (f", their damage measured on {axis.images} trial-slice images" if paying else "")
        )
    return {**update, "history": event("probe_sensitivity", message)}


def token_axis_of(state: State, model: Any) -> TokenAxis | None:
    """Return the token axis: the profile's token latency with each paying rate's damage on the trial slice."""
    from profiling_agent.tools.data.trial_slice import open_trial_slice  # lazy: torch; steps load without it
    from profiling_agent.tools.evaluation.baseline_logits import (
        kept_baseline_logits,
    )  # lazy: torch; steps load without it
    from profiling_agent.tools.models.artifact_load import load_processor  # lazy: torch; steps load without it
    from profiling_agent.tools.profiling.token_latency import (  # lazy: torch; steps load without it
        needs_damage,
        token_axis,
    )

    path = run_dir(state) / run_layout.PROFILE
    table = (read_json(path).get("planning_latency") or {}).get("tokens") if path.exists() else None
    if not table or state.data is None or state.baseline is None:
        return None
    pixels, labels = open_trial_slice(
        run_dir(state),
        seed=state.dataset.seed,
        processor=load_processor(run_dir(state) / state.baseline.path),
        data_file=state.data.path,
        image_column=state.data.image_column,
    )
    logits = None
    if any(needs_damage(r) for r in table.get("rates", [])):  # the baseline's logits there, kept for later steps
        logits = kept_baseline_logits(run_dir(state), pixels, state.baseline.sha256, model)
    return token_axis(model, table, pixels, labels, allowed_ids(state), logits)
