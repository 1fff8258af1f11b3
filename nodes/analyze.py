"""Analysis agent (and, from round 2, the iterative pruning agent): profile + feedback -> CompressionPlan."""

from __future__ import annotations

from typing import Any

from langgraph.runtime import Runtime

from profiling_agent.nodes.common import (
    allowed_ids,
    context_of,
    event,
    iteration_dir,
    load_artifact_model,
    prepared,
    run_dir,
)
from profiling_agent.state import CompressionPlan, Context, State
from profiling_agent.tools.planning.backoff import Backoff
from profiling_agent.tools.planning.llm_client import llm_console_note, llm_replied, never_reached
from profiling_agent.tools.planning.paired import deterministic_sequence, reference_due


def plan_evaluator(state: State, ctx: Context, max_calls: int | None = None):
    """Build evaluate_plan: a plan on a fresh baseline copy, reconstructed when recovery is on, on calibration images.

    The reconstruction fits the baseline's activations on those images, never their labels.
    """
    from profiling_agent.tools.planning.llm_tools import make_plan_evaluator

    tensors = prepared(state)

    def load_baseline():
        return load_artifact_model(state, state.baseline).model

    recover = None
    if ctx.recover != "none":  # trials see what the recover step will at least do: the least-squares refit
        from profiling_agent.tools.recovery.reconstruct import reconstruct

        def recover(model, applied) -> None:
            reconstruct(load_baseline(), model, tensors["calib_pixels"], applied, seed=state.dataset.seed)

    return make_plan_evaluator(
        load_baseline,
        tensors["calib_pixels"],
        tensors["calib_labels"],
        allowed_ids=allowed_ids(state),
        importance=ctx.importance,
        seed=state.dataset.seed,
        recover=recover,
        **({"max_calls": max_calls} if max_calls else {}),
    )


def first_round_backoff(state: State, ctx: Context, goal: float, groups, costs, sensitivity) -> Backoff:
    """Try the first plan on the calibration images and back off its goal until it no longer collapses."""
    from profiling_agent.tools.planning.backoff import BACKOFF_TRIALS, back_off, drop_cap
    from profiling_agent.tools.planning.deterministic import plan_round

    evaluate = plan_evaluator(state, ctx, max_calls=BACKOFF_TRIALS + 1)
    return back_off(
        goal,
        lambda g: plan_round(groups, costs, sensitivity, state.objective, [], goal=g).plan,
        lambda plan: evaluate(plan.model_dump()),
        drop_cap(state.objective.max_acc_drop),
    )


def search_round(state: State, ctx: Context, history, groups, costs, sensitivity):
    """Round k+1: bisect inside the measured interval on calibration trials corrected by validation (tool policy)."""
    from profiling_agent.tools.planning.deterministic import plan_round
    from profiling_agent.tools.planning.search import SEARCH_TRIALS, search_step

    evaluate = plan_evaluator(state, ctx, max_calls=SEARCH_TRIALS + 1)
    step = search_step(
        history,
        state.objective.max_acc_drop,
        lambda g: plan_round(groups, costs, sensitivity, state.objective, history, goal=g, reason="trial").plan,
        lambda plan: evaluate(plan.model_dump()),
    )
    return step, evaluate


def predicted_loss(trials: list[dict[str, Any]], goal: float, key: str) -> float | None:
    """Return the calibration loss a trial measured at `goal` (rounded as the trials record it), or None."""
    for t in trials:
        if abs(t["goal"] - round(goal, 4)) < 1e-9:
            return float(t[key])
    return None


def earlier_backoff(state: State) -> Backoff | None:
    """Return round 1's back-off when an earlier candidate already ran it (a paired run's reference turn)."""
    for cand in state.candidates:
        found = cand.planner_meta.backoff
        if found:
            return Backoff(goal=float(found["kept_goal"]), cap=float(found["cap_pp"]), trials=list(found["trials"]))
    return None


def baseline_round(state: State, iteration: int) -> dict[str, Any]:
    """Plan a uniform l1/l2/random baseline: no sensitivity probe; the plan never changes, so one round is enough."""
    from profiling_agent.tools.compression.baselines import uniform_plan
    from profiling_agent.tools.io import read_json, write_json_atomic

    planner, ratio = state.objective.planner, state.objective.ratio
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
    from profiling_agent.tools.planning.deterministic import estimate_key, plan_round, planner_history
    from profiling_agent.tools.planning.llm_client import planner_mode
    from profiling_agent.tools.profiling.backend_profile import planning_costs

    ctx = context_of(runtime)
    iteration = state.iteration + 1
    if is_baseline(state.objective.planner):
        return baseline_round(state, iteration)
    requested = state.objective.planner
    mode, mode_note = planner_mode(requested, ctx)  # --planner llm without an LLM: ValueError naming the setting
    update: dict[str, Any] = {"iteration": iteration, "current": None}
    sensitivity = {name: s.model_dump() for name, s in (state.sensitivity or {}).items()}
    full_profile = read_json(run_dir(state) / "profile.json")
    # with an LLM the deterministic planner follows its own sequence (tools/planning/paired.py)
    own = deterministic_sequence(state.candidates) if mode == "llm" else list(state.candidates)
    history = planner_history(own, state.baseline_eval, state.objective)
    groups, costs = full_profile["groups"], planning_costs(full_profile)  # latency shares of the delivered form
    groups = [g for g in groups if not (sensitivity.get(g["name"]) or {}).get("error")]  # the probe could not prune
    result = plan_round(groups, costs, sensitivity, state.objective, history)
    backoff, search, predicted = None, None, None
    if not history and result.plan.pruning and not result.converged:  # round 1: never apply a collapsing plan
        backoff = earlier_backoff(state) or first_round_backoff(
            state, ctx, result.target_estimate, groups, costs, sensitivity
        )
        if backoff.backed_off:
            result = plan_round(groups, costs, sensitivity, state.objective, history, goal=backoff.goal)
        predicted = predicted_loss(backoff.trials, backoff.goal, "calib_drop_pp")
    elif history and result.plan.pruning and not result.converged:  # later rounds: search what was measured
        search, evaluate = search_round(state, ctx, history, groups, costs, sensitivity)
        if search is not None:
            result = plan_round(
                groups, costs, sensitivity, state.objective, history, goal=search.goal, reason=search.why
            )
            predicted = predicted_loss(search.trials, search.goal, "predicted_pp")
            if predicted is None:  # the chosen goal was not one of the trials: measure the plan itself
                predicted = float(evaluate(result.plan.model_dump())["accuracy_drop_pp"])
    plan: CompressionPlan = result.plan
    planner_used = result.planner
    fallbacks: list[dict[str, Any]] = []
    llm_info: dict[str, Any] | None = None
    turn = None if mode != "llm" else "reference" if reference_due(state.candidates) else "llm"
    if turn == "llm" and result.converged:  # the deterministic sequence is over: the run stops, nothing to pair
        turn = "reference"
    if turn == "llm":
        from profiling_agent.tools.planning.llm_planner import plan_with_llm

        this_round = state.model_copy(update={"iteration": iteration})
        outcome = plan_with_llm(
            this_round, ctx, full_profile, sensitivity, fallback=result, evaluate_fn=plan_evaluator(state, ctx)
        )
        plan, planner_used, fallbacks = outcome.plan, outcome.planner, outcome.fallbacks
        llm_info = outcome.summary(ctx.llm_model)
        if requested == "llm" and planner_used != "llm" and not outcome.usage["calls"] and not llm_replied(state):
            raise never_reached(fallbacks[0] if fallbacks else {}, ctx)  # explicit llm, endpoint never answered
    plan_dict = plan.model_dump()
    write_json_atomic(
        iteration_dir(state, iteration) / "plan.json",
        {"iteration": iteration, "planner": planner_used, "plan": plan_dict},
    )
    goal = result.target_estimate
    if planner_used == "llm":  # feedback for later deterministic rounds: what the applied plan aimed at
        goal = float(outcome.estimate.get(estimate_key(state.objective.target), goal) or goal)
    meta: dict[str, Any] = {"goal": goal, "gamma": result.gamma, "converged": result.converged}
    if planner_used == "deterministic" and predicted is not None:
        meta["predicted_drop"] = round(predicted, 3)
    if search is not None:
        meta["search"] = search.to_dict()
    if backoff is not None:
        meta["backoff"] = {"cap_pp": backoff.cap, "kept_goal": backoff.goal, "trials": backoff.trials}
    if llm_info:
        meta["llm"] = llm_info
    if turn:
        meta["turn"] = turn
    if planner_used == "llm" and outcome.vs_proposal is not None:
        meta["vs_proposal"] = outcome.vs_proposal.model_dump()
    update.update(
        {
            "plan": plan_dict,
            "planner_used": planner_used,
            "current": {"iteration": iteration, "planner_meta": meta},
            "fallbacks": [{**f, "iteration": iteration} for f in fallbacks],
        }
    )
    if result.converged and (planner_used == "deterministic" or turn):
        update["stop_reason"] = f"planner converged before iteration {iteration}: {result.notes[0]}"
    message = f"{planner_used} plan: {len(plan.pruning)} pruning and {len(plan.quantization)} quantization entries"
    if turn == "reference":
        message = f"reference round: the deterministic planner's own next plan, measured beside the LLM's; {message}"
    elif planner_used == "llm" and outcome.vs_proposal is not None:
        message += f" ({outcome.vs_proposal.label()} vs the deterministic proposal)"
    if backoff is not None and backoff.backed_off:
        first = backoff.trials[0]
        message += (
            f"; backed off from a {first['goal']:.1%} goal (its trial lost {first['calib_drop_pp']:.1f} pp on the "
            f"calibration images) to {backoff.goal:.1%} (cap {backoff.cap:g} pp)"
        )
    if search is not None:
        message += f"; {search.why}"
    for f in fallbacks:
        message = f"LLM plan refused ({f['stage']}: {f['reason'][:160]}); {message}"
    if llm_info:
        message += " " + llm_console_note(llm_info)
    update["history"] = event(
        "analyze",
        message,
        iteration,
        rationale=plan.rationale,
        planner={"requested": requested, "mode": mode, "note": mode_note},
        llm=llm_info,
    )
    return update
