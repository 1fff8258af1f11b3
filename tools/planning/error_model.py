"""The error model of a predicted accuracy loss: a paired interval from the trial's images, corrected by earlier rounds.

A plan's trial scores the same images with the baseline and with the trial model, so the loss is a paired
difference: b images the baseline got right and the trial got wrong, c the other way round, n in all; the loss is
(b - c) / n. Its 95% interval adds half an image to each discordant cell (n + 2 in all, Agresti and Min's adjustment
of the paired difference), so a trial that changed no prediction still has an upper end above zero, wider on fewer
images (64 images: 0 +- 3.0 pp; 256: 0 +- 0.8 pp). The next round keeps a goal whose trial's UPPER end, corrected
by what earlier rounds measured, stays within the budget: corrected(x) = additive + multiplicative * x, fitted from
the (predicted, measured) pairs of earlier rounds (one pair: the additive term alone; none: no correction). No
pruning loses nothing, so below the goals it was measured at the additive term shrinks in proportion to the goal: a
round that lost 2.15 pp more than its trial said at 35% does not charge 2.15 pp to every smaller plan (a rule that
did made every trial of a search fail after a narrow miss, and the search fell to a tenth of the goal).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from profiling_agent.state import PastRound

Z95 = 1.959964  # two-sided 95% normal quantile
# the share of a refit-only trial's loss that validation still shows after automatic recovery (distillation to its
# plateau), the slope a push corrects trials with until two rounds differ, and round 1's expected loss: fitted on the
# tune half of bench/generalization.py only (through the origin over its rounds and oracle levels whose trial lost
# anything: 0.17, or 0.21 without its one large trial, 17.19 -> 2.93 pp; docs/benchmarks.md)
RECOVERY_PRIOR = 0.2
MULTIPLIER_BOUNDS = (0.25, 20.0)  # the fitted multiplicative term, so two close rounds cannot swing it wildly


def paired_interval(base_ok: Sequence[bool], trial_ok: Sequence[bool]) -> tuple[float, float, float]:
    """Return (loss, low, high) in pp of a trial against the baseline, paired per image (95% interval).

    Args:
        base_ok: Whether the baseline got each image right.
        trial_ok: Whether the trial model got the same image right.
    """
    n = len(base_ok)
    if n == 0 or n != len(trial_ok):
        raise ValueError(f"a paired interval needs the same images on both sides (got {n} and {len(trial_ok)})")
    b = sum(1 for x, y in zip(base_ok, trial_ok, strict=True) if x and not y)
    c = sum(1 for x, y in zip(base_ok, trial_ok, strict=True) if y and not x)
    b2, c2, n2 = b + 0.5, c + 0.5, n + 2.0
    centre = (b2 - c2) / n2
    var = max(0.0, ((b2 + c2) / n2 - centre * centre) / n2)
    half = Z95 * math.sqrt(var)
    return 100.0 * (b - c) / n, 100.0 * (centre - half), 100.0 * (centre + half)


def trial_interval(base_preds: Any, trial_preds: Any, labels: Any) -> tuple[float, float, float]:
    """Return `paired_interval` of two prediction tensors on the same labelled images."""
    base_ok = (base_preds == labels).tolist()
    trial_ok = (trial_preds == labels).tolist()
    return paired_interval(base_ok, trial_ok)


@dataclass(frozen=True)
class Correction:
    """measured ~= additive + multiplicative * predicted, fitted from earlier rounds (pp)."""

    additive: float = 0.0
    multiplicative: float = 1.0
    pairs: int = 0
    at_goal: float | None = None  # the (mean) goal of the rounds it was fitted on: the additive term scales below it

    def scale(self, goal: float | None) -> float:
        """Return the share of the additive term that applies at `goal` (1 at or above `at_goal`, or without goals)."""
        if goal is None or not self.at_goal or self.at_goal <= 0:
            return 1.0
        return min(1.0, max(0.0, float(goal) / self.at_goal))

    def __call__(self, predicted: float, goal: float | None = None) -> float:
        """Return the corrected loss of a loss predicted for a plan at `goal` (None: the additive term whole), pp."""
        return self.additive * self.scale(goal) + self.multiplicative * predicted

    def cap(self, budget: float, goal: float | None = None) -> float:
        """Return the largest uncorrected loss at `goal` whose corrected value stays within `budget`, pp."""
        return (budget - self.additive * self.scale(goal)) / self.multiplicative

    def as_list(self) -> list[float]:
        """Return [additive, multiplicative] as planner_meta.correction records them."""
        return [round(self.additive, 3), round(self.multiplicative, 3)]

    def describe(self) -> str:
        """Say the correction in words."""
        if not self.pairs:
            if abs(self.multiplicative - 1.0) > 1e-9:
                return f"no earlier round: the recovery prior {self.multiplicative:.2f}x"
            return "no earlier round to correct by"
        scaled = f" (scaled by the goal below {self.at_goal:.1%})" if self.at_goal else ""
        return (
            f"corrected by {self.pairs} earlier round(s): {self.additive:+.2f} pp{scaled} + {self.multiplicative:.2f}x"
        )


def fit_correction(
    pairs: Sequence[tuple[float, float]], goals: Sequence[float] | None = None, prior_slope: float = 1.0
) -> Correction:
    """Fit the correction from (predicted, measured) losses of earlier rounds, pp.

    None: the prior slope alone (1: no correction). One pair: the additive term beside the prior slope (measured -
    prior x predicted), so a prediction of zero is still corrected. Two or more: least squares of measured on
    predicted, the slope within MULTIPLIER_BOUNDS (the intercept refitted to it); predictions that do not differ fit
    the additive term beside the prior slope. `goals` (the rounds' goals, one per pair) set `at_goal`, their mean,
    below which the additive term shrinks with the goal.
    """
    if not pairs:
        return Correction(0.0, prior_slope)
    at_goal = sum(goals) / len(goals) if goals else None
    xs, ys = [float(p) for p, _ in pairs], [float(m) for _, m in pairs]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    if len(pairs) == 1 or sxx < 1e-9:
        return Correction(my - prior_slope * mx, prior_slope, len(pairs), at_goal)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    low, high = MULTIPLIER_BOUNDS
    slope = min(high, max(low, slope))
    return Correction(my - slope * mx, slope, len(pairs), at_goal)


def history_correction(history: Sequence[PastRound], prior_slope: float = 1.0) -> Correction:
    """Fit the correction from earlier rounds, its additive term scaled below their goals.

    Only rounds with a predicted and a measured loss count (a reviewer's rejection has none); the additive term is
    left unscaled when a counted round has no goal. `prior_slope`: `fit_correction`'s slope until two rounds differ.
    """
    pairs, goals = [], []
    for h in history:
        predicted, measured = h.predicted_drop, h.drop
        if predicted is not None and measured is not None and not h.rejected:
            pairs.append((float(predicted), float(measured)))
            goals.append(float(h.goal or 0.0))
    return fit_correction(pairs, goals if all(g > 0 for g in goals) else None, prior_slope)


def within_budget(interval_high: float, correction: Correction, budget: float, goal: float | None = None) -> bool:
    """Return True when the corrected upper end of a trial's interval (a plan at `goal`) stays within the budget."""
    return correction(interval_high, goal) <= budget + 1e-9


def beyond_budget(loss: float, low: float, high: float, budget: float) -> str:
    """Return why a recovered trial rejects its candidate ('' when it might still pass the budget).

    A candidate is rejected only when its whole interval lies beyond the budget: the full evaluation would not
    find it within the budget, so it is not carried there as if it might pass.
    """
    if low <= budget:
        return ""
    return (
        f"recovered trial lost {loss:.2f} pp on the trial slice (95% interval {low:.2f} to {high:.2f} pp), wholly "
        f"beyond the {budget:g} pp budget: not evaluated in full"
    )
