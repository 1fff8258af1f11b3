"""One planning round: the deterministic plan (backed off or searched), the LLM's turn, and what it records."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from profiling_agent.state import CompressionPlan, Context, Fallback, LLMStep, PlannerMeta, State
from profiling_agent.tools.planning.backoff import Backoff
from profiling_agent.tools.planning.llm_client import llm_console_note, llm_replied, never_reached
from profiling_agent.tools.planning.paired import deterministic_sequence, reference_due

# builds evaluate_plan (a plan tried on a fresh baseline copy on the calibration images), at most `max_calls` times
Evaluator = Callable[[int | None], Callable[[dict[str, Any]], dict[str, Any]]]
# builds the block-set trials' evaluator (refit, then a short distillation), or None where it cannot run
BlockEvaluator = Callable[[int], Callable[[dict[str, Any]], dict[str, Any]] | None]


@dataclass
class RoundOutcome:
    """What one planning round decided: the plan, who planned it, and the facts the candidate records."""

    plan: CompressionPlan
    planner: str
    meta: PlannerMeta
    message: str
    fallbacks: list[Fallback] = field(default_factory=list)
    llm: LLMStep | None = None
    stop_reason: str = ""


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


def deterministic_plan(state: State, groups, costs, sensitivity, history, evaluator: Evaluator, distills=False,
                       blocks_evaluator: BlockEvaluator | None = None):  # fmt: skip
    """Plan deterministically: round 1 backs off a collapsing goal, later rounds search what was measured.

    A round-1 plan that removes whole blocks is not backed off when recovery distills (`distills`): the trial
    refits only, and a removed block is what only distillation recovers (the zoo ViT's two-block plan lost 21.9 pp
    in its trial and 0.15 pp after 300 distillation steps), so validation after recovery judges it. Instead, where
    `blocks_evaluator` builds a distilling evaluator, other sets of as many blocks are tried (`block_trials`).

    Returns:
        (PlanResult, back-off or None, search step or None, the predicted calibration loss or None, block trials
        or None).
    """
    from profiling_agent.tools.planning.backoff import BACKOFF_TRIALS, back_off, drop_cap
    from profiling_agent.tools.planning.deterministic import plan_round
    from profiling_agent.tools.planning.search import SEARCH_TRIALS, search_step

    objective = state.objective
    result = plan_round(groups, costs, sensitivity, objective, history)
    backoff, search, predicted, trials = None, None, None, None
    depth_plan = distills and any(e.type == "block" for e in result.plan.pruning)
    if depth_plan and not history:
        result, trials = tried_block_sets(result, groups, costs, sensitivity, objective, blocks_evaluator)
        result.plan.rationale += (
            " No back-off trial: the plan removes whole blocks, which the refit-only trial cannot judge and "
            "distillation recovers; validation after recovery decides."
        )
    if not history and result.plan.pruning and not result.converged and not depth_plan:  # never a collapsing plan
        backoff = earlier_backoff(state)
        if backoff is None:
            evaluate = evaluator(BACKOFF_TRIALS + 1)
            backoff = back_off(result.target_estimate,
                               lambda g: plan_round(groups, costs, sensitivity, objective, [], goal=g).plan,
                               lambda plan: evaluate(plan.model_dump()), drop_cap(objective.max_acc_drop))  # fmt: skip
        if backoff.backed_off:
            result = plan_round(groups, costs, sensitivity, objective, history, goal=backoff.goal)
        predicted = predicted_loss(backoff.trials, backoff.goal, "calib_drop_pp")
    elif history and result.plan.pruning and not result.converged:  # later rounds: search what was measured
        evaluate = evaluator(SEARCH_TRIALS + 1)
        search = search_step(
            history,
            objective.max_acc_drop,
            lambda g: plan_round(groups, costs, sensitivity, objective, history, goal=g, reason="trial").plan,
            lambda plan: evaluate(plan.model_dump()),
        )
        if search is not None:
            result = plan_round(groups, costs, sensitivity, objective, history, goal=search.goal, reason=search.why)
            predicted = predicted_loss(search.trials, search.goal, "predicted_pp")
            if predicted is None:  # the chosen goal was not one of the trials: measure the plan itself
                predicted = float(evaluate(result.plan.model_dump())["accuracy_drop_pp"])
    return result, backoff, search, predicted, trials


def tried_block_sets(result, groups, costs, sensitivity, objective, blocks_evaluator: BlockEvaluator | None):
    """Try round 1's other sets of as many blocks (`block_trials`); return the plan kept and the trial records.

    Returns:
        (the plan result of the set closest to the baseline after its trial, the records): `result` itself when that
        is the planner's own set; (`result`, None) when there is no evaluator or nothing to choose from.
    """
    from profiling_agent.tools.planning.block_trials import TRIAL_SETS, block_sets, choose_block_set
    from profiling_agent.tools.planning.depth_plan import block_names
    from profiling_agent.tools.planning.deterministic import PlannerConfig, latency_shares, plan_round

    chosen = block_names(groups, [e.layer for e in result.plan.pruning if e.type == "block"])
    sets = block_sets(groups, latency_shares(groups, costs), sensitivity, PlannerConfig().max_block_fraction, chosen)
    evaluate = blocks_evaluator(TRIAL_SETS) if blocks_evaluator is not None and len(sets) > 1 else None
    if evaluate is None:
        return result, None
    planned: dict[int, Any] = {}  # id(plan) -> its PlanResult

    def plan_for(names: list[str]):
        out = plan_round(groups, costs, sensitivity, objective, [], blocks=names)
        planned[id(out.plan)] = out
        return out.plan, out.target_estimate

    best, records, plans = choose_block_set(
        sets, plan_for, lambda plan: evaluate(plan.model_dump()), objective.target_reduction
    )
    if not records:
        return result, None
    if best == 0:
        return result, records
    kept = planned[id(plans[best])]
    kept.plan.rationale += (
        f" Blocks chosen by trial: of {len(records)} sets of {len(chosen)} blocks, each refit and briefly "
        f"distilled, {', '.join(records[best]['blocks'])} ended closest to the baseline on the calibration images "
        f"(KL {records[best]['kl']:.4f}; the probe's cheapest set {records[0]['kl']:.4f})."
    )
    return kept, records


def round_meta(
    result,
    outcome,
    planner: str,
    turn: str | None,
    predicted,
    search,
    backoff,
    llm_info: LLMStep | None,
    objective,
    block_trials: list[dict[str, Any]] | None = None,
) -> PlannerMeta:
    """Return the planner facts the candidate records (goal, convergence, back-off, search, the LLM's turn)."""
    from profiling_agent.tools.planning.deterministic import estimate_key

    goal = result.target_estimate
    if planner == "llm":  # feedback for later deterministic rounds: what the applied plan aimed at
        goal = float(outcome.estimate.get(estimate_key(objective.target), goal) or goal)
    meta = PlannerMeta(goal=goal, gamma=result.gamma, converged=result.converged, llm=llm_info, turn=turn or None)
    if planner == "deterministic" and predicted is not None:
        meta.predicted_drop = round(predicted, 3)
    if search is not None:
        meta.search = search.to_dict()
    if backoff is not None:
        meta.backoff = {"cap_pp": backoff.cap, "kept_goal": backoff.goal, "trials": backoff.trials}
    if block_trials:
        meta.block_trials = block_trials
    if planner == "llm" and outcome.vs_proposal is not None:
        meta.vs_proposal = outcome.vs_proposal.model_dump()
    return meta


def round_message(
    plan: CompressionPlan,
    planner: str,
    turn,
    outcome,
    backoff,
    search,
    fallbacks: list[Fallback],
    llm_info: LLMStep | None,
) -> str:
    """Say in one line what the round planned, how it got there and what the LLM did."""
    message = f"{planner} plan: {len(plan.pruning)} pruning and {len(plan.quantization)} quantization entries"
    if turn == "reference":
        message = f"reference round: the deterministic planner's own next plan, measured beside the LLM's; {message}"
    elif planner == "llm" and outcome.vs_proposal is not None:
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
        message = f"LLM plan refused ({f.stage}: {f.reason[:160]}); {message}"
    if llm_info is not None:
        message += " " + llm_console_note(llm_info)
    return message


def planning_round(
    state: State,
    ctx: Context,
    full_profile: dict[str, Any],
    mode: str,
    evaluator: Evaluator,
    blocks_evaluator: BlockEvaluator | None = None,
) -> RoundOutcome:
    """Plan round `state.iteration + 1` from the profile, the sensitivity probe and the earlier candidates.

    Args:
        state: The run so far.
        ctx: The run's settings (the LLM endpoint).
        full_profile: profile.json (groups and costs).
        mode: "llm" when an LLM plans every other round (planner_mode), else the deterministic planner alone.
        evaluator: Builds the calibration-trial evaluator, given how many calls it may take (None: its default).
        blocks_evaluator: Builds round 1's block-set trial evaluator (`deterministic_plan`), or returns None.

    Returns:
        The round's plan, planner, recorded facts and message; the stop reason when the planner converged.
    """
    from profiling_agent.tools.compression.depth import block_limits
    from profiling_agent.tools.planning.history import planner_history
    from profiling_agent.tools.planning.plan_guard import GuardConfig
    from profiling_agent.tools.profiling.backend_profile import planning_costs

    iteration = state.iteration + 1
    sensitivity = {name: s.model_dump() for name, s in (state.sensitivity or {}).items()}
    # with an LLM the deterministic planner follows its own sequence (tools/planning/paired.py)
    own = deterministic_sequence(state.candidates) if mode == "llm" else list(state.candidates)
    history = planner_history(own, state.baseline_eval, state.objective)
    groups, costs = full_profile["groups"], planning_costs(full_profile)  # latency shares of the delivered form
    groups = [g for g in groups if not (sensitivity.get(g["name"]) or {}).get("error")]  # the probe could not prune
    depth = state.objective.prunes_depth()  # block groups only with depth pruning on, and only once probed
    groups = [g for g in groups if g["kind"] != "block" or (depth and g["name"] in sensitivity)]
    distills = ctx.recover in ("auto", "distill")
    result, backoff, search, predicted, trials = deterministic_plan(
        state, groups, costs, sensitivity, history, evaluator, distills, blocks_evaluator
    )
    plan, planner, llm_info, outcome = result.plan, result.planner, None, None
    fallbacks: list[Fallback] = []
    turn = None if mode != "llm" else "reference" if reference_due(state.candidates) else "llm"
    if turn == "llm" and result.converged:  # the deterministic sequence is over: the run stops, nothing to pair
        turn = "reference"
    if turn == "llm":
        from profiling_agent.tools.planning.llm_planner import plan_with_llm

        this_round = state.model_copy(update={"iteration": iteration})
        shipped = {**full_profile, "groups": groups, "group_costs": costs}  # the delivered form's shares too
        shipped["block_limits"] = block_limits(groups, GuardConfig().max_block_fraction)  # the guard's rule
        outcome = plan_with_llm(this_round, ctx, shipped, sensitivity, fallback=result, evaluate_fn=evaluator(None))
        plan, planner, fallbacks = outcome.plan, outcome.planner, outcome.fallbacks
        llm_info = outcome.summary(ctx.llm_model)
        if state.objective.planner == "llm" and planner != "llm" and not outcome.usage["calls"]:
            if not llm_replied(state):  # explicit llm, endpoint never answered
                raise never_reached(fallbacks[0] if fallbacks else None, ctx)
    stop = ""
    if result.converged and (planner == "deterministic" or turn):
        stop = f"planner converged before iteration {iteration}: {result.notes[0]}"
    return RoundOutcome(
        plan=plan,
        planner=planner,
        meta=round_meta(result, outcome, planner, turn, predicted, search, backoff, llm_info, state.objective, trials),
        message=round_message(plan, planner, turn, outcome, backoff, search, fallbacks, llm_info)
        + (f"; blocks chosen from {len(trials)} distilled trials" if trials else "")
        + "".join(f"; {n}" for n in result.notes if "cannot be reached" in n),
        fallbacks=fallbacks,
        llm=llm_info,
        stop_reason=stop,
    )
