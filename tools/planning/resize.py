"""A refused plan's own groups sized to the round's goal: what a repair offers a model that chose groups well.

A small model often names sensible groups at ratios far from the goal (a plan predicted to remove 18% against a
40% objective). The repair then shows the deterministic planner's ratios on the groups that plan named, checked by
the guard and measured by a trial where trials are cheap. Applied unchanged it is recorded as "resized": the groups
are the model's decision, the ratios the planner's.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass

from profiling_agent.state import PlannerProfile, PlanningProblem, QuantEntry
from profiling_agent.tools.planning.alternatives import cheap_trials, numbers_text, trial_loss
from profiling_agent.tools.planning.plan_guard import GuardConfig, check_plan
from profiling_agent.tools.planning.proposal import LLM_GROUPS, Proposal, ProposedPlan, propose
from profiling_agent.tools.planning.token_plan import TokenOption
from profiling_agent.tools.planning.trials import Evaluate

logger = logging.getLogger(__name__)

GOAL_SLACK = 0.005  # a plan predicted this close under the goal reaches it (the ratio grid's rounding)
RESIZED_NAME = "its refused plan's groups, sized to the goal"  # the record's words for the offer


@dataclass
class Resized:
    """The refused plan's groups at the planner's ratios for the round's goal, with its predicted numbers."""

    plan: ProposedPlan
    record: Proposal
    loss_pp: float | None
    measured: str

    def text(self, target: str) -> str:
        """Return the repair's paragraph that shows this plan inline (one JSON line) with its numbers."""
        est, goal = self.record.estimate, self.record.goal
        numbers = numbers_text(est, target, self.loss_pp, self.measured)
        reach = (
            "at the ratios that reach this round's goal"
            if float(est.get(target, 0.0)) >= goal - GOAL_SLACK
            else f"at the ratios that come closest to this round's goal ({target} -{goal:.1%}) on those groups"
        )
        plan = json.dumps(self.plan.wire())  # one line: fewer tokens for a slow local server
        return f"The groups your plan named, {reach} ({numbers}); the guard accepts it:\n{plan}"


Resize = Callable[[dict[str, float]], "Resized | None"]  # the refused plan's ratio per group -> the offer


@dataclass
class ResizeInputs:
    """What a refused plan is resized against: the round's problem, goal, quantization, merging, guard and trials.

    Attributes:
        profile: The profile the guard checks the resized plan against.
        problem: The round's planning problem (all group rows); the resize keeps the refused plan's rows.
        goal: The round's goal (the deterministic planner's), as a fraction of the objective's target.
        quantization: The round's quantization entries (the deterministic plan's).
        merging: The token merging the deterministic plan installs (None: it merges nothing).
        guard: The guard of the final answer (its floor included): an offer it refuses is not shown.
        evaluate: The trial evaluator, or None.
        shown: The proposals already offered this step: a resize equal to one of them is not offered again.
    """

    profile: PlannerProfile
    problem: PlanningProblem
    goal: float
    quantization: list[QuantEntry]
    merging: TokenOption | None
    guard: GuardConfig
    evaluate: Evaluate | None
    shown: list[Proposal]


def resizer(inputs: ResizeInputs) -> Resize:
    """Build the function that sizes a refused plan's groups to the goal (None where nothing new can be offered)."""

    def resize(ratios: dict[str, float]) -> Resized | None:
        rows = [r for r in inputs.problem.rows if r.name in ratios]
        if not rows:
            return None
        try:
            problem = inputs.problem.model_copy(update={"rows": rows})
            plan, record = propose(problem, inputs.goal, "balanced", inputs.quantization, inputs.merging)
        except Exception:  # noqa: BLE001 - a plan that cannot be sized gets the repair without the offer
            logger.debug("refused plan not resized", exc_info=True)
            return None
        if not record.ratios or record.ratios == ratios or any(p.ratios == record.ratios for p in inputs.shown):
            return None  # nothing the model has not seen
        verdict = check_plan(plan.wire(), inputs.profile, inputs.guard)
        if not verdict.ok or verdict.plan is None:
            return None
        record = record.model_copy(update={"name": RESIZED_NAME, "origin": LLM_GROUPS})
        loss, measured = trial_loss(verdict.plan, inputs.evaluate, cheap_trials(inputs.profile))
        return Resized(plan, record, loss, measured)

    return resize
