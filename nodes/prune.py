"""Pruning agent: apply the plan's pruning entries to a fresh copy of the baseline and self-check it."""

from __future__ import annotations

from typing import Any

from langgraph.runtime import Runtime

from profiling_agent.nodes.common import (
    artifact_ref,
    context_of,
    emit,
    event,
    example_input,
    iteration_dir,
    load_artifact_model,
)
from profiling_agent.state import Context, State


def prune(state: State, runtime: Runtime[Context]) -> dict[str, Any]:
    """Prune, check the pruned model with a forward pass, and save it; a failure marks the candidate failed."""
    from profiling_agent.tools.compression.baselines import is_baseline
    from profiling_agent.tools.compression.pruning import prune_model
    from profiling_agent.tools.compression.self_check import self_check
    from profiling_agent.tools.models.artifacts import save_artifact
    from profiling_agent.tools.profiling.static import static_profile

    ctx = context_of(runtime)
    it = state.iteration
    current = dict(state.current or {"iteration": it})
    emit(runtime, kind="progress", task=f"iteration {it}: pruning", done=0, total=1, label="")
    loaded = load_artifact_model(state, state.baseline)
    model = loaded.model
    example = example_input(state)
    # a uniform baseline (l1/l2/random) is defined by its importance; the other planners use the context's
    importance = state.objective.planner if is_baseline(state.objective.planner) else ctx.importance
    try:
        report = prune_model(
            model, state.plan.get("pruning", []), example, importance=importance, seed=state.dataset.seed
        )
        self_check(model, example, int(model.config.num_labels))
    except Exception as exc:  # a plan the engine cannot apply is a failed candidate, not a failed run
        reason = f"{type(exc).__name__}: {exc}".splitlines()[0][:500]
        current.update({"status": "failed", "error": f"pruning failed: {reason}"})
        return {"current": current, "history": event("prune", f"candidate failed: {reason}", it)}
    shape = (state.input_shape["channels"], state.input_shape["height"], state.input_shape["width"])
    macs = int(static_profile(model, shape)["total_macs"])
    saved = save_artifact(
        model,
        iteration_dir(state, it) / "pruned",
        processor=loaded.processor,
        attrs=report.attrs,
        extra={"role": "pruned", "iteration": it, "applied": report.applied, "macs": macs},
    )
    applied = [{k: v for k, v in a.items() if k != "removed"} for a in report.applied]
    current.update(
        {
            "status": "ok",
            "applied": applied,
            "pruned": artifact_ref(state, saved),
            "macs": macs,
            "params_before": report.params_before,
            "params_after": report.params_after,
        }
    )
    emit(runtime, kind="progress", task=f"iteration {it}: pruning", done=1, total=1, label="")
    removed = report.params_before - report.params_after
    message = (
        f"pruned {sum(a['units_before'] != a['units_after'] for a in applied)} groups: "
        f"{removed:,} params removed ({removed / max(report.params_before, 1):.1%}); self-check passed"
    )
    return {"current": current, "history": event("prune", message, it)}
