"""Deterministic planner: pruning ratios from profiled cost and probed sensitivity, refined by feedback."""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from profiling_agent.state import CompressionPlan, GroupRow, Objective, PastRound, PlanningProblem, PruneEntry
from profiling_agent.tools.planning.depth_plan import backed_off_blocks, depth_secant
from profiling_agent.tools.planning.quant_plan import quant_entries, slowed_round
from profiling_agent.tools.planning.ratio_solver import (
    PlannerConfig,
    depth_first_blocks,
    effective_ratio,
    estimate_reduction,
    group_weights,
    max_feasible,
    removed_blocks,
    solve_below,
    solve_ratios,
)


@dataclass
class PlanResult:
    """A plan plus the planner's bookkeeping for the next round."""

    plan: CompressionPlan
    planner: str
    target_estimate: float  # estimated fractional reduction of the objective's target
    gamma: float
    converged: bool = False
    notes: list[str] = field(default_factory=list)
    predicted_pp: float | None = None  # the plan's trial-slice loss when the round measured it, pp


def ceiling_of(history: Sequence[PastRound]) -> float | None:
    """Return the smallest goal a reviewer rejected or that missed the budget above every passing goal, or None.

    Units are whole heads and channels, so nearby goals can give the same plan: a round below this ceiling must
    also estimate below it, or it would measure the plan that was refused again.
    """
    rejected = [h.goal for h in history if h.rejected]
    passes = [h.goal for h in history if h.passed and h.goal < min(rejected, default=float("inf"))]
    lo = max(passes, default=0.0)
    above = [h.goal for h in history if not h.passed and h.goal > lo]
    return min(above + rejected) if above or rejected else None


def next_goal(
    history: Sequence[PastRound], objective: Objective, feasible: float, config: PlannerConfig
) -> tuple[float, float, bool, str]:
    """Choose this round's goal and gamma from earlier rounds; return (goal, gamma, converged, why)."""
    if not history:  # a small margin: the estimate ignores biases and norms, which are not pruned
        goal = min(objective.target_reduction + config.first_margin, feasible)
        if feasible < objective.target_reduction:
            return (
                goal,
                config.gamma_start,
                False,
                (
                    f"round 1 aims at {goal:.1%}, the largest {objective.target} reduction the ratio caps allow in the "
                    f"profile the planner reads: the {objective.target_reduction:.0%} target cannot be reached"
                ),
            )
        return goal, config.gamma_start, False, f"round 1 aims at the objective's {goal:.0%} reduction"
    passes = [h.goal for h in history if h.passed]
    fails = [h.goal for h in history if not h.passed]
    rejected = [h.goal for h in history if h.rejected]
    if rejected:  # a reviewer's "no" caps the search, even at a level that kept the accuracy budget
        passes = [p for p in passes if p < min(rejected)]
    last = history[-1]
    step = config.gamma_step_down if last.passed else -config.gamma_step_up
    last_gamma = config.gamma_start if last.gamma is None else last.gamma  # a round no deterministic plan made
    gamma = min(config.gamma_max, max(config.gamma_min, last_gamma - step))
    lo = max(passes, default=0.0)
    above = [f for f in fails if f > lo]
    if above:
        hi = min(above)
        if hi - lo < config.converge_tol:
            return lo, gamma, True, f"search interval [{lo:.1%}, {hi:.1%}] is below tolerance"
        goal = (lo + hi) / 2
        why = f"bisecting between {lo:.1%} (kept the budget) and {hi:.1%} (missed it)"
    else:
        goal = min(feasible, max(lo * config.growth, lo + 0.05))
        if goal - lo < config.converge_tol:
            return lo, gamma, True, f"already at the largest feasible reduction {feasible:.1%}"
        why = f"every round kept the budget: pushing from {lo:.1%} to {goal:.1%}"
    if not passes and fails:
        scaled = depth_secant(history, objective.max_acc_drop)
        if scaled is not None and scaled < goal:
            goal, how = scaled, f" with blocks: its loss scales the goal to {scaled:.1%}"
        else:
            how = f": trying {goal:.1%}"
        why = f"backing off from {min(fails):.1%}, which missed the budget{how}"
    return goal, gamma, False, why


def _justify(row: GroupRow, rank: int, n: int, ratio: float) -> str:
    removed = round(effective_ratio(row.units, row.min_units, ratio) * row.units)
    shares = (
        f"{row.name}: {row.latency_share:.1%} of latency, {row.macs_share:.1%} of MACs, "
        f"{row.params_share:.1%} of params; "
    )
    damage = f"probe damage {row.damage:.3g} (rank {rank}/{n}, 1 = least sensitive)"
    if row.kind == "block":
        return f"{shares}removing the whole block costs {damage}"
    what = "heads" if row.kind == "head" else "channels"
    return f"{shares}{damage}; removes {removed} of {row.units} {what}"


@dataclass(frozen=True)
class Steering:
    """What a caller imposes on a round beyond its goal.

    Attributes:
        reason: Why the goal was chosen, for the rationale (a searching round's choice or trial); None: a first
            round backing off.
        blocks: The block groups a latency plan removes (a trial of another set, `block_trials`), instead of the
            ones it would choose; width fills the rest of the goal as usual.
    """

    reason: str | None = None
    blocks: Sequence[str] | None = None


@dataclass
class Aim:
    """The goal a round plans for, the gamma it weighs damage with, and why (`aim_round`)."""

    goal: float
    gamma: float
    converged: bool
    why: str
    repeat_of: PastRound | None = None  # the earlier round whose pruning this one repeats without quantization


def aim_round(
    p: PlanningProblem, config: PlannerConfig, feasible: float, goal: float | None, reason: str | None
) -> Aim:
    """Choose the round's goal: the history's next one, a caller's (backing off, searching), or a repeat."""
    history, objective = p.history, p.objective
    chosen, gamma, converged, why = next_goal(history, objective, feasible, config)
    if goal is not None and reason is not None:
        why, converged = reason, False
    elif goal is not None and goal < chosen:
        why = f"backing off from {chosen:.1%} to {goal:.1%}: a trial of that plan on the calibration images collapsed"
    aim = Aim(chosen if goal is None else min(goal, feasible), gamma, converged, why)
    last = history[-1] if history else None
    if last and last.passed and objective.target != "size" and slowed_round(history) is last:
        # the last plan kept the budget but its quantization cost speed: same pruning, quantization dropped
        aim = Aim(last.goal, gamma if last.gamma is None else last.gamma, False, "", repeat_of=last)
        aim.why = f"repeating round {last.iteration or '?'}'s pruning, which kept the budget, without quantization"
    return aim


def fixed_blocks(
    p: PlanningProblem, config: PlannerConfig, aim: Aim, blocks: Sequence[str] | None, ceiling: float | None
) -> dict[str, float] | None:
    """Return the block groups a latency plan removes (1.0) or keeps (0.0), or None without depth pruning."""
    rows, target = p.rows, p.objective.target
    if not (target == "latency" and any(r.kind == "block" for r in rows)):
        return None
    fixed = None
    if blocks is not None:  # the given set, not one carried back from earlier rounds
        fixed = {r.name: float(r.name in blocks) for r in rows if r.kind == "block"}
    elif aim.repeat_of is None:
        estimate_of = functools.partial(estimate_reduction, rows=rows, target=target)
        limit = config.max_block_fraction
        fixed, note = backed_off_blocks(p.history, aim.goal, rows, limit, estimate_of, ceiling)
        aim.why += f"; {note}" if note else ""
    if fixed is None:
        fixed = depth_first_blocks(aim.goal, rows, target, config)
    return fixed


def solve_round(p: PlanningProblem, config: PlannerConfig, aim: Aim, blocks: Sequence[str] | None) -> dict[str, float]:
    """Solve the groups' ratios for the aim; below the ceiling of a refused plan, converging when nothing fits."""
    rows, target = p.rows, p.objective.target
    weights = group_weights(rows, aim.gamma, target, config)
    ceiling = ceiling_of(p.history) if aim.repeat_of is None else None
    fixed = fixed_blocks(p, config, aim, blocks, ceiling)
    ratios, estimate = solve_ratios(aim.goal, rows, weights, target, config, fixed)
    if ceiling is not None and estimate >= ceiling - 1e-9:  # whole units rounded back up to a refused plan
        if target == "latency" and any(r.kind == "block" for r in rows):
            fixed = depth_first_blocks(aim.goal, rows, target, config, ceiling - 1e-9)
        ratios, estimate = solve_below(ceiling - 1e-9, rows, weights, target, config, fixed)
        kept = max((h.goal for h in p.history if h.passed and h.goal < ceiling), default=0.0)
        if kept > 0 and estimate <= kept + 1e-9:
            aim.converged = True
            aim.why = f"no plan of whole heads and channels lies between {kept:.1%} (kept the budget) and {ceiling:.1%}"
    return ratios


def emitted_ratio(row: GroupRow, solved: float) -> float | None:
    """Return the ratio a plan entry writes for a group's solved ratio, or None when it removes nothing."""
    if row.kind == "block":
        return 1.0 if solved >= 1.0 else None  # a block is removed whole
    units, min_units = row.units, row.min_units
    ratio = math.ceil(solved * 1e4) / 1e4  # four decimals, rounded to keep exactly the solved whole units
    if effective_ratio(units, min_units, ratio) != effective_ratio(units, min_units, solved):
        ratio = math.floor(solved * 1e4) / 1e4
    if effective_ratio(units, min_units, ratio) <= 0:
        return None
    return min(max(ratio, 1e-4), 0.99)


def plan_entries(rows: Sequence[GroupRow], ratios: dict[str, float]) -> tuple[list[PruneEntry], dict[str, float]]:
    """Return the plan's pruning entries (exact module names) and the ratio each pruned group got."""
    order = sorted(rows, key=lambda r: r.damage)
    rank = {r.name: i + 1 for i, r in enumerate(order)}
    entries, emitted = [], {}
    gone = removed_blocks(ratios, rows)
    for row in rows:
        if row.kind != "block" and row.block in gone:
            continue  # moot: its block is removed
        ratio = emitted_ratio(row, ratios[row.name])
        if ratio is None:
            continue
        emitted[row.name] = ratio
        justification = _justify(row, rank[row.name], len(rows), ratio)
        entries.append(
            PruneEntry(layer=f"^{re.escape(row.module)}$", type=row.kind, ratio=ratio, justification=justification)
        )
    return entries, emitted


def plan_round(
    problem: PlanningProblem,
    config: PlannerConfig | None = None,
    goal: float | None = None,
    steer: Steering | None = None,
) -> PlanResult:
    """Plan one round.

    Args:
        problem: The round's groups (`GroupRow`: kind, units, cost shares, probe damage), the objective and the
            earlier rounds (`PastRound`: `goal`, `gamma`, `passed`, i.e. kept the accuracy budget, and, when the
            round was quantized, `quant_speedup`/`quant_speedup_batch` (pruned fp32 latency / quantized)).
        config: Planner bounds.
        goal: Plan for this reduction instead of the one the history suggests (a first round backing off, or a
            searching round's choice).
        steer: Why `goal` was chosen, and the blocks to remove instead of the planner's own (`Steering`).

    Returns:
        The plan (valid by construction), the estimated reduction and the gamma used.
    """
    config = config or PlannerConfig()
    steer = steer or Steering()
    rows, objective, history = problem.rows, problem.objective, problem.history
    if not rows:
        quant, _ = quant_entries(objective.quantize, history, objective.target)
        plan = CompressionPlan(
            pruning=[],
            quantization=quant,
            rationale="The family adapter found no prunable groups; only quantization applies.",
        )
        return PlanResult(plan, "deterministic", 0.0, config.gamma_start, converged=bool(history))
    feasible = max_feasible(rows, objective.target, config)
    aim = aim_round(problem, config, feasible, goal, steer.reason)
    entries, emitted = plan_entries(rows, solve_round(problem, config, aim, steer.blocks))
    estimate = estimate_reduction(emitted, rows, objective.target)
    if aim.repeat_of is not None:  # the same plan: keep its goal exactly, so the search sees one point, not two
        estimate = aim.repeat_of.goal
    rationale = (
        f"Deterministic planner: {aim.why}. Ratios follow cost share / probe damage^{aim.gamma:.2f} with a common "
        f"level chosen so the estimated {objective.target} reduction is {estimate:.1%} (largest feasible "
        f"{feasible:.1%}); {len(entries)} of {len(rows)} groups pruned."
    )
    quant, quant_note = quant_entries(objective.quantize, history, objective.target)
    if quant_note:
        rationale += f" Note: {quant_note}."
    plan = CompressionPlan(pruning=entries, quantization=quant, rationale=rationale)
    return PlanResult(plan, "deterministic", estimate, aim.gamma, converged=aim.converged, notes=[aim.why])
