"""Pruning agent: apply the plan's pruning entries (then its token merging) to a fresh baseline copy; self-check it."""

from __future__ import annotations

from typing import Any

from langgraph.runtime import Runtime

from profiling_agent.nodes.common import (
    artifact_ref,
    context_of,
    current_candidate,
    emit,
    event,
    example_input,
    input_chw,
    load_artifact_model,
    run_dir,
)
from profiling_agent.state import ArtifactRef, CompressionPlan, Context, State
from profiling_agent.tools import run_layout


def prune(state: State, runtime: Runtime[Context]) -> dict[str, Any]:
    """Prune, check the pruned model with a forward pass, and save it; a failure marks the candidate failed."""
    from profiling_agent.tools.compression.baselines import is_baseline  # lazy: torch_pruning; steps load without it
    from profiling_agent.tools.compression.pruning import prune_model  # lazy: torch_pruning; steps load without it
    from profiling_agent.tools.compression.self_check import self_check  # lazy: torch; steps load without it
    from profiling_agent.tools.compression.token_merge import (
        layer_count,
        merge_planned,
    )  # lazy: torch; steps load without it
    from profiling_agent.tools.compression.units import as_importance  # lazy: torch; steps load without it
    from profiling_agent.tools.models.artifacts import save_artifact  # lazy: torch; steps load without it
    from profiling_agent.tools.profiling.static import static_profile  # lazy: torch; steps load without it

    ctx = context_of(runtime)
    it = state.iteration
    current = current_candidate(state)
    plan = state.plan or CompressionPlan()
    emit(runtime, kind="progress", task=f"iteration {it}: pruning", done=0, total=1, label="")
    loaded = load_artifact_model(state, state.baseline)
    model = loaded.model
    example = example_input(state)
    # a uniform baseline (l1/l2/random) is defined by its importance; the other planners use the context's
    chosen = state.objective.planner if is_baseline(state.objective.planner) else ctx.importance
    try:
        importance = as_importance(chosen)
        layers = layer_count(model)  # a token schedule names the unpruned layers; a removed block drops its r
        report = prune_model(model, plan.pruning, example, importance=importance, seed=state.dataset.seed)
        schedule = merge_planned(model, plan.tokens, layers)  # prune first, then merge (the engine traced it unmerged)
        self_check(model, example, int(model.config.num_labels))
    except Exception as exc:  # a plan the engine cannot apply is a failed candidate, not a failed run
        reason = f"{type(exc).__name__}: {exc}".splitlines()[0][:500]
        current.status, current.error = "failed", f"pruning failed: {reason}"
        return {"current": current.model_dump(), "history": event("prune", f"candidate failed: {reason}", it)}
    counted = static_profile(model, input_chw(state))["total_macs"]
    macs = None if counted is None else int(counted)  # None: MACs unknown (the counter cannot count this model)
    saved = save_artifact(
        model,
        run_layout.iteration_dir(run_dir(state), it) / run_layout.PRUNED,
        processor=loaded.processor,
        attrs=report.attrs,
        extra={"role": "pruned", "iteration": it, "applied": [a.model_dump() for a in report.applied], "macs": macs},
    )  # a merging model's recipe records its token_schedule: every later load installs it again
    applied = [a.applied() for a in report.applied]
    current.status, current.applied, current.macs = "ok", applied, macs
    current.token_schedule = schedule
    current.pruned = ArtifactRef.model_validate(artifact_ref(state, saved))
    current.params_before, current.params_after = report.params_before, report.params_after
    emit(runtime, kind="progress", task=f"iteration {it}: pruning", done=1, total=1, label="")
    message = prune_message(report.params_before, report.params_after, applied, schedule)
    return {"current": current.model_dump(), "history": event("prune", message, it)}


def prune_message(before: int, after: int, applied: list[Any], schedule: list[int] | None) -> str:
    """Say in one line what pruning (and token merging) did."""
    removed = before - after
    message = (
        f"pruned {sum(a.units_before != a.units_after for a in applied)} groups: "
        f"{removed:,} params removed ({removed / max(before, 1):.1%}); self-check passed"
    )
    return message + (f"; merging {sum(schedule)} tokens (schedule {schedule})" if schedule is not None else "")
