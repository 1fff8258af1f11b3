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

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from profiling_agent.state import CompressionPlan, SearchRecord
from profiling_agent.tools.planning.error_model import Correction, fit_correction, history_pairs, within_budget

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
    trials: list[dict[str, Any]] = field(default_factory=list)
    intervals: dict[float, list[float]] = field(default_factory=dict)
    why: str = ""

    def to_record(self) -> SearchRecord:
        """Return the step as planner_meta.search records it."""
        data = {
            "goal": round(self.goal, 4),
            "interval": [round(self.low, 4), round(self.high, 4)],
            "correction": round(self.correction.multiplicative, 3),
            "cap_pp": round(self.cap, 3),
            "trials": self.trials,
            "why": self.why,
        }
        return SearchRecord.model_validate(data)


def prediction_correction(history: list[dict[str, Any]]) -> float | None:
    """Return measured / predicted accuracy loss, from the latest round that has both (None when none has).

    Kept for round_check's record (the search itself uses `error_model.fit_correction`). A round's
    `predicted_drop` is its plan's trial; its `drop` is what validation showed after
    recovery. Losses below MIN_PREDICTED_PP count as MIN_PREDICTED_PP (two losses too small to tell apart give 1),
    and the ratio is clamped to
    CORRECTION_BOUNDS, so one lucky or unlucky image cannot swing the next round.
    """
    for h in reversed(history):
        measured, predicted = h.get("drop"), h.get("predicted_drop")
        if measured is None or predicted is None or h.get("rejected"):
            continue
        ratio = max(float(measured), MIN_PREDICTED_PP) / max(float(predicted), MIN_PREDICTED_PP)
        low, high = CORRECTION_BOUNDS
        return min(high, max(low, ratio))
    return None


def bracket(history: list[dict[str, Any]]) -> tuple[float, float] | None:
    """Return (largest passing goal, smallest failing goal above it), or None when no round missed the budget."""
    passes = [h["goal"] for h in history if h["passed"]]
    rejected = [h["goal"] for h in history if h.get("rejected")]
    if rejected:
        passes = [p for p in passes if p < min(rejected)]
    lo = max(passes, default=0.0)
    above = [h["goal"] for h in history if not h["passed"] and not h.get("rejected") and h["goal"] > lo]
    return (lo, min(above)) if above else None


def search_step(
    history: list[dict[str, Any]],
    max_acc_drop: float,
    plan_at: Callable[[float], CompressionPlan],
    trial: Callable[[CompressionPlan], dict[str, Any]],
    steps: int = SEARCH_TRIALS,
    tolerance: float = 0.01,
) -> SearchStep | None:
    """Choose the next goal inside the measured interval from corrected trials (their intervals' upper ends).

    Args:
        history: Earlier rounds (`planner_history`): goal, passed, rejected, drop (validation, pp) and
            predicted_drop (the plan's trial, pp).
        max_acc_drop: The accuracy budget, pp.
        plan_at: Returns the planner's plan for a goal.
        trial: Prunes (and refits) a fresh copy by a plan and returns `accuracy_drop_pp` and `interval_pp` on the
            trial slice.
        steps: Trials (bisection steps inside the interval).
        tolerance: Stop when the interval is narrower than this.

    Returns:
        The step, or None when there is nothing to search (no round missed the budget, or the interval is already
        below `tolerance`): the planner's own choice stands then.
    """
    interval = bracket(history)
    if interval is None or interval[1] - interval[0] < tolerance:
        return None
    correction = fit_correction(history_pairs(history))
    lo, hi = interval
    out = SearchStep(goal=lo, low=lo, high=hi, correction=correction, cap=correction.cap(max_acc_drop))
    low, high, best = lo, hi, None
    for _ in range(steps):
        if high - low < tolerance:
            break
        mid = (low + high) / 2
        metrics = trial(plan_at(mid))
        drop = float(metrics.get("accuracy_drop_pp", 0.0))
        upper = float((metrics.get("interval_pp") or (drop, drop))[1])
        out.trials.append(
            {"goal": round(mid, 4), "predicted_pp": round(drop, 3), "corrected_pp": round(correction(upper), 3)}
        )
        out.intervals[round(mid, 4)] = [float(x) for x in metrics.get("interval_pp") or (drop, drop)]
        if within_budget(upper, correction, max_acc_drop):
            low, best = mid, mid
        else:
            high = mid
    if best is None:  # nothing inside passed: the bisection midpoint of the interval, as before
        out.goal = (lo + hi) / 2 if not out.trials else lo + (out.trials[-1]["goal"] - lo) / 2
    else:
        out.goal = best
    out.why = (
        f"searching between {lo:.1%} (kept the budget) and {hi:.1%} (missed it): {correction.describe()}, so a "
        f"trial's interval may reach at most {out.cap:.2f} pp; {len(out.trials)} trials chose {out.goal:.1%}"
    )
    return out
