"""Search policy between rounds: correct the calibration trial's predicted loss by validation, then bisect on it.

Round 1 plans from the probe and keeps a goal whose trial on the calibration images stays under a cap. After each
round the validation images show what that plan really lost after recovery; the ratio of measured to predicted loss
is the correction carried forward (calibration images can be easier than validation ones, e.g. images the model was
trained on, or harder). Round k+1 searches between the largest goal that kept the budget and the smallest that
missed it: calibration trials of plans inside that interval, each predicted loss multiplied by the correction,
the largest goal whose corrected loss stays under the budget (with a margin) kept.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from profiling_agent.state import CompressionPlan, SearchRecord

AIM = 0.8  # aim the corrected predicted loss at this fraction of the accuracy budget
MIN_PREDICTED_PP = 0.5  # a predicted loss below this is too coarse to divide by (64 images: 1.6 pp per image)
CORRECTION_BOUNDS = (0.25, 20.0)
SEARCH_TRIALS = 4  # calibration trials per searching round


@dataclass
class SearchStep:
    """What a searching round chose and why.

    Attributes:
        goal: The goal to plan for.
        low: The largest goal that kept the budget on validation (0 when none did).
        high: The smallest goal that missed it.
        correction: Measured validation loss / predicted calibration loss, from the rounds so far.
        cap: The calibration loss a trial may show (AIM x budget / correction), pp.
        trials: One record per trial: goal, predicted (calibration) loss, corrected loss.
        why: One sentence for the plan's rationale.
    """

    goal: float
    low: float
    high: float
    correction: float
    cap: float
    trials: list[dict[str, Any]] = field(default_factory=list)
    why: str = ""

    def to_record(self) -> SearchRecord:
        """Return the step as planner_meta.search records it."""
        data = {
            "goal": round(self.goal, 4),
            "interval": [round(self.low, 4), round(self.high, 4)],
            "correction": round(self.correction, 3),
            "cap_pp": round(self.cap, 3),
            "trials": self.trials,
            "why": self.why,
        }
        return SearchRecord.model_validate(data)


def prediction_correction(history: list[dict[str, Any]]) -> float | None:
    """Return measured / predicted accuracy loss, from the latest round that has both (None when none has).

    A round's `predicted_drop` is its plan's calibration trial; its `drop` is what validation showed after
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
    """Choose the next goal inside the measured interval from corrected calibration trials.

    Args:
        history: Earlier rounds (`planner_history`): goal, passed, rejected, drop (validation, pp) and
            predicted_drop (calibration trial of the plan, pp).
        max_acc_drop: The accuracy budget, pp.
        plan_at: Returns the planner's plan for a goal.
        trial: Prunes (and refits) a fresh copy by a plan and returns `accuracy_drop_pp` on calibration images.
        steps: Trials (bisection steps inside the interval).
        tolerance: Stop when the interval is narrower than this.

    Returns:
        The step, or None when there is nothing to search (no round missed the budget, no correction yet, or
        the interval is already below `tolerance`): the planner's own choice stands then.
    """
    interval = bracket(history)
    correction = prediction_correction(history)
    if interval is None or correction is None or interval[1] - interval[0] < tolerance:
        return None
    lo, hi = interval
    cap = AIM * max_acc_drop / correction
    out = SearchStep(goal=lo, low=lo, high=hi, correction=correction, cap=cap)
    low, high, best = lo, hi, None
    for _ in range(steps):
        if high - low < tolerance:
            break
        mid = (low + high) / 2
        drop = float(trial(plan_at(mid)).get("accuracy_drop_pp", 0.0))
        ok = drop <= cap + 1e-9
        out.trials.append(
            {"goal": round(mid, 4), "predicted_pp": round(drop, 3), "corrected_pp": round(drop * correction, 3)}
        )
        if ok:
            low, best = mid, mid
        else:
            high = mid
    if best is None:  # nothing inside passed: the bisection midpoint of the interval, as before
        out.goal = (lo + hi) / 2 if not out.trials else lo + (out.trials[-1]["goal"] - lo) / 2
    else:
        out.goal = best
    out.why = (
        f"searching between {lo:.1%} (kept the budget) and {hi:.1%} (missed it): validation lost {correction:.2f}x "
        f"what the calibration trial predicted, so a trial may lose at most {cap:.2f} pp; {len(out.trials)} trials "
        f"chose {out.goal:.1%}"
    )
    return out
