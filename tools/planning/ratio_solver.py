"""The deterministic planner's ratio solver: per-group ratios from cost shares and probe damage, under caps."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from profiling_agent.tools.compression.depth import MAX_BLOCK_FRACTION, block_limits, limit_key
from profiling_agent.tools.compression.units import removed_units, unit_align
from profiling_agent.tools.planning.depth_plan import depth_first


@dataclass
class RatioCaps:
    """The ratio bounds every plan keeps, whoever wrote it: the deterministic planner and the LLM plans' guard.

    `PlannerConfig` and `plan_guard.GuardConfig` both extend this class, so the caps are defined once.
    """

    max_ratio_structured: float = 0.8  # never remove more than 80% of a group's channels (0.95 destroyed accuracy)
    max_ratio_head: float = 0.75  # never remove more than 3 of 4 heads
    max_block_fraction: float = MAX_BLOCK_FRACTION  # depth pruning removes at most this fraction of a stack's blocks


@dataclass
class PlannerConfig(RatioCaps):
    """Bounds and steps of the deterministic planner (its ratio caps: `RatioCaps`)."""

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
    shares, limit = latency_shares(groups, costs), config.max_block_fraction
    return depth_first(
        goal,
        groups,
        shares,
        sensitivity,
        caps,
        limit,
        lambda ratios: estimate_reduction(ratios, groups, costs, target),
        ceiling,
    )


def latency_shares(groups, costs) -> dict[str, float]:
    """Return each group's latency share (of the delivered backend's profile when the costs carry one)."""
    return {g["name"]: group_share(costs.get(g["name"], {}), "latency") for g in groups}


def max_feasible(groups, costs, target: str, config: PlannerConfig) -> float:
    """Return the largest reduction the ratio caps allow."""
    caps = {g["name"]: ratio_cap(g["kind"], config) for g in groups}
    aligned = {g["name"]: aligned_ratio(g, caps[g["name"]], caps[g["name"]], config.align_channels) for g in groups}
    weights = {g["name"]: float(group_share(costs.get(g["name"], {}), estimate_key(target))) for g in groups}
    return estimate_reduction(_limit_depth(aligned, groups, weights, config), groups, costs, target)
