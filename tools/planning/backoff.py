"""Back off the first round's plan before it is applied when a trial on the trial slice predicts collapse."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from profiling_agent.state import BackoffRecord, BackoffTrial, CompressionPlan, Trial

FIRST_ROUND_CAP_PP = (3.0, 8.0)  # the allowed trial drop (upper end of its interval): twice the budget, within these
BACKOFF_TRIALS = 4  # bisection steps after the first trial (each prunes a copy and scores the trial slice)


@dataclass
class Backoff:
    """The goal the first round keeps and the trials that chose it.

    Attributes:
        goal: The reduction goal to plan for (the planner's own goal when its plan passed the first trial).
        cap: Largest upper end of a trial's loss interval accepted, pp.
        trials: One record per trial: goal, trial-slice accuracy drop (`calib_drop_pp`, the recorded name),
            params reduction.
        intervals: Goal (as recorded) -> the paired 95% interval [low, high] of its trial's loss, pp.
    """

    goal: float
    cap: float
    trials: list[BackoffTrial] = field(default_factory=list)
    intervals: dict[float, list[float]] = field(default_factory=dict)

    @property
    def backed_off(self) -> bool:
        """Return True when the goal is below the planner's first one."""
        return bool(self.trials) and round(self.goal, 4) < self.trials[0].goal

    def loss_at(self, goal: float) -> float | None:
        """Return the trial-slice loss the trial at `goal` measured (rounded as recorded), or None."""
        return next((t.calib_drop_pp for t in self.trials if abs(t.goal - round(goal, 4)) < 1e-9), None)

    def to_record(self) -> BackoffRecord:
        """Return the back-off as planner_meta.backoff records it."""
        return BackoffRecord(cap_pp=self.cap, kept_goal=self.goal, trials=[t.model_copy() for t in self.trials])

    @classmethod
    def from_record(cls, record: BackoffRecord) -> Backoff:
        """Return the back-off an earlier candidate recorded."""
        return cls(goal=record.kept_goal, cap=record.cap_pp, trials=[t.model_copy() for t in record.trials])


def drop_cap(max_acc_drop: float) -> float:
    """Return the trial drop a first plan may show: twice the accuracy budget, clamped to FIRST_ROUND_CAP_PP.

    The first round's trials refit but do not distil, and no earlier round says how much recovery wins back, so the
    cap is looser than the budget; it applies to the upper end of the trial's interval (`error_model`).
    """
    low, high = FIRST_ROUND_CAP_PP
    return min(high, max(low, 2.0 * max_acc_drop))


def back_off(
    goal: float,
    plan_at: Callable[[float], CompressionPlan],
    trial: Callable[[CompressionPlan], Trial],
    cap: float,
    steps: int = BACKOFF_TRIALS,
) -> Backoff:
    """Find the largest goal up to `goal` whose plan's trial loss stays under `cap` pp at the upper end of its interval.

    The sensitivity probe prunes one group at a time, so it cannot see groups that fail together; one trial of
    the whole plan on the trial slice (validation images the model never trained on) can. The upper end of the
    trial's paired interval is judged, so a small slice or a lucky draw cannot pass a plan on a zero. When the
    planner's plan passes, it is kept unchanged; otherwise the goal is bisected below it, and the largest passing
    goal is kept (the smallest tried when none passes).

    Args:
        goal: The planner's goal for round 1 (a fractional reduction of the target).
        plan_at: Returns the planner's plan for a goal.
        trial: Prunes a fresh copy by a plan and returns its trial (its loss and interval).
        cap: Largest accepted upper end of a trial's loss interval, pp.
        steps: Bisection steps after the first trial.
    """
    out = Backoff(goal=goal, cap=cap)

    def run(g: float) -> bool:
        tried = trial(plan_at(g))
        drop, interval = float(tried.accuracy_drop_pp), tried.bounds()
        out.trials.append(
            BackoffTrial(goal=round(g, 4), calib_drop_pp=round(drop, 3), params_reduction=tried.params_reduction)
        )
        out.intervals[round(g, 4)] = interval
        return interval[1] <= cap

    if run(goal):
        return out
    low, high, passing = 0.0, goal, None
    for _ in range(steps):
        mid = (low + high) / 2
        if run(mid):
            low, passing = mid, mid
        else:
            high = mid
    out.goal = passing if passing is not None else high
    return out
