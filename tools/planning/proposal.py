"""The deterministic planner's plan offered to the LLM (the propose_plan tool), and what the LLM changed in it."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from profiling_agent.state import CompressionPlan, PlanningProblem, ProposalDiff, QuantEntry
from profiling_agent.tools.planning.deterministic import plan_round
from profiling_agent.tools.planning.ratio_solver import PlannerConfig, estimate_reduction, ratio_cap
from profiling_agent.tools.planning.token_plan import TokenOption, pruning_problem, to_total

Emphasis = Literal["balanced", "cost", "sensitivity"]
# the deterministic planner's sensitivity exponent per emphasis: ratios follow cost share / damage**gamma
EMPHASIS_GAMMA: dict[str, float] = {"balanced": 1.0, "cost": 0.5, "sensitivity": 2.0}
DEFAULT_LABEL = "A"  # the label of the deterministic proposal among the offered alternatives
GRID = 0.05  # proposal ratios are multiples of this (the schema-constrained answers' ratio grid)


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


def _grid(ratio: float, cap: float) -> float:
    return min(round(round(ratio / GRID) * GRID, 4), cap)


def propose(
    problem: PlanningProblem,
    goal: float,
    emphasis: str,
    quantization: list[QuantEntry],
    merging: TokenOption | None = None,
) -> tuple[dict[str, Any], Proposal]:
    """Return the deterministic planner's plan at `goal` in the exact-groups form a small model can edit.

    Ratios are rounded to the GRID (what a schema-constrained answer may write); groups sharing a ratio share an
    entry. The estimate is that of the rounded plan. With `merging` (a measured token row the deterministic round
    chose) the plan merges as it does and prunes what merging leaves of the goal (`token_plan.to_pruning`); the
    latency estimate is the total.

    Returns:
        (the plan as JSON-ready data, the Proposal record kept for the comparison).
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
    shared: dict[tuple[str, float], list[str]] = {}
    for row in rows:
        if row.name in ratios:
            shared.setdefault((row.kind, ratios[row.name]), []).append(row.name)
    pruning = [
        {"groups": names, "type": kind, "ratio": ratio, "justification": "deterministic proposal: cost share / damage"}
        for (kind, ratio), names in shared.items()
    ]
    quant = [q.model_dump() for q in quantization]
    estimate = {k: round(estimate_reduction(ratios, rows, k), 4) for k in ("params", "macs", "latency")}
    rationale = f"Deterministic proposal at goal {goal:.0%}."
    plan: dict[str, Any] = {"pruning": pruning, "quantization": quant, "rationale": rationale}
    if merging is not None:
        estimate["latency"] = round(to_total(estimate["latency"], merging.saved), 4)
        plan["tokens"] = merging.entry().model_dump()
        plan["rationale"] = f"{rationale} Token merging at {merging.label()}; pruning takes the rest of the goal."
    record = Proposal(
        goal=round(goal, 4), emphasis=emphasis, ratios=ratios, quantization=_quant_keys(quant), estimate=estimate
    )
    return plan, record


def _quant_keys(entries: list[dict[str, Any]]) -> list[str]:
    return sorted(f"{q.get('layer')} {q.get('dtype')}" for q in entries)


def compare_to_proposals(ratios: dict[str, float], plan: CompressionPlan, proposals: list[Proposal]) -> ProposalDiff:
    """Say what the applied plan changed relative to the closest proposal (fewest changes; ties: the latest).

    Args:
        ratios: The applied plan's ratio per group (the guard's resolution of its entries).
        plan: The applied plan (for its quantization entries).
        proposals: What propose_plan returned this step, in order.
    """
    if not proposals:
        return ProposalDiff(verdict="own", changes=len(ratios) + len(plan.quantization))
    quant = _quant_keys([q.model_dump() for q in plan.quantization])
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
        verdict: Literal["copied", "chosen", "edited", "own"] = (
            "copied" if n == 0 else "edited" if n <= max(1, len(prop.ratios)) else "own"
        )
        if verdict == "copied" and prop.label not in (None, DEFAULT_LABEL):
            verdict = "chosen"  # another offered alternative, taken as it was: a decision, not a copy
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
