"""The deterministic planner's plan offered to the LLM (the propose_plan tool), and what the LLM changed in it."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from profiling_agent.state import CompressionPlan, PlanningProblem, ProposalDiff, PruneType, QuantEntry, TokenEntry
from profiling_agent.tools.planning.deterministic import plan_round
from profiling_agent.tools.planning.ratio_solver import PlannerConfig, estimate_reduction, ratio_cap
from profiling_agent.tools.planning.token_plan import TokenOption, pruning_problem, to_total

Emphasis = Literal["balanced", "cost", "sensitivity"]
# the deterministic planner's sensitivity exponent per emphasis: ratios follow cost share / damage**gamma
EMPHASIS_GAMMA: dict[str, float] = {"balanced": 1.0, "cost": 0.5, "sensitivity": 2.0}
DEFAULT_LABEL = "A"  # the label of the deterministic proposal among the offered alternatives
GRID = 0.05  # proposal ratios are multiples of this (the schema-constrained answers' ratio grid)
LLM_GROUPS = "llm-groups"  # a proposal's origin when its groups are the model's own (a refused plan, resized)


class Proposal(BaseModel):
    """One plan propose_plan returned: its goal, emphasis, per-group ratios and quantization."""

    model_config = ConfigDict(extra="forbid")

    goal: float = Field(description="Predicted reduction of the objective's target the proposal aims at.")
    emphasis: str = Field(description="balanced, cost or sensitivity.")
    ratios: dict[str, float] = Field(description="Ratio per group name.")
    quantization: list[str] = Field(default_factory=list, description="'layer dtype' per quantization entry.")
    estimate: dict[str, float] = Field(default_factory=dict, description="Predicted params/macs/latency reduction.")
    label: str | None = Field(default=None, description="The label it was offered under (A, B, ...), if any.")
    name: str = Field(default="", description="What an offered alternative is, in words.")
    origin: Literal["planner", "llm-groups"] = Field(
        default="planner", description="planner, or llm-groups: the model's refused plan's groups at planner ratios."
    )


class GroupsEntry(BaseModel):
    """A pruning entry that names exact groups (the form a small model edits; the guard expands it to regexes)."""

    model_config = ConfigDict(extra="forbid")

    groups: list[str] = Field(description="Group names from the profile.")
    type: PruneType = Field(description="structured, head or block (the groups' kind).")
    ratio: float = Field(description="The ratio every named group gets.")
    justification: str = Field(default="", description="Why.")


class ProposedPlan(BaseModel):
    """The deterministic planner's plan in the exact-groups form the LLM sees and may edit."""

    model_config = ConfigDict(extra="forbid")

    pruning: list[GroupsEntry] = Field(default_factory=list, description="One entry per (type, ratio).")
    quantization: list[QuantEntry] = Field(default_factory=list, description="The round's quantization entries.")
    rationale: str = Field(default="", description="One sentence on how it was made.")
    tokens: TokenEntry | None = Field(default=None, description="The token merging it installs (None: none).")

    def wire(self) -> dict[str, Any]:
        """Return the plan as the LLM reads it (JSON-ready; no "tokens" key when it merges nothing)."""
        data = self.model_dump()
        if self.tokens is None:
            del data["tokens"]
        return data


class ProposalAnswer(BaseModel):
    """What propose_plan answers: the goal, the emphasis, the predicted reduction and the plan."""

    model_config = ConfigDict(extra="forbid")

    goal: float = Field(description="The goal asked for (a fraction of the objective's target).")
    emphasis: str = Field(description="balanced, cost or sensitivity.")
    predicted_reduction: dict[str, float] = Field(description="Predicted params/macs/latency reduction.")
    plan: ProposedPlan = Field(description="The plan, exact groups.")

    def wire(self) -> dict[str, Any]:
        """Return the answer as the tool shows it (JSON-ready)."""
        return {**self.model_dump(exclude={"plan"}), "plan": self.plan.wire()}


Propose = Callable[[float, str], ProposalAnswer]  # propose_plan's function: (goal, emphasis) -> its answer


def _grid(ratio: float, cap: float) -> float:
    return min(round(round(ratio / GRID) * GRID, 4), cap)


def propose(
    problem: PlanningProblem,
    goal: float,
    emphasis: str,
    quantization: list[QuantEntry],
    merging: TokenOption | None = None,
) -> tuple[ProposedPlan, Proposal]:
    """Return the deterministic planner's plan at `goal` in the exact-groups form a small model can edit.

    Ratios are rounded to the GRID (what a schema-constrained answer may write); groups sharing a ratio share an
    entry. The estimate is that of the rounded plan. With `merging` (a measured token row the deterministic round
    chose) the plan merges as it does and prunes what merging leaves of the goal (`token_plan.to_pruning`); the
    latency estimate is the total.

    Returns:
        (the plan, exact groups, the Proposal record kept for the comparison).
    """
    config = PlannerConfig(gamma_start=EMPHASIS_GAMMA.get(emphasis, 1.0))
    objective, rows = problem.objective, problem.rows
    pruning_objective, _, pruning_goal = (
        pruning_problem(merging, objective, [], goal) if merging is not None else (objective, [], goal)
    )
    own = problem.model_copy(update={"objective": pruning_objective, "history": []})
    result = plan_round(own, config=config, goal=pruning_goal)
    by_module = {f"^{re.escape(r.module)}$": r for r in rows}
    ratios: dict[str, float] = {}
    for entry in result.plan.pruning:
        row = by_module.get(entry.layer)
        if row is None:
            continue
        ratio = _grid(entry.ratio, ratio_cap(row.kind, config))  # a block's cap is 1.0: removed whole
        if ratio > 0:
            ratios[row.name] = ratio
    shared: dict[tuple[PruneType, float], list[str]] = {}
    for row in rows:
        if row.name in ratios:
            shared.setdefault((row.kind, ratios[row.name]), []).append(row.name)
    why = "deterministic proposal: cost share / damage"
    pruning = [
        GroupsEntry(groups=names, type=kind, ratio=ratio, justification=why) for (kind, ratio), names in shared.items()
    ]
    estimate = {k: round(estimate_reduction(ratios, rows, k), 4) for k in ("params", "macs", "latency")}
    plan = ProposedPlan(
        pruning=pruning, quantization=list(quantization), rationale=f"Deterministic proposal at goal {goal:.0%}."
    )
    if merging is not None:
        estimate["latency"] = round(to_total(estimate["latency"], merging.saved), 4)
        plan.tokens = merging.entry()
        plan.rationale += f" Token merging at {merging.label()}; pruning takes the rest of the goal."
    record = Proposal(
        goal=round(goal, 4), emphasis=emphasis, ratios=ratios, quantization=_quant_keys(quantization), estimate=estimate
    )
    return plan, record


def _quant_keys(entries: list[QuantEntry]) -> list[str]:
    return sorted({f"{q.layer} {q.dtype}" for q in entries})  # an entry written twice quantizes once


def compare_to_proposals(ratios: dict[str, float], plan: CompressionPlan, proposals: list[Proposal]) -> ProposalDiff:
    """Say what the applied plan changed relative to the closest proposal (fewest changes; ties: the latest).

    Args:
        ratios: The applied plan's ratio per group (the guard's resolution of its entries).
        plan: The applied plan (for its quantization entries).
        proposals: What propose_plan returned this step, in order.
    """
    if not proposals:
        return ProposalDiff(verdict="own", changes=len(ratios) + len(plan.quantization))
    quant = _quant_keys(plan.quantization)
    best: ProposalDiff | None = None
    for prop in proposals:
        added = sorted(set(ratios) - set(prop.ratios))
        removed = sorted(set(prop.ratios) - set(ratios))
        changed = {
            g: [prop.ratios[g], ratios[g]]
            for g in sorted(set(ratios) & set(prop.ratios))
            if abs(prop.ratios[g] - ratios[g]) > 1e-6
        }
        q_change = "" if quant == prop.quantization else f"{', '.join(prop.quantization) or 'none'} -> "
        q_change += (", ".join(quant) or "none") if q_change else ""
        n = len(added) + len(removed) + len(changed) + (1 if q_change else 0)
        verdict: Literal["copied", "chosen", "resized", "edited", "own"] = (
            "copied" if n == 0 else "edited" if n <= max(1, len(prop.ratios)) else "own"
        )
        if verdict == "copied" and prop.label not in (None, DEFAULT_LABEL):
            verdict = "chosen"  # another offered alternative, taken as it was: a decision, not a copy
        elif verdict == "copied" and prop.origin == LLM_GROUPS:
            verdict = "resized"  # the model's own groups at the planner's ratios, taken as they were
        diff = ProposalDiff(
            verdict=verdict,
            changes=n,
            proposals=len(proposals),
            goal=prop.goal,
            emphasis=prop.emphasis,
            added=added,
            removed=removed,
            ratios=changed,
            quantization=q_change,
            choice=prop.label if verdict != "own" else None,
            alternative=(prop.name or None) if verdict != "own" else None,
        )
        if best is None or diff.changes <= best.changes:
            best = diff
    assert best is not None
    return best
