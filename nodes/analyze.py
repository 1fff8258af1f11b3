"""Analysis agent (and, from round 2, the iterative pruning agent): profile + feedback -> CompressionPlan."""

from __future__ import annotations

from typing import Any

from langgraph.runtime import Runtime

from profiling_agent.nodes.common import context_of, event, run_dir
from profiling_agent.state import Context, State
from profiling_agent.tools import run_layout
from profiling_agent.tools.planning.llm_conversation import conversation as llm_conversation
from profiling_agent.tools.planning.plan_step import plan_next
from profiling_agent.tools.planning.round_inputs import RoundInputs
from profiling_agent.tools.planning.trials import RecipeSettings, TrialSetup


def round_inputs(state: State, iteration: int) -> RoundInputs:
    """Return what planning round `iteration` reads from the run (the planners never see the whole state)."""
    return RoundInputs(
        objective=state.objective,
        iteration=iteration,
        candidates=list(state.candidates),
        baseline_eval=state.baseline_eval,
        sensitivity=dict(state.sensitivity or {}),
        fallbacks=list(state.fallbacks),
        run_path=state.run_path,
        model_ref=state.model.ref,
        family=state.family,
        token_axis=state.token_axis,
    )


def trial_setup(state: State, ctx: Context) -> TrialSetup:
    """Return what the round's calibration trials need: the baseline, the images, the pruning and recovery settings."""
    recipe = RecipeSettings(ctx.recover_lr, ctx.recover_batch, ctx.recover_steps, ctx.recover_augment)
    return TrialSetup(
        run_path=run_dir(state),
        baseline=state.baseline,
        data=state.data,
        dataset=state.dataset,
        labels=state.labels,
        input_shape=state.input_shape,
        importance=ctx.importance,
        recover=ctx.recover,
        recipe=recipe,
    )


def analyze(state: State, runtime: Runtime[Context]) -> dict[str, Any]:
    """Plan this iteration: probe sensitivity once, then ask the planner for a plan from profile and feedback.

    With an LLM planner the round's LLM turn is the `llm_conversation` subgraph (model, tools, guard), invoked
    here with this node's config, so it checkpoints under the run's thread and Studio shows its steps.
    """
    ctx = context_of(runtime)
    inputs = round_inputs(state, state.iteration + 1)
    iteration = inputs.iteration
    # an LLM turn runs the conversation subgraph inside this node: its model and tool calls are steps of this run
    out = plan_next(
        inputs, trial_setup(state, ctx), ctx, run_layout.iteration_dir(run_dir(state), iteration), llm_conversation
    )
    baseline = out.meta.baseline is not None  # a uniform baseline: one round, its meta the baseline and ratio
    if baseline and out.stop_reason:
        return {"stop_reason": out.stop_reason, "history": event("analyze", out.message, state.iteration)}
    update: dict[str, Any] = {
        "iteration": iteration,
        "plan": out.plan.model_dump(),
        "planner_used": out.planner,
        "current": {
            "iteration": iteration,
            "planner_meta": out.meta.model_dump(exclude_unset=baseline),
        },
    }
    if not baseline:
        update["fallbacks"] = [f.model_copy(update={"iteration": iteration}).model_dump() for f in out.fallbacks]
    if out.measured is not None:  # a paired round repeating a measured plan: that candidate, recorded as this one
        update["current"] = out.measured
    if out.stop_reason:
        update["stop_reason"] = out.stop_reason
    update["history"] = event(
        "analyze", out.message, iteration, rationale=out.plan.rationale, planner_choice=out.choice, llm=out.llm
    )
    return update
