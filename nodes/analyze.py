"""Analysis agent (and, from round 2, the iterative pruning agent): profile + feedback -> CompressionPlan."""

from __future__ import annotations

from typing import Any

from langgraph.runtime import Runtime

from profiling_agent.nodes.common import (
    absolute,
    allowed_ids,
    context_of,
    event,
    iteration_dir,
    load_artifact_model,
    prepared,
    run_dir,
    training_source,
)
from profiling_agent.state import Context, State


def plan_evaluator(state: State, ctx: Context, max_calls: int | None = None, refits: Any = None, distill: Any = None):
    """Build evaluate_plan: a plan on a fresh baseline copy, reconstructed when recovery is on, on calibration images.

    The reconstruction fits the baseline's activations on those images, never their labels; `refits` (a
    `refit_cache.TrialRefits`) keeps the refitted weights of the last trials for the recover step. With `distill`
    ((training batches, steps, learning rate): `block_evaluator`) each trial is then distilled that many steps and
    also scored by its KL divergence from the baseline.
    """
    from profiling_agent.tools.planning.llm_tools import make_plan_evaluator

    tensors = prepared(state)

    def load_baseline():
        return load_artifact_model(state, state.baseline).model

    recover = on_trial = None
    if ctx.recover != "none":  # trials see what the recover step will at least do: the least-squares refit
        from profiling_agent.tools.recovery import refit_cache
        from profiling_agent.tools.recovery.distill import DistillConfig
        from profiling_agent.tools.recovery.distill import distill as distill_model
        from profiling_agent.tools.recovery.reconstruct import reconstruct

        last: dict[str, Any] = {}
        calib, seed = tensors["calib_pixels"], state.dataset.seed

        def recover(model, applied) -> None:
            teacher = load_baseline()
            last["info"] = reconstruct(teacher, model, calib, applied, seed=seed)
            if distill is not None:
                batches, steps, lr = distill
                distill_model(model, teacher, batches, DistillConfig(steps=steps, lr=lr, seed=seed))
                model.eval()

        def on_trial(plan, model, applied) -> None:
            if refits is not None and state.baseline is not None:
                key = refit_cache.refit_key(applied, calib, seed, state.baseline.sha256)
                refits.remember(plan.get("pruning") or [], key, model, last.pop("info", {}))

    return make_plan_evaluator(
        load_baseline,
        tensors["calib_pixels"],
        tensors["calib_labels"],
        allowed_ids=allowed_ids(state),
        importance=ctx.importance,
        seed=state.dataset.seed,
        recover=recover,
        on_trial=on_trial,
        with_kl=distill is not None,
        **({"max_calls": max_calls} if max_calls else {}),
    )


def block_evaluator(state: State, ctx: Context, calls: int):
    """Build the evaluator of round 1's block-set trials (refit, then TRIAL_STEPS distillation steps), or None.

    None where recovery does not distil, the dataset has no training images, or the baseline has LARGE_MODEL
    parameters or more (a distillation step costs seconds there: `recovery/policy.py`).
    """
    from profiling_agent.tools.data.train_stream import TrainBatches
    from profiling_agent.tools.models.artifact_load import load_processor
    from profiling_agent.tools.planning.block_trials import TRIAL_STEPS
    from profiling_agent.tools.recovery.policy import LARGE_MODEL, auto_recipe

    if ctx.recover not in ("auto", "distill") or state.baseline is None or state.labels is None:
        return None
    if state.baseline.params >= LARGE_MODEL or state.input_shape is None:
        return None
    source = training_source(state)
    if source is None:
        return None
    lr, batch = auto_recipe(ctx.recover_lr, ctx.recover_batch, state.baseline.params, removed_blocks=1)
    processor = load_processor(absolute(state, state.baseline.path))  # the images' preprocessing, not the weights
    batches = TrainBatches(source, processor, state.input_shape.model_dump(), state.labels.model_dump(),
                           batch=batch, seed=state.dataset.seed, augmentation=ctx.recover_augment)  # fmt: skip
    steps = min(TRIAL_STEPS, ctx.recover_steps) if ctx.recover_steps else TRIAL_STEPS  # never past the run's own
    return plan_evaluator(state, ctx, max_calls=calls, distill=(batches, steps, lr))


def baseline_round(state: State, iteration: int) -> dict[str, Any]:
    """Plan a uniform l1/l2/random baseline: no sensitivity probe; the plan never changes, so one round is enough."""
    from profiling_agent.tools.compression.baselines import as_baseline, check_ratio, uniform_plan
    from profiling_agent.tools.io import read_json, write_json_atomic

    planner = as_baseline(state.objective.planner)
    ratio = check_ratio(state.objective.ratio, planner)
    if state.candidates:  # the same plan again would give the same candidate
        stop = f"uniform {planner} baseline at ratio {ratio:g}: stopped after 1 iteration (its plan never changes)"
        return {"stop_reason": stop, "history": event("analyze", f"stopping: {stop}", state.iteration)}
    groups = read_json(run_dir(state) / "profile.json")["groups"]
    plan = uniform_plan(groups, ratio, planner, state.objective.quantize)
    plan_dict = plan.model_dump()
    write_json_atomic(
        iteration_dir(state, iteration) / "plan.json", {"iteration": iteration, "planner": planner, "plan": plan_dict}
    )
    message = f"{planner} baseline plan: every prunable group at ratio {ratio:g}, {len(plan.quantization)} quantization"
    return {
        "iteration": iteration,
        "plan": plan_dict,
        "planner_used": planner,
        "current": {"iteration": iteration, "planner_meta": {"baseline": planner, "ratio": ratio}},
        "history": event("analyze", message + " entries", iteration, rationale=plan.rationale),
    }


def analyze(state: State, runtime: Runtime[Context]) -> dict[str, Any]:
    """Plan this iteration: probe sensitivity once, then ask the planner for a plan from profile and feedback."""
    from profiling_agent.tools.compression.baselines import is_baseline
    from profiling_agent.tools.io import read_json, write_json_atomic
    from profiling_agent.tools.planning.llm_client import planner_mode
    from profiling_agent.tools.planning.round import planning_round
    from profiling_agent.tools.recovery.refit_cache import TrialRefits, discard

    ctx = context_of(runtime)
    iteration = state.iteration + 1
    if is_baseline(state.objective.planner):
        return baseline_round(state, iteration)
    choice = planner_mode(state.objective.planner, ctx)  # --planner llm without an LLM: ValueError naming the setting
    full_profile = read_json(run_dir(state) / "profile.json")
    refits = TrialRefits()
    out = planning_round(
        state,
        ctx,
        full_profile,
        choice.mode,
        lambda calls: plan_evaluator(state, ctx, max_calls=calls, refits=refits),
        lambda calls: block_evaluator(state, ctx, calls),
    )
    # the chosen plan's trial refit, for the recover step (which checks its key); none: an older one goes
    if out.stop_reason or not refits.save(out.plan.pruning, iteration_dir(state, iteration)):
        discard(iteration_dir(state, iteration))
    plan_dict = out.plan.model_dump()
    write_json_atomic(
        iteration_dir(state, iteration) / "plan.json",
        {"iteration": iteration, "planner": out.planner, "plan": plan_dict},
    )
    update: dict[str, Any] = {
        "iteration": iteration,
        "plan": plan_dict,
        "planner_used": out.planner,
        "current": {"iteration": iteration, "planner_meta": out.meta.model_dump()},
        "fallbacks": [f.model_copy(update={"iteration": iteration}).model_dump() for f in out.fallbacks],
    }
    if out.stop_reason:
        update["stop_reason"] = out.stop_reason
    update["history"] = event(
        "analyze", out.message, iteration, rationale=out.plan.rationale, planner_choice=choice, llm=out.llm
    )
    return update
