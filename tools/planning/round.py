"""One planning round: the deterministic plan (backed off or searched), the LLM's turn, and what it records."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from profiling_agent.state import (
    BlockTrial,
    Candidate,
    CompressionPlan,
    Context,
    Fallback,
    GroupSensitivity,
    LLMStep,
    Objective,
    PastRound,
    PlannerMeta,
    PlannerMode,
    PlanningProblem,
    TokenChoice,
)
from profiling_agent.tools.compression.depth import block_limits
from profiling_agent.tools.planning.alternatives import LABELS
from profiling_agent.tools.planning.backoff import BACKOFF_TRIALS, Backoff, back_off, drop_cap
from profiling_agent.tools.planning.block_trials import TRIAL_SETS, block_sets, choose_block_set
from profiling_agent.tools.planning.depth_plan import block_names
from profiling_agent.tools.planning.deterministic import PlanResult, Steering, plan_round
from profiling_agent.tools.planning.error_model import RECOVERY_PRIOR, Correction, fit_correction, history_correction
from profiling_agent.tools.planning.history import planner_history
from profiling_agent.tools.planning.llm_client import llm_console_note, never_reached
from profiling_agent.tools.planning.llm_conversation import TOOLS_DROPPED
from profiling_agent.tools.planning.llm_planner import plan_with_llm
from profiling_agent.tools.planning.paired import deterministic_sequence, reference_due
from profiling_agent.tools.planning.plan_guard import GuardConfig
from profiling_agent.tools.planning.ratio_solver import PlannerConfig, estimate_key
from profiling_agent.tools.planning.round_inputs import RoundInputs
from profiling_agent.tools.planning.search import SEARCH_TRIALS, PushBounds, SearchStep, push_step, search_step
from profiling_agent.tools.planning.token_plan import (
    TokenOption,
    pruning_problem,
    run_option,
    token_option,
    weigh,
    with_tokens,
)
from profiling_agent.tools.planning.trials import MAX_EVALUATIONS, Evaluate
from profiling_agent.tools.profiling.backend_profile import planning_costs

if TYPE_CHECKING:
    from profiling_agent.tools.planning.llm_planner import LLMOutcome

# builds evaluate_plan (a plan tried on a fresh baseline copy, judged on the trial slice), at most `max_calls` times
Evaluator = Callable[[int | None], Evaluate]
# builds the block-set trials' evaluator (refit, then a short distillation), or None where it cannot run
BlockEvaluator = Callable[[int], Evaluate | None]


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
    choice: PlannerMode | None = None  # how the objective's planner choice resolved (None: a uniform baseline)
    # a paired round whose plan was measured before: that candidate's record, as this round's (`paired`)
    measured: dict[str, Any] | None = None


@dataclass(frozen=True)
class RoundData:
    """The deterministic planner's view of a round: its planning problem and the token merging its plans add."""

    problem: PlanningProblem
    tokens: TokenOption | None = None  # the merging rate the plan adds (`token_plan`); goals stay in total terms

    @property
    def objective(self) -> Objective:
        """The run's objective."""
        return self.problem.objective

    @property
    def history(self) -> list[PastRound]:
        """The earlier rounds, as the deterministic planner reads them."""
        return self.problem.history

    def plan(self, goal: float | None = None, steer: Steering | None = None) -> PlanResult:
        """Return the deterministic planner's plan of this round (at `goal`, steered as given)."""
        if self.tokens is None:
            return plan_round(self.problem, goal=goal, steer=steer)
        objective, history, pruning_goal = pruning_problem(self.tokens, self.objective, self.history, goal)
        pruning = self.problem.model_copy(update={"objective": objective, "history": history})
        result = plan_round(pruning, goal=pruning_goal, steer=steer)
        result.target_estimate = with_tokens(result.plan, self.tokens, result.target_estimate)
        return result

    def plan_at(self, goal: float) -> CompressionPlan:
        """Return the plan at `goal` of a first round backing off (`backoff.back_off`)."""
        return self.plan(goal=goal).plan

    def trial_plan(self, goal: float) -> CompressionPlan:
        """Return the plan a searching round tries at `goal` (`search.search_step`, `search.push_step`)."""
        return self.plan(goal=goal, steer=Steering(reason="trial")).plan


@dataclass
class DeterministicRound:
    """The deterministic planner's round: its plan and the trials that chose it."""

    result: PlanResult
    backoff: Backoff | None = None
    search: SearchStep | None = None
    predicted: float | None = None  # the plan's trial-slice loss, pp (a trial of it)
    interval: list[float] | None = None  # its paired 95% interval [low, high], pp
    trials: list[BlockTrial] | None = None  # round 1's block-set trials
    tokens: TokenChoice | None = None  # round 1's weighing of merging against pruning alone
    expected: list[float] | None = None  # validation's loss expected after recovery [point, low, high], pp

    def expect(self, correction: Correction) -> None:
        """Set `expected`: the trial's loss and interval corrected as the round's goal was chosen (`error_model`)."""
        if self.predicted is None:
            return
        goal = self.result.target_estimate
        ends = self.interval or [self.predicted, self.predicted]
        self.expected = [correction(float(x), goal) for x in (self.predicted, *ends)]


@dataclass
class Turn:
    """The plan a round applies and who made it: the deterministic planner, or the LLM (its outcome and facts)."""

    plan: CompressionPlan
    planner: str
    turn: str | None = None  # with an LLM: "llm", or "reference" (the deterministic sequence's own round)
    outcome: LLMOutcome | None = None
    llm: LLMStep | None = None
    fallbacks: list[Fallback] = field(default_factory=list)


def earlier_backoff(candidates: Sequence[Candidate]) -> Backoff | None:
    """Return round 1's back-off when an earlier candidate already ran it (a paired run's reference turn)."""
    for cand in candidates:
        if cand.planner_meta.backoff is not None:
            return Backoff.from_record(cand.planner_meta.backoff)
    return None


def round_data(inputs: RoundInputs, full_profile: dict[str, Any], mode: str) -> RoundData:
    """Return the groups the planner may prune (probed, depth only when on), their costs, and its own history."""
    # with an LLM the deterministic planner follows its own sequence (tools/planning/paired.py)
    own = deterministic_sequence(inputs.candidates) if mode == "llm" else list(inputs.candidates)
    history = planner_history(own, inputs.baseline_eval, inputs.objective)
    groups = planned_groups(inputs, full_profile)
    costs = planning_costs(full_profile)  # latency shares of the delivered form
    axis = inputs.token_axis
    # the first round weighs the best paying rate; later rounds keep what it chose
    option = run_option(axis, own) if history else token_option(axis, inputs.objective)
    return RoundData(PlanningProblem.of(groups, costs, inputs.sensitivity, inputs.objective, history), option)


def planned_groups(inputs: RoundInputs, full_profile: dict[str, Any]) -> list[dict[str, Any]]:
    """Return the profile's groups (JSON) a round may prune: probed without error, blocks only with depth pruning."""
    sensitivity = inputs.sensitivity
    groups = [g for g in full_profile["groups"] if not _probe_failed(sensitivity.get(g["name"]))]
    depth = inputs.objective.prunes_depth()  # block groups only with depth pruning on, and only once probed
    return [g for g in groups if g["kind"] != "block" or (depth and g["name"] in sensitivity)]


def _probe_failed(record: GroupSensitivity | None) -> bool:
    return record is not None and bool(record.error)


def weighed_tokens(data: RoundData, evaluator: Evaluator) -> tuple[RoundData, TokenChoice]:
    """Try round 1's plan with merging and without at the same goal; return the data that plans the kept one."""
    assert data.tokens is not None
    unmerged = dataclasses.replace(data, tokens=None)
    choice = weigh(data.tokens, data.plan().plan, unmerged.plan().plan, evaluator(2))
    return (data if choice.chosen else unmerged), choice


def deterministic_plan(
    data: RoundData,
    candidates: Sequence[Candidate],
    evaluator: Evaluator,
    blocks_evaluator: BlockEvaluator | None = None,
    distills: bool = False,
    trials: int = 0,
) -> DeterministicRound:
    """Plan deterministically: round 1 backs off a collapsing goal, later rounds search what was measured.

    A round-1 plan that removes whole blocks is not backed off when recovery distills (`distills`): the trial
    refits only, and a removed block is what only distillation recovers (`docs/facts.md`), so validation after
    recovery judges it. Instead, where `blocks_evaluator` builds a distilling evaluator, other sets of as many
    blocks are tried (`block_trials`). `candidates` are all earlier rounds (a back-off already run is reused).
    `trials` bounds a searching round's trials (0: `search.SEARCH_TRIALS`).
    """
    out = DeterministicRound(data.plan())
    result, history = out.result, data.history
    depth_plan = distills and any(e.type == "block" for e in result.plan.pruning)
    if depth_plan and not history:
        out.result, out.trials = tried_block_sets(result, data, blocks_evaluator)
        out.result.plan.rationale += (
            " No back-off trial: the plan removes whole blocks, which the refit-only trial cannot judge and "
            "distillation recovers; validation after recovery decides."
        )
    elif not history and result.plan.pruning and not result.converged:  # never a collapsing plan
        backed_off(out, data, candidates, evaluator, distills)
    elif history and result.plan.pruning and not result.converged:  # later rounds: search what was measured
        searched(out, data, evaluator, distills, trials)
    return out


def backed_off(
    out: DeterministicRound, data: RoundData, candidates: Sequence[Candidate], evaluator: Evaluator, distills: bool
) -> None:
    """Back round 1's goal off until its plan's trial stays under the cap (`backoff.py`), in `out`."""
    backoff = earlier_backoff(candidates)
    if backoff is None:
        evaluate = evaluator(BACKOFF_TRIALS + 1)
        cap = drop_cap(data.objective.max_acc_drop)
        goal = out.result.target_estimate
        backoff = back_off(goal, data.plan_at, evaluate, cap)
    if backoff.backed_off:
        out.result = data.plan(goal=backoff.goal)
    out.backoff = backoff
    out.predicted = backoff.loss_at(backoff.goal)
    out.interval = backoff.intervals.get(round(backoff.goal, 4))
    out.expect(fit_correction([], prior_slope=recovery_prior(distills)))


def recovery_prior(distills: bool) -> float:
    """Return the slope a trial's loss is corrected by before two rounds differ: the recovery prior when distilling."""
    return RECOVERY_PRIOR if distills else 1.0


def searched(
    out: DeterministicRound, data: RoundData, evaluator: Evaluator, distills: bool = False, trials: int = 0
) -> None:
    """Search the measured interval by corrected trials (`search.py`), or push above it; the goal goes in `out`.

    After a miss the search's correction keeps the slope 1 until two rounds differ; a push past rounds that all
    kept the budget corrects with the recovery prior when recovery distills (`push_step`).
    """
    steps = trials or SEARCH_TRIALS
    evaluate = evaluator(steps + 1)
    budget, prior = data.objective.max_acc_drop, recovery_prior(distills)
    search = search_step(data.history, budget, data.trial_plan, evaluate, steps)
    if search is None:
        feasible = data.plan(goal=1.0, steer=Steering(reason="trial")).target_estimate
        bounds = PushBounds(budget, feasible, data.objective.target_reduction, prior)
        search = push_step(data.history, bounds, data.trial_plan, evaluate, steps)
    if search is None:  # the planner's own goal stands: one trial records what it predicts (its refit is reused)
        measured(out, evaluate)
        out.expect(history_correction(data.history, prior))
        return
    out.search = search
    if search.goal <= search.low + 1e-9:  # a push whose trials all failed: nothing above is predicted to pass
        out.result.converged = True
        out.result.notes.insert(0, f"no goal above {search.low:.1%} is predicted to keep the budget ({search.why})")
        return
    out.result = data.plan(goal=search.goal, steer=Steering(reason=search.why))
    out.predicted = search.loss_at(search.goal)
    out.interval = search.intervals.get(round(search.goal, 4))
    if out.predicted is None:  # the chosen goal was not one of the trials: measure the plan itself
        measured(out, evaluate)
    out.expect(search.correction)


def measured(out: DeterministicRound, evaluate: Evaluate) -> None:
    """Try the round's own plan once; its loss and interval go in `out`."""
    tried = evaluate(out.result.plan)
    out.predicted, out.interval = float(tried.accuracy_drop_pp), tried.interval_pp


def tried_block_sets(
    result: PlanResult, data: RoundData, blocks_evaluator: BlockEvaluator | None
) -> tuple[PlanResult, list[BlockTrial] | None]:
    """Try round 1's other sets of as many blocks (`block_trials`); return the plan kept and the trial records.

    Returns:
        (the plan result of the set closest to the baseline after its trial, the records): `result` itself when that
        is the planner's own set; (`result`, None) when there is no evaluator or nothing to choose from.
    """
    rows = data.problem.rows
    chosen = block_names(rows, [e.layer for e in result.plan.pruning if e.type == "block"])
    sets = block_sets(rows, PlannerConfig().max_block_fraction, chosen)
    evaluate = blocks_evaluator(TRIAL_SETS) if blocks_evaluator is not None and len(sets) > 1 else None
    if evaluate is None:
        return result, None
    planned: dict[int, PlanResult] = {}  # id(plan) -> its PlanResult

    def plan_for(names: list[str]) -> tuple[CompressionPlan, float]:
        out = data.plan(steer=Steering(blocks=names))
        planned[id(out.plan)] = out
        return out.plan, out.target_estimate

    target = data.objective.target_reduction
    best, records, plans = choose_block_set(sets, plan_for, evaluate, target)
    if not records:
        return result, None
    if best == 0:
        return result, records
    kept = planned[id(plans[best])]
    kept.plan.rationale += (
        f" Blocks chosen by trial: of {len(records)} sets of {len(chosen)} blocks, each refit and briefly "
        f"distilled, {', '.join(records[best].blocks)} ended closest to the baseline on the trial slice "
        f"(KL {records[best].kl:.4f}; the probe's cheapest set {records[0].kl:.4f})."
    )
    return kept, records


def llm_turn(
    inputs: RoundInputs,
    ctx: Context,
    full_profile: dict[str, Any],
    data: RoundData,
    fallback: PlanResult,
    evaluate: Evaluate,
    conversation: Any = None,
) -> Turn:
    """Ask the LLM for the plan, the deterministic one its fallback; raise when an explicit LLM never replied.

    `conversation` is the compiled conversation subgraph the analyze node runs (None: the module's own).
    """
    names = set(data.problem.names())
    groups = [g for g in full_profile["groups"] if g["name"] in names]  # the rows' own JSON, for the LLM
    shipped = {**full_profile, "groups": groups, "group_costs": planning_costs(full_profile)}  # the delivered form's
    shipped["block_limits"] = block_limits(groups, GuardConfig().max_block_fraction)  # the guard's rule
    if inputs.token_axis is not None:  # the prompt's token note (the guard and the token_table tool read it too)
        shipped["token_axis"] = inputs.token_axis.model_dump()
    outcome = plan_with_llm(
        inputs,
        ctx,
        shipped,
        inputs.sensitivity,
        fallback=fallback,
        evaluate_fn=evaluate,
        conversation=conversation,
    )
    turn = Turn(outcome.plan, outcome.planner, "llm", outcome, outcome.summary(ctx.llm_model), outcome.fallbacks)
    if inputs.objective.planner == "llm" and outcome.planner != "llm" and not outcome.usage["calls"]:
        if not inputs.llm_replied():  # explicit llm, endpoint never answered
            raise never_reached(outcome.fallbacks[0] if outcome.fallbacks else None, ctx)
    return turn


def round_meta(det: DeterministicRound, turn: Turn, objective: Objective) -> PlannerMeta:
    """Return the planner facts the candidate records (goal, convergence, back-off, search, the LLM's turn)."""
    result, outcome = det.result, turn.outcome
    goal = result.target_estimate
    if turn.planner == "llm" and outcome is not None:  # feedback for later deterministic rounds: the plan's aim
        goal = float(outcome.estimate.get(estimate_key(objective.target), goal) or goal)
    meta = PlannerMeta(goal=goal, gamma=result.gamma, converged=result.converged, llm=turn.llm, turn=turn.turn)
    if turn.planner == "deterministic" and det.predicted is not None:
        meta.predicted_drop = round(det.predicted, 3)
        if det.interval is not None:
            meta.predicted_interval = [round(float(x), 3) for x in det.interval]
        if det.expected is not None:
            meta.expected_drop = round(det.expected[0], 3)
            meta.expected_interval = [round(x, 3) for x in det.expected[1:]]
    if det.search is not None:
        meta.search = det.search.to_record()
        meta.correction = det.search.correction.as_list()
    if det.backoff is not None:
        meta.backoff = det.backoff.to_record()
    if det.trials:
        meta.block_trials = [t.model_copy() for t in det.trials]
    if det.tokens is not None:
        meta.tokens = det.tokens
    if turn.planner == "llm" and outcome is not None and outcome.vs_proposal is not None:
        meta.vs_proposal = outcome.vs_proposal
    return meta


def round_message(det: DeterministicRound, turn: Turn) -> str:
    """Say in one line what the round planned, how it got there and what the LLM did."""
    plan, planner, outcome, backoff = turn.plan, turn.planner, turn.outcome, det.backoff
    message = f"{planner} plan: {len(plan.pruning)} pruning and {len(plan.quantization)} quantization entries"
    if turn.turn == "reference":
        message = f"reference round: the deterministic planner's own next plan, measured beside the LLM's; {message}"
    elif planner == "llm" and outcome is not None:
        message += f" (LLM plan {outcome.applied()})"
    if backoff is not None and backoff.backed_off:
        first = backoff.trials[0]
        message += (
            f"; backed off from a {first.goal:.1%} goal (its trial lost {first.calib_drop_pp:.1f} pp on the "
            f"trial slice) to {backoff.goal:.1%} (cap {backoff.cap:g} pp on the upper end of its interval)"
        )
    if det.search is not None:
        message += f"; {det.search.why}"
    for f in turn.fallbacks:
        message = f"LLM plan refused ({f.stage}: {f.reason[:160]}); replaced by the {message}"
    if turn.llm is not None:
        message += " " + llm_console_note(turn.llm)
    if turn.llm is not None and turn.llm.tools_dropped:  # said once: the round that found it out
        message += "; " + TOOLS_DROPPED.format(why=turn.llm.tools_dropped)
    message += f"; blocks chosen from {len(det.trials)} distilled trials" if det.trials else ""
    message += f"; tokens: {det.tokens.why}" if det.tokens is not None else ""
    return message + "".join(f"; {n}" for n in det.result.notes if "cannot be reached" in n)


def planning_round(
    inputs: RoundInputs,
    ctx: Context,
    full_profile: dict[str, Any],
    mode: str,
    evaluator: Evaluator,
    blocks_evaluator: BlockEvaluator | None = None,
    conversation: Any = None,
) -> RoundOutcome:
    """Plan round `inputs.iteration` from the profile, the sensitivity probe and the earlier candidates.

    Args:
        inputs: What the round reads from the run (objective, candidates, baseline evaluation, sensitivity).
        ctx: The run's settings (the LLM endpoint, the recovery).
        full_profile: profile.json (groups and costs).
        mode: "llm" when an LLM plans every other round (planner_mode), else the deterministic planner alone.
        evaluator: Builds the trial evaluator (on the trial slice), given how many calls it may take (None: default).
        blocks_evaluator: Builds round 1's block-set trial evaluator (`deterministic_plan`), or returns None.
        conversation: The compiled LLM conversation subgraph (None: `llm_conversation.conversation`).

    Returns:
        The round's plan, planner, recorded facts and message; the stop reason when the planner converged.
    """
    data = round_data(inputs, full_profile, mode)
    choice = None
    if data.tokens is not None and not data.history:  # round 1: merging weighed against pruning alone, by trial
        data, choice = weighed_tokens(data, evaluator)
    distills = ctx.recover in ("auto", "distill")
    det = deterministic_plan(data, inputs.candidates, evaluator, blocks_evaluator, distills, ctx.trials)
    det.tokens = choice
    result = det.result
    turn = Turn(result.plan, result.planner)
    if mode == "llm":
        turn.turn = "reference" if reference_due(inputs.candidates) else "llm"
        if turn.turn == "llm" and result.converged:  # the deterministic sequence is over: nothing to pair
            turn.turn = "reference"
    if turn.turn == "llm":  # the LLM's trials: its evaluate_plan calls and one per offered alternative
        measured = dataclasses.replace(result, predicted_pp=det.predicted)  # the alternatives reuse its trial
        evaluate = evaluator(MAX_EVALUATIONS + len(LABELS) - 1)
        turn = llm_turn(inputs, ctx, full_profile, data, measured, evaluate, conversation)
    stop = ""
    if result.converged and (turn.planner == "deterministic" or turn.turn):
        stop = f"planner converged before iteration {inputs.iteration}: {result.notes[0]}"
    return RoundOutcome(
        plan=turn.plan,
        planner=turn.planner,
        meta=round_meta(det, turn, inputs.objective),
        message=round_message(det, turn),
        fallbacks=turn.fallbacks,
        llm=turn.llm,
        stop_reason=stop,
    )
