"""Deterministic planner: pruning ratios from profiled cost and probed sensitivity, refined by feedback."""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from profiling_agent.state import CompressionPlan, Objective, PruneEntry
from profiling_agent.tools.compression.depth import MAX_BLOCK_FRACTION, block_limits, limit_key
from profiling_agent.tools.compression.units import removed_units, unit_align
from profiling_agent.tools.planning.depth_plan import backed_off_blocks, depth_first, depth_secant
from profiling_agent.tools.planning.quant_plan import quant_entries, slowed_round


@dataclass
class PlannerConfig:
    """Bounds of the deterministic planner."""

    max_ratio_structured: float = 0.8  # never remove more than 80% of a group's channels
    max_ratio_head: float = 0.75  # never remove more than 3 of 4 heads
    max_block_fraction: float = MAX_BLOCK_FRACTION  # depth pruning removes at most half the blocks of a stack
    gamma_start: float = 1.0  # sensitivity exponent in round 1
    gamma_step_up: float = 0.5  # after a candidate missed the budget
    gamma_step_down: float = 0.25  # after a candidate kept the budget
    gamma_min: float = 0.5
    gamma_max: float = 3.0
    growth: float = 1.35  # scale of the target when nothing has failed yet
    converge_tol: float = 0.01  # stop when the search interval is narrower than this
    first_margin: float = 0.02  # round 1 aims this far past the target reduction
    # kept widths in whole channel blocks (`aligned_ratio`); bench/matched_budgets.py turns it off to compare where
    # each method puts the same exact budget (the uniform and global peers are not rounded either)
    align_channels: bool = True


@dataclass
class PlanResult:
    """A plan plus the planner's bookkeeping for the next round."""

    plan: CompressionPlan
    planner: str
    target_estimate: float  # estimated fractional reduction of the objective's target
    gamma: float
    converged: bool = False
    notes: list[str] = field(default_factory=list)


class RatioCaps(Protocol):
    """The per-kind ratio bounds a planner or the guard holds (PlannerConfig, GuardConfig)."""

    max_ratio_structured: float
    max_ratio_head: float


def ratio_cap(kind: str, config: RatioCaps) -> float:
    """Return the largest ratio of a group of `kind` (a block is removed whole: its cap, and only ratio, is 1.0)."""
    return {"head": config.max_ratio_head, "block": 1.0}.get(kind, config.max_ratio_structured)


def removed_blocks(ratios: dict[str, float], groups: list[dict[str, Any]]) -> set[str]:
    """Return the module names of the block groups that `ratios` removes."""
    return {
        str(g["module"])
        for g in groups
        if g.get("kind") == "block"
        and effective_ratio(int(g["units"]), int(g.get("min_units", 0)), ratios.get(g["name"], 0.0))
    }


def group_share(cost: dict[str, Any], key: str) -> float:
    """Return a group's `<key>_share` from its cost row (0 when absent)."""
    return float(cost.get(f"{key}_share", 0.0) or 0.0)


def estimate_key(target: str) -> str:
    """Return the plan-estimate key that stands for an objective target (size is estimated by params)."""
    return {"params": "params", "macs": "macs", "latency": "latency", "size": "params"}[target]


def effective_ratio(units: int, min_units: int, ratio: float) -> float:
    """Return the fraction of units that pruning at `ratio` really removes (floor, keeping min_units)."""
    if units <= 0:
        return 0.0
    return removed_units(units, min_units, ratio) / units


def aligned_ratio(group: dict[str, Any], ratio: float, cap: float = 1.0, align: bool = True) -> float:
    """Return the ratio that prunes `group` at about `ratio` (at most `cap`) and keeps whole channel blocks.

    A channel group's kept width is rounded to the nearest multiple of the runtimes' channel block
    (`units.unit_align`: 16 from 32 channels, 8 from 16; heads are whole already), one block more when the
    nearest would pass `cap`; the ratio is returned as removed / units, so the engine's floor removes exactly
    that many units and a pruned width never pays for a partly filled block. `align` False: whole units only.
    """
    units, min_units = int(group["units"]), int(group.get("min_units", 1))
    if units <= 0:
        return 0.0
    block = unit_align(str(group.get("kind", "structured")), units) if align else 1
    removed = removed_units(units, min_units, ratio, block)
    if removed > units * cap + 1e-9:
        removed = max(0, removed - block)
    return removed / units


def latency_gain(group: dict[str, Any], cost: dict[str, Any], config: PlannerConfig) -> float:
    """Return the latency share pruning `group` as far as the planner may saves, by its measured curve if any.

    The curve (the delivered form's node times at a few ratios) says what pruning really buys: on a small model at
    batch 1 narrower layers save little, and the group's node-time share would overstate it.
    """
    curve = cost.get("latency_curve")
    if not curve or group["kind"] == "block":
        return group_share(cost, "latency")
    return max(0.0, float(np_interp(ratio_cap(group["kind"], config), curve["ratios"], curve["saved_share"])))


def group_weights(
    groups: list[dict[str, Any]],
    costs: dict[str, dict[str, Any]],
    sensitivity: dict[str, dict[str, Any]],
    gamma: float,
    target: str = "params",
    config: PlannerConfig | None = None,
) -> dict[str, float]:
    """Weight each group by cost / damage**gamma, normalized to mean 1 over the groups.

    The cost is half the latency share and half the MACs share; under a latency target it is what the group's
    pruning saves in the delivered form (`latency_gain`), the only cost that target counts.
    """
    config = config or PlannerConfig()
    raw: dict[str, float] = {}
    damages = [float(sensitivity.get(g["name"], {}).get("damage", 0.0)) for g in groups]
    floor = max(1e-4, 0.05 * (sum(damages) / len(damages) if damages else 0.0))
    for group in groups:
        cost = costs.get(group["name"], {})
        c = 0.5 * group_share(cost, "latency") + 0.5 * group_share(cost, "macs") or group_share(cost, "params") or 1e-6
        if target == "latency":
            c = latency_gain(group, cost, config) or 1e-6
        d = float(sensitivity.get(group["name"], {}).get("damage", 0.0)) + floor
        raw[group["name"]] = c / d**gamma
    mean = sum(raw.values()) / len(raw) if raw else 1.0
    return {k: v / mean for k, v in raw.items()} if mean > 0 else dict.fromkeys(raw, 1.0)


def _ratios_at(level: float, groups, weights, config: PlannerConfig, fixed=None) -> dict[str, float]:
    out = {}
    for g in groups:
        if fixed is not None and g["name"] in fixed:
            out[g["name"]] = fixed[g["name"]]
            continue
        cap = ratio_cap(g["kind"], config)
        out[g["name"]] = aligned_ratio(g, min(cap, level * weights[g["name"]]), cap, config.align_channels)
    return _limit_depth(out, groups, weights, config)


def _limit_depth(ratios: dict[str, float], groups, weights, config: PlannerConfig) -> dict[str, float]:
    """Keep at most `max_block_fraction` of each stack's blocks removed (and one block): the highest weights stay."""
    stacks: dict[str, list[dict[str, Any]]] = {}
    for g in groups:
        if g["kind"] == "block":
            stacks.setdefault(limit_key(g), []).append(g)
    limits = block_limits(groups, config.max_block_fraction)
    for stack, members in stacks.items():
        allowed = limits[stack]
        removed = [g for g in members if ratios.get(g["name"], 0.0) >= 1.0]
        for g in sorted(removed, key=lambda g: (-weights[g["name"]], g["name"]))[max(0, allowed) :]:
            ratios[g["name"]] = 0.0
    return ratios


def estimate_reduction(
    ratios: dict[str, float], groups: list[dict[str, Any]], costs: dict[str, dict[str, Any]], target: str
) -> float:
    """Estimate the fractional reduction of `target` from per-group ratios and group cost shares."""
    key = estimate_key(target)
    total = 0.0
    gone = removed_blocks(ratios, groups)  # a removed block's cost counts once, through its block group
    for g in groups:
        if g.get("kind") != "block" and g.get("block") in gone:
            continue
        r = effective_ratio(int(g["units"]), int(g.get("min_units", 1)), ratios.get(g["name"], 0.0))
        curve = costs.get(g["name"], {}).get("latency_curve") if key == "latency" else None
        if curve:  # measured on the delivered backend at a few ratios (tools/profiling/latency_model.py)
            total += float(np_interp(r, curve["ratios"], curve["saved_share"]))
        else:
            total += r * group_share(costs.get(g["name"], {}), key)
    return total


def np_interp(x: float, xs: list[float], ys: list[float]) -> float:
    """Interpolate linearly in (xs, ys), extending the last segment beyond the last point."""
    if x <= xs[0]:
        return ys[0]
    for i in range(1, len(xs)):
        if x <= xs[i] or i == len(xs) - 1:
            return ys[i - 1] + (ys[i] - ys[i - 1]) * (x - xs[i - 1]) / (xs[i] - xs[i - 1])
    return ys[-1]


def solve_ratios(
    goal: float, groups, costs, weights, target: str, config: PlannerConfig, fixed=None
) -> tuple[dict[str, float], float]:
    """Bisect a common level so the estimated reduction reaches `goal`; return ratios and their estimate.

    `fixed` ({group: ratio}) holds some groups' ratios (the blocks depth pruning removes) out of the level.
    """
    lo, hi = 0.0, 1.0
    while estimate_reduction(_ratios_at(hi, groups, weights, config, fixed), groups, costs, target) < goal and hi < 1e3:
        hi *= 2
    for _ in range(60):
        mid = (lo + hi) / 2
        if estimate_reduction(_ratios_at(mid, groups, weights, config, fixed), groups, costs, target) >= goal:
            hi = mid
        else:
            lo = mid
    ratios = _ratios_at(hi, groups, weights, config, fixed)
    return ratios, estimate_reduction(ratios, groups, costs, target)


def solve_below(
    ceiling: float, groups, costs, weights, target: str, config: PlannerConfig, fixed=None
) -> tuple[dict[str, float], float]:
    """Return the strongest ratios (common level) whose estimated reduction stays strictly below `ceiling`."""
    lo, hi = 0.0, 1.0
    while (
        estimate_reduction(_ratios_at(hi, groups, weights, config, fixed), groups, costs, target) < ceiling and hi < 1e3
    ):
        hi *= 2
    for _ in range(60):
        mid = (lo + hi) / 2
        if estimate_reduction(_ratios_at(mid, groups, weights, config, fixed), groups, costs, target) < ceiling:
            lo = mid
        else:
            hi = mid
    ratios = _ratios_at(lo, groups, weights, config, fixed)
    return ratios, estimate_reduction(ratios, groups, costs, target)


def depth_first_blocks(goal, groups, costs, sensitivity, target: str, config: PlannerConfig, ceiling=None):
    """`depth_plan.depth_first` with this planner's caps and estimate."""
    caps = {g["name"]: ratio_cap(g["kind"], config) for g in groups if g["kind"] != "block"}
    return depth_first(goal, groups, latency_shares(groups, costs), sensitivity, caps, config.max_block_fraction,
                       lambda ratios: estimate_reduction(ratios, groups, costs, target), ceiling)  # fmt: skip


def latency_shares(groups, costs) -> dict[str, float]:
    """Return each group's latency share (of the delivered backend's profile when the costs carry one)."""
    return {g["name"]: group_share(costs.get(g["name"], {}), "latency") for g in groups}


def ceiling_of(history: list[dict[str, Any]]) -> float | None:
    """Return the smallest goal a reviewer rejected or that missed the budget above every passing goal, or None.

    Units are whole heads and channels, so nearby goals can give the same plan: a round below this ceiling must
    also estimate below it, or it would measure the plan that was refused again.
    """
    rejected = [h["goal"] for h in history if h.get("rejected")]
    passes = [h["goal"] for h in history if h["passed"] and h["goal"] < min(rejected, default=float("inf"))]
    lo = max(passes, default=0.0)
    above = [h["goal"] for h in history if not h["passed"] and h["goal"] > lo]
    return min(above + rejected) if above or rejected else None


def max_feasible(groups, costs, target: str, config: PlannerConfig) -> float:
    """Return the largest reduction the ratio caps allow."""
    caps = {g["name"]: ratio_cap(g["kind"], config) for g in groups}
    aligned = {g["name"]: aligned_ratio(g, caps[g["name"]], caps[g["name"]], config.align_channels) for g in groups}
    weights = {g["name"]: float(group_share(costs.get(g["name"], {}), estimate_key(target))) for g in groups}
    return estimate_reduction(_limit_depth(aligned, groups, weights, config), groups, costs, target)


def next_goal(
    history: list[dict[str, Any]], objective: Objective, feasible: float, config: PlannerConfig
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
    passes = [h["goal"] for h in history if h["passed"]]
    fails = [h["goal"] for h in history if not h["passed"]]
    rejected = [h["goal"] for h in history if h.get("rejected")]
    if rejected:  # a reviewer's "no" caps the search, even at a level that kept the accuracy budget
        passes = [p for p in passes if p < min(rejected)]
    last = history[-1]
    step = config.gamma_step_down if last["passed"] else -config.gamma_step_up
    gamma = min(config.gamma_max, max(config.gamma_min, last["gamma"] - step))
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


def _justify(group: dict[str, Any], cost: dict[str, Any], sens: dict[str, Any], rank: int, n: int, ratio: float) -> str:
    units, min_units = int(group["units"]), int(group.get("min_units", 1))
    removed = round(effective_ratio(units, min_units, ratio) * units)
    shares = (
        f"{group['name']}: {group_share(cost, 'latency'):.1%} of latency, {group_share(cost, 'macs'):.1%} of MACs, "
        f"{group_share(cost, 'params'):.1%} of params; "
    )
    damage = f"probe damage {float(sens.get('damage', 0.0)):.3g} (rank {rank}/{n}, 1 = least sensitive)"
    if group["kind"] == "block":
        return f"{shares}removing the whole block costs {damage}"
    what = "heads" if group["kind"] == "head" else "channels"
    return f"{shares}{damage}; removes {removed} of {units} {what}"


def plan_round(
    groups: list[dict[str, Any]],
    costs: dict[str, dict[str, Any]],
    sensitivity: dict[str, dict[str, Any]],
    objective: Objective,
    history: list[dict[str, Any]],
    config: PlannerConfig | None = None,
    goal: float | None = None,
    reason: str | None = None,
    blocks: Sequence[str] | None = None,
) -> PlanResult:
    """Plan one round.

    Args:
        groups: Prunable groups as dicts (name, kind, module, units, min_units).
        costs: Per-group cost shares from the profile (`*_share` keys for params, macs, latency).
        sensitivity: Per-group probe results with a `damage` score (higher hurts more).
        objective: The run's objective.
        history: Earlier rounds as dicts with `goal`, `gamma`, `passed` (kept the accuracy budget) and, when
            the round was quantized, `quant_speedup`/`quant_speedup_batch` (pruned fp32 latency / quantized).
        config: Planner bounds.
        goal: Plan for this reduction instead of the one the history suggests (a first round backing off, or a
            searching round's choice).
        reason: Why `goal` was chosen, for the rationale (default: a first round backing off).
        blocks: The block groups a latency plan removes (a trial of another set, `block_trials`), instead of the
            ones it would choose; width fills the rest of the goal as usual.

    Returns:
        The plan (valid by construction), the estimated reduction and the gamma used.
    """
    config = config or PlannerConfig()
    if not groups:
        quant, _ = quant_entries(objective.quantize, history, objective.target)
        plan = CompressionPlan(
            pruning=[],
            quantization=quant,
            rationale="The family adapter found no prunable groups; only quantization applies.",
        )
        return PlanResult(plan, "deterministic", 0.0, config.gamma_start, converged=bool(history))
    feasible = max_feasible(groups, costs, objective.target, config)
    chosen, gamma, converged, why = next_goal(history, objective, feasible, config)
    if goal is not None and reason is not None:
        why, converged = reason, False
    elif goal is not None and goal < chosen:
        why = f"backing off from {chosen:.1%} to {goal:.1%}: a trial of that plan on the calibration images collapsed"
    goal = chosen if goal is None else min(goal, feasible)
    last = history[-1] if history else None
    repeat_of = None
    if last and last["passed"] and objective.target != "size" and slowed_round(history) is last:
        # the last plan kept the budget but its quantization cost speed: same pruning, quantization dropped
        goal, gamma, converged = last["goal"], last["gamma"], False
        repeat_of = last
        why = f"repeating round {last.get('iteration', '?')}'s pruning, which kept the budget, without quantization"
    weights = group_weights(groups, costs, sensitivity, gamma, objective.target, config)
    depth = objective.target == "latency" and any(g["kind"] == "block" for g in groups)
    ceiling = ceiling_of(history) if repeat_of is None else None
    fixed, note = None, ""
    if depth and blocks is not None:  # the given set, not one carried back from earlier rounds
        fixed = {g["name"]: float(g["name"] in blocks) for g in groups if g["kind"] == "block"}
    elif depth and repeat_of is None:
        estimate_of = functools.partial(estimate_reduction, groups=groups, costs=costs, target=objective.target)
        fixed, note = backed_off_blocks(history, goal, groups, latency_shares(groups, costs), sensitivity,
                                        config.max_block_fraction, estimate_of, ceiling)  # fmt: skip
        why += f"; {note}" if note else ""
    if depth and fixed is None:
        fixed = depth_first_blocks(goal, groups, costs, sensitivity, objective.target, config)
    ratios, estimate = solve_ratios(goal, groups, costs, weights, objective.target, config, fixed)
    if ceiling is not None and estimate >= ceiling - 1e-9:  # whole units rounded back up to a refused plan
        if depth:
            fixed = depth_first_blocks(goal, groups, costs, sensitivity, objective.target, config, ceiling - 1e-9)
        ratios, estimate = solve_below(ceiling - 1e-9, groups, costs, weights, objective.target, config, fixed)
        kept = max((h["goal"] for h in history if h["passed"] and h["goal"] < ceiling), default=0.0)
        if kept > 0 and estimate <= kept + 1e-9:
            converged = True
            why = f"no plan of whole heads and channels lies between {kept:.1%} (kept the budget) and {ceiling:.1%}"
    order = sorted(groups, key=lambda g: float(sensitivity.get(g["name"], {}).get("damage", 0.0)))
    rank = {g["name"]: i + 1 for i, g in enumerate(order)}
    entries = []
    emitted: dict[str, float] = {}
    gone = removed_blocks(ratios, groups)
    for group in groups:
        solved, units, min_units = ratios[group["name"]], int(group["units"]), int(group.get("min_units", 1))
        if group["kind"] != "block" and group.get("block") in gone:
            continue  # moot: its block is removed
        if group["kind"] == "block":
            if solved < 1.0:
                continue
            ratio = 1.0  # a block is removed whole
        else:
            ratio = math.ceil(solved * 1e4) / 1e4  # four decimals, rounded to keep exactly the solved whole units
            if effective_ratio(units, min_units, ratio) != effective_ratio(units, min_units, solved):
                ratio = math.floor(solved * 1e4) / 1e4
            if effective_ratio(units, min_units, ratio) <= 0:
                continue
            ratio = min(max(ratio, 1e-4), 0.99)
        emitted[group["name"]] = ratio
        entries.append(
            PruneEntry(
                layer=f"^{re.escape(group['module'])}$",
                type=group["kind"],
                ratio=ratio,
                justification=_justify(
                    group,
                    costs.get(group["name"], {}),
                    sensitivity.get(group["name"], {}),
                    rank[group["name"]],
                    len(groups),
                    ratio,
                ),
            )
        )
    estimate = estimate_reduction(emitted, groups, costs, objective.target)
    if repeat_of is not None:  # the same plan: keep its goal exactly, so the search sees one point, not two
        estimate = repeat_of["goal"]
    rationale = (
        f"Deterministic planner: {why}. Ratios follow cost share / probe damage^{gamma:.2f} with a common level "
        f"chosen so the estimated {objective.target} reduction is {estimate:.1%} (largest feasible "
        f"{feasible:.1%}); {len(entries)} of {len(groups)} groups pruned."
    )
    quant, quant_note = quant_entries(objective.quantize, history, objective.target)
    if quant_note:
        rationale += f" Note: {quant_note}."
    plan = CompressionPlan(pruning=entries, quantization=quant, rationale=rationale)
    return PlanResult(plan, "deterministic", estimate, gamma, converged=converged, notes=[why])
