"""Search policy between rounds: correct the trials' predicted loss by what validation measured, then bisect on it.

Round 1 plans from the probe and keeps a goal whose trial on the trial slice (validation rows the model never
trained on) stays under a cap. After each round the validation images show what that plan really lost after
recovery; the (predicted, measured) pairs fit a correction (`error_model.fit_correction`: additive, and
multiplicative from two rounds on) carried forward, since a refit-only trial before distillation is not the
recovered model. Round k+1 searches between the largest goal that kept the budget and the smallest that missed it:
trials of plans inside that interval, the UPPER end of each trial's paired interval corrected, the largest goal
whose corrected upper end stays within the budget kept. A prediction of zero cannot fool it: the interval's upper
end is above zero and the additive term carries what earlier rounds lost beyond their prediction.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from profiling_agent.state import CompressionPlan, PastRound, SearchRecord, SearchTrial, Trial
from profiling_agent.tools.planning.error_model import Correction, history_correction, within_budget

AIM = 0.8  # depth_plan's linear extrapolation aims at this fraction of the budget
MIN_PREDICTED_PP = 0.5  # round_check's ratio: a predicted loss below this is too coarse to divide by
CORRECTION_BOUNDS = (0.25, 20.0)
SEARCH_TRIALS = 4  # trials per searching round


@dataclass
class SearchStep:
    """What a searching round chose and why.

    Attributes:
        goal: The goal to plan for.
        low: The largest goal that kept the budget on validation (0 when none did).
        high: The smallest goal that missed it.
        correction: The correction fitted from the rounds so far (`error_model.Correction`).
        cap: The upper end of its interval a trial may show: corrected, it stays within the budget, pp.
        trials: One record per trial: goal, predicted (trial-slice) loss, corrected upper end of its interval.
        intervals: Goal (as recorded) -> the paired 95% interval [low, high] of its trial's loss, pp.
        why: One sentence for the plan's rationale.
    """

    goal: float
    low: float
    high: float
    correction: Correction
    cap: float
    trials: list[SearchTrial] = field(default_factory=list)
    intervals: dict[float, list[float]] = field(default_factory=dict)
    why: str = ""

    def record(self, goal: float, trial: Trial) -> tuple[float, float]:
        """Record a trial at `goal` (its loss, its interval, its corrected upper end); return (loss, upper end), pp."""
        drop, interval = float(trial.accuracy_drop_pp), trial.bounds()
        corrected = round(self.correction(interval[1], goal), 3)
        self.trials.append(SearchTrial(goal=round(goal, 4), predicted_pp=round(drop, 3), corrected_pp=corrected))
        self.intervals[round(goal, 4)] = interval
        return drop, interval[1]

    def loss_at(self, goal: float) -> float | None:
        """Return the trial-slice loss the trial at `goal` measured (rounded as recorded), or None."""
        return next((t.predicted_pp for t in self.trials if abs(t.goal - round(goal, 4)) < 1e-9), None)

    def to_record(self) -> SearchRecord:
        """Return the step as planner_meta.search records it."""
        data = {
            "goal": round(self.goal, 4),
            "interval": [round(self.low, 4), round(self.high, 4)],
            "correction": round(self.correction.multiplicative, 3),
            "cap_pp": round(self.cap, 3),
            "trials": [t.model_dump() for t in self.trials],
            "why": self.why,
        }
        return SearchRecord.model_validate(data)


def prediction_correction(history: Sequence[PastRound]) -> float | None:
    """Return measured / predicted accuracy loss, from the latest round that has both (None when none has).

    Kept for round_check's record (the search itself uses `error_model.history_correction`). A round's
    `predicted_drop` is its plan's trial; its `drop` is what validation showed after
    recovery. Losses below MIN_PREDICTED_PP count as MIN_PREDICTED_PP (two losses too small to tell apart give 1),
    and the ratio is clamped to
    CORRECTION_BOUNDS, so one lucky or unlucky image cannot swing the next round.
    """
    for h in reversed(history):
        measured, predicted = h.drop, h.predicted_drop
        if measured is None or predicted is None or h.rejected:
            continue
        ratio = max(float(measured), MIN_PREDICTED_PP) / max(float(predicted), MIN_PREDICTED_PP)
        low, high = CORRECTION_BOUNDS
        return min(high, max(low, ratio))
    return None


def kept_goals(history: Sequence[PastRound]) -> list[float]:
    """Return the goals that kept the budget below any a reviewer rejected (a "no" caps the search)."""
    rejected = [h.goal for h in history if h.rejected]
    return [h.goal for h in history if h.passed and h.goal < min(rejected, default=float("inf"))]


def bracket(history: Sequence[PastRound]) -> tuple[float, float] | None:
    """Return (largest passing goal, smallest failing goal above it), or None when no round missed the budget."""
    lo = max(kept_goals(history), default=0.0)
    above = [h.goal for h in history if not h.passed and not h.rejected and h.goal > lo]
    return (lo, min(above)) if above else None


def secant_goal(history: Sequence[PastRound], lo: float, hi: float, max_acc_drop: float) -> float | None:
    """Return the goal where the line through the bracket's measured losses reaches AIM x budget (None: no line).

    The ends are the largest goal that kept the budget (0 pp at 0 when none did) and the smallest that missed it,
    each at what validation measured after recovery. Accuracy loss grows faster than linearly with the reduction,
    so the line errs low (`depth_plan.depth_secant` does the same for block plans).
    """
    drops = {float(h.goal): h.drop for h in history if h.drop is not None}
    m_lo, m_hi = (0.0 if lo == 0 else drops.get(lo)), drops.get(hi)
    aim = AIM * max_acc_drop
    if m_lo is None or m_hi is None or float(m_hi) <= max(aim, float(m_lo)):
        return None
    return line_goal((lo, float(m_lo)), (hi, float(m_hi)), aim)


def line_goal(low: tuple[float, float], high: tuple[float, float], aim: float) -> float:
    """Return the goal where the line through (goal, measured loss) points `low` and `high` reaches `aim` pp."""
    (g_lo, m_lo), (g_hi, m_hi) = low, high
    return g_lo + (g_hi - g_lo) * max(0.0, aim - m_lo) / (m_hi - m_lo)


def chosen_goal(
    out: SearchStep, history: Sequence[PastRound], max_acc_drop: float, best: float | None, missed: float
) -> float:
    """Return the larger of the trials' goal and the secant through the bracket, kept below any outright miss.

    A trial fails the rule on doubt (its interval's upper end over the budget: a small trial slice is wide) or on
    evidence (its corrected loss itself over the budget). Doubt alone does not overrule the line through what
    validation measured after recovery on many more images; evidence does: the line is then kept below that trial.
    The trials' goal is the largest that passed, or when none did the bisection's, below the last trial.
    """
    lo, hi = out.low, out.high
    if best is not None:
        trials = best
    elif out.trials:  # none passed: below the last (smallest) trial
        trials = lo + (out.trials[-1].goal - lo) / 2
    else:
        trials = (lo + hi) / 2
    secant = secant_goal(history, lo, hi, max_acc_drop)
    if secant is None or secant <= trials:
        return trials
    if secant >= missed:  # a trial below the line already lost more than the budget: stay under it
        secant = max(trials, lo + (missed - lo) / 2)
    out.why = f"the line through the losses validation measured aims at {secant:.1%}"
    return secant


def search_step(
    history: Sequence[PastRound],
    max_acc_drop: float,
    plan_at: Callable[[float], CompressionPlan],
    trial: Callable[[CompressionPlan], Trial],
    steps: int = SEARCH_TRIALS,
    tolerance: float = 0.01,
) -> SearchStep | None:
    """Choose the next goal inside the measured interval from corrected trials (their intervals' upper ends).

    Args:
        history: Earlier rounds (`planner_history`): goal, passed, rejected, drop (validation, pp) and
            predicted_drop (the plan's trial, pp).
        max_acc_drop: The accuracy budget, pp.
        plan_at: Returns the planner's plan for a goal.
        trial: Prunes (and refits) a fresh copy by a plan and returns its trial (loss and interval) on the trial slice.
        steps: Trials (bisection steps inside the interval).
        tolerance: Stop when the interval is narrower than this.

    Returns:
        The step, or None when there is nothing to search (no round missed the budget, or the interval is already
        below `tolerance`): the planner's own choice stands then.
    """
    interval = bracket(history)
    if interval is None or interval[1] - interval[0] < tolerance:
        return None
    correction = history_correction(history)
    lo, hi = interval
    out = SearchStep(goal=lo, low=lo, high=hi, correction=correction, cap=correction.cap(max_acc_drop, hi))
    low, high, best, missed = lo, hi, None, hi
    for _ in range(steps):
        if high - low < tolerance:
            break
        mid = (low + high) / 2
        drop, upper = out.record(mid, trial(plan_at(mid)))
        if within_budget(upper, correction, max_acc_drop, mid):
            low, best = mid, mid
        else:
            high = mid
            if correction(drop, mid) > max_acc_drop:  # its corrected loss itself misses: evidence, not doubt
                missed = min(missed, mid)
    out.goal = chosen_goal(out, history, max_acc_drop, best, missed)
    out.cap = correction.cap(max_acc_drop, out.goal)
    out.why = (
        f"searching between {lo:.1%} (kept the budget) and {hi:.1%} (missed it): {correction.describe()}, so a "
        f"trial's interval may reach at most {out.cap:.2f} pp there; {len(out.trials)} trials chose {out.goal:.1%}"
        + (f" ({out.why})" if out.why else "")
    )
    return out


@dataclass(frozen=True)
class PushBounds:
    """What a push may reach: the budget, the largest feasible goal, the run's target and the trials' prior slope."""

    budget: float  # pp
    feasible: float  # the largest goal the ratio caps allow
    target: float = 0.0  # the run's target reduction: below it a push never ends for want of a passing trial
    prior_slope: float = 1.0  # the correction's slope until two rounds differ (`error_model.RECOVERY_PRIOR`)


def push_step(
    history: Sequence[PastRound],
    bounds: PushBounds,
    plan_at: Callable[[float], CompressionPlan],
    trial: Callable[[CompressionPlan], Trial],
    steps: int = SEARCH_TRIALS,
    tolerance: float = 0.01,
) -> SearchStep | None:
    """Push above the largest goal that kept the budget, when no round missed it: the largest goal by trial.

    The trials run from the top down: the largest feasible goal first (taken when it passes), then bisection between
    the largest goal that kept the budget and the smallest trial that failed. A trial passes when the upper end of
    its paired interval, corrected by the earlier rounds with the prior slope until two rounds differ
    (`error_model.fit_correction`), stays within the budget: after distillation a refit-only trial overstates what
    validation shows (the recovery prior, `error_model.RECOVERY_PRIOR`), and the additive term carries what the
    earlier rounds measured beyond it. When no trial passes: `fallback_goal`.

    Returns:
        The step (its goal the low end when nothing above it is predicted to keep the budget), or None when a round
        missed the budget (`search_step` searches then), none kept it, or nothing is left above.
    """
    if bracket(history) is not None:
        return None
    passes = kept_goals(history)
    feasible, budget = bounds.feasible, bounds.budget
    if not passes or feasible - max(passes) < tolerance:
        return None
    correction = history_correction(history, bounds.prior_slope)
    lo = max(passes)
    out = SearchStep(goal=lo, low=lo, high=feasible, correction=correction, cap=correction.cap(budget, feasible))
    low, high, best, doubted = lo, feasible, None, []
    for i in range(steps):
        if i and high - low < tolerance:
            break
        goal = feasible if i == 0 else (low + high) / 2
        drop, upper = out.record(goal, trial(plan_at(goal)))
        if within_budget(upper, correction, budget, goal):
            low, best = goal, goal
            if i == 0:
                break
        else:
            high = goal
            if correction(drop, goal) <= budget + 1e-9:  # doubt, not evidence
                doubted.append(goal)
    if best is not None:
        out.goal, found = best, f"{len(out.trials)} trials chose {best:.1%}"
    else:
        out.goal, found = fallback_goal(lo, high, doubted, bounds.target, tolerance)
    out.cap = correction.cap(budget, out.goal)
    out.why = (
        f"pushing above {lo:.1%} (every round kept the budget) up to the largest feasible {feasible:.1%}: "
        f"{correction.describe()}, so a trial's interval may reach at most {out.cap:.2f} pp there; {found}"
    )
    return out


def fallback_goal(lo: float, high: float, doubted: list[float], target: float, tolerance: float) -> tuple[float, str]:
    """Return a push's goal when no trial passed, and why.

    The largest trial that failed on doubt alone (its corrected loss within the budget, its interval's upper end
    not: a slice too small to rule it in or out, and validation, on many more images, judges it); when every trial
    failed on evidence, below the run's `target` a step halfway to the smallest trial `high` (as `search_step`
    does), and past a met target `lo`: the push ends there.
    """
    if doubted:
        goal = max(doubted)
        return goal, (
            f"no trial's upper end fitted; {goal:.1%} is the largest whose corrected loss itself fits (doubt on the "
            "trial slice, not evidence: validation judges it)"
        )
    if lo < target and high - lo >= 2 * tolerance:
        goal = lo + (high - lo) / 2
        return goal, f"no trial passed; below the target, halfway to the smallest trial: {goal:.1%}"
    return lo, "no trial above it passed"
