"""Matched budgets: find the setting of a pruning method that removes a given fraction of the parameters."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

TOLERANCE = 0.01  # "the same budget": parameter reductions within one point of the target


@dataclass
class Matched:
    """The knob found for a target reduction, what it reaches, and whether that is within tolerance."""

    target: float
    knob: float
    reduction: float
    matched: bool
    tried: list[tuple[float, float]] = field(default_factory=list)  # (knob, reduction) in the order tried


def solve_knob(
    reduction_at: Callable[[float], float],
    target: float,
    lo: float,
    hi: float,
    *,
    tolerance: float = TOLERANCE,
    steps: int = 40,
) -> Matched:
    """Bisect a method's knob (a uniform ratio, a planner goal, a global fraction) so it removes `target`.

    `reduction_at(knob)` must not decrease as the knob grows (more pruning never removes fewer parameters). It
    is usually a step function (units are whole channels or heads), so the target may fall inside a jump: the
    closest reduction found is returned with `matched=False` when no knob reaches within `tolerance`.

    Args:
        reduction_at: Fraction of parameters the method removes at a knob value.
        target: Wanted fraction, in (0, 1).
        lo: Smallest knob (removes at most the target).
        hi: Largest knob tried.
        tolerance: Largest accepted |reduction - target|.
        steps: Most bisection steps.

    Returns:
        A Matched record: the knob whose reduction is closest to the target (ties: the smaller knob).
    """
    if not 0.0 < target < 1.0:
        raise ValueError(f"target reduction {target} must be in (0, 1)")
    if not lo < hi:
        raise ValueError(f"empty knob interval [{lo}, {hi}]")
    tried: list[tuple[float, float]] = []

    def at(knob: float) -> float:
        value = float(reduction_at(knob))
        tried.append((knob, value))
        return value

    best = (abs(at(hi) - target), hi)
    low, high = lo, hi
    for _ in range(steps):
        mid = (low + high) / 2
        value = at(mid)
        best = min(best, (abs(value - target), mid))
        if abs(value - target) <= tolerance / 4:  # well inside: stop early
            break
        if value < target:
            low = mid
        else:
            high = mid
        if high - low < 1e-6:
            break
    reduction = next(v for k, v in tried if k == best[1])
    return Matched(target, best[1], reduction, abs(reduction - target) <= tolerance, tried)
