"""Token merging in the deterministic plan: which measured rate to weigh, and how it composes with pruning.

The run's token axis (`state.TokenAxis`) holds the planned form's latency at a few merging rates and each paying
rate's trial-slice loss. Under a latency target the planner weighs the rate that saves the most latency per point
lost (`token_option`) against pruning alone: round 1 tries both plans at the same goal on the trial slice and keeps
the one that loses less (`weigh`). Merging shrinks every transformer layer's tokens and pruning their widths, so the
two compose roughly multiplicatively: a plan that merges at a rate saving `s` of the latency reaches a total goal `g`
by pruning for `1 - (1 - g) / (1 - s)` (`to_pruning`), and the planner's goals, history and estimate stay in total
terms. Later rounds keep round 1's choice (`run_option`), so the search moves the pruning alone. Without a token axis
or a latency target nothing changes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from profiling_agent.state import (
    Candidate,
    CompressionPlan,
    Objective,
    PastRound,
    TokenAxis,
    TokenChoice,
    TokenEntry,
    TokenRate,
    Trial,
)

TOKEN_BUDGET_SHARE = 0.5  # a rate whose merged baseline alone loses more than half the accuracy budget is not weighed


@dataclass(frozen=True)
class TokenOption:
    """A measured merging row the planner may add to its plan: a uniform rate or a front-loaded schedule."""

    rate: int | None  # None: the schedule below (a front-loaded row)
    saved: float  # share of the planned form's latency it saved at the run's batch
    drop_pp: float  # the merged baseline's trial-slice loss, pp
    form: str  # the form it was timed on
    schedule: tuple[int, ...] = ()  # a front-loaded row's r per layer (empty for a uniform rate)

    @classmethod
    def of(cls, row: TokenRate, form: str) -> TokenOption:
        """Return the option of a measured row of the token axis."""
        schedule = tuple(row.schedule) if row.rate is None else ()
        return cls(row.rate, row.saved_share, float(row.drop_pp or 0.0), form, schedule)

    def entry(self) -> TokenEntry:
        """Return the plan entry that installs this option: its rate, or its schedule, with the justification."""
        return self._bare().model_copy(update={"justification": self.justification()})

    def label(self) -> str:
        """Return the option in a few words, as its plan entry says it: "rate 8" or "schedule [16, 8, 0, 0]"."""
        return self._bare().label()

    def _bare(self) -> TokenEntry:
        return TokenEntry(rate=self.rate) if self.rate is not None else TokenEntry(schedule=list(self.schedule))

    def justification(self) -> str:
        """Say why the entry is in the plan, from the measurements."""
        return (
            f"{self.label()} saved {self.saved:.1%} of {self.form}'s latency at batch 1 and lost "
            f"{self.drop_pp:.2f} pp on the trial slice before pruning"
        )


def to_pruning(goal: float, saved: float) -> float:
    """Return the reduction pruning must reach so that, with merging saving `saved`, the total is `goal`."""
    return max(0.0, 1.0 - (1.0 - goal) / (1.0 - saved))


def to_total(pruning: float, saved: float) -> float:
    """Return the total reduction of pruning by `pruning` on top of merging that saves `saved`."""
    return 1.0 - (1.0 - saved) * (1.0 - pruning)


def token_option(axis: TokenAxis | None, objective: Objective) -> TokenOption | None:
    """Return the row to weigh against pruning: the paying one that saves the most latency per point lost.

    Uniform rates and front-loaded schedules alike. Only under a latency target, among the rows that pay on the
    planned form (`TokenAxis.paying`), save less than the target (pruning still has a share), and lose at most
    `TOKEN_BUDGET_SHARE` of the accuracy budget alone, or one image of the trial slice where that is more (its
    resolution: under a 1 pp budget half of it is less than one image of 128, so a row losing one image would be
    refused as if it had lost many; round 1's weighing trial is what keeps or drops it). A loss is counted as at
    least one image, too. None when no row qualifies.
    """
    if axis is None or objective.target != "latency":
        return None
    floor = 100.0 / max(1, axis.images)
    budget = max(TOKEN_BUDGET_SHARE * objective.max_acc_drop, floor)
    rows = [
        r for r in axis.paying() if 0 < r.saved_share < objective.target_reduction and float(r.drop_pp or 0.0) <= budget
    ]
    if not rows:
        return None
    best = max(rows, key=lambda r: (r.saved_share / max(float(r.drop_pp or 0.0), floor), r.saved_share))
    return TokenOption.of(best, axis.form)


def run_option(axis: TokenAxis | None, own: Sequence[Candidate]) -> TokenOption | None:
    """Return the row the deterministic sequence's first round chose (later rounds keep it), or None."""
    return fallback_option(axis, own[0].plan.tokens if own else None)


def fallback_option(axis: TokenAxis | None, entry: TokenEntry | None) -> TokenOption | None:
    """Return the measured row a plan's token entry names (the deterministic round's choice), or None."""
    if entry is None or axis is None:
        return None
    row = axis.row_for(entry.rate, entry.schedule)
    return None if row is None else TokenOption.of(row, axis.form)


def pruning_problem(
    option: TokenOption, objective: Objective, history: Sequence[PastRound], goal: float | None
) -> tuple[Objective, list[PastRound], float | None]:
    """Return the objective, history and goal of the pruning that completes a merging plan (in pruning terms)."""
    s = option.saved
    target = to_pruning(objective.target_reduction, s)
    pruning_objective = objective.model_copy(update={"target_reduction": min(max(target, 1e-3), 0.99)})
    moved = [h.model_copy(update={"goal": to_pruning(float(h.goal), s)}) for h in history]
    return pruning_objective, moved, None if goal is None else to_pruning(goal, s)


def with_tokens(plan: CompressionPlan, option: TokenOption, pruning_estimate: float) -> float:
    """Add the token entry to `plan` (in place) and say so in its rationale; return the plan's total estimate."""
    total = to_total(pruning_estimate, option.saved)
    plan.tokens = option.entry()
    plan.rationale += (
        f" Token merging at {option.label()} ({option.saved:.1%} of the latency measured on {option.form}) composes "
        f"with pruning's {pruning_estimate:.1%}: {total:.1%} in all (the pruning's goals above are what merging "
        "leaves of the run's)."
    )
    return total


def weigh(
    option: TokenOption,
    merged: CompressionPlan,
    unmerged: CompressionPlan,
    evaluate: Callable[[CompressionPlan], Trial],
) -> TokenChoice:
    """Try both round-1 plans (with and without merging, same total goal) on the trial slice; say which to keep.

    The merging plan is kept when it loses no more than the plan that prunes alone (a tie goes to merging: its
    latency was measured to pay, pruning's is the model's estimate).
    """
    with_pp = float(evaluate(merged).accuracy_drop_pp)
    without_pp = float(evaluate(unmerged).accuracy_drop_pp)
    chosen = with_pp <= without_pp
    why = (
        f"merging at {option.label()} and pruning less lost {with_pp:.2f} pp on the trial slice, pruning alone "
        f"{without_pp:.2f} pp: {'merging' if chosen else 'pruning alone'} kept"
    )
    return TokenChoice(
        rate=option.rate,
        schedule=None if option.rate is not None else list(option.schedule),
        saved_share=option.saved,
        drop_pp=option.drop_pp,
        with_pp=round(with_pp, 3),
        without_pp=round(without_pp, 3),
        chosen=chosen,
        why=why,
    )
