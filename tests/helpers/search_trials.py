"""Earlier rounds and synthetic trials for the search tests: a trial's loss a known function of its plan's goal."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from profiling_agent.state import CompressionPlan, PastRound, Trial


def history_round(goal: float, passed: bool, drop: float | None = None, predicted: float | None = None, **extra: Any):
    """An earlier round as `planner_history` gives it: goal, passed, validation loss and the trial's loss, pp."""
    return PastRound(goal=goal, passed=passed, drop=drop, predicted_drop=predicted, **extra)


def rounds(*rows: dict[str, Any]) -> list[PastRound]:
    """Earlier rounds as `planner_history` gives them, from their fields (the rest at their defaults)."""
    return [PastRound.model_validate(row) for row in rows]


def synthetic(true_drop: Callable[[float], float], half: float = 0.0):
    """(plan_at, trial, calls): a plan carries its goal in its rationale, its trial loses `true_drop(goal)` pp with
    an interval of +- `half`, and `calls` records each tried goal."""
    calls: list[float] = []

    def plan_at(goal: float) -> CompressionPlan:
        return CompressionPlan(rationale=str(goal))

    def trial(plan: CompressionPlan) -> Trial:
        goal = float(plan.rationale)
        calls.append(goal)
        drop = true_drop(goal)
        return Trial(accuracy_drop_pp=drop, interval_pp=[drop - half, drop + half])

    return plan_at, trial, calls
