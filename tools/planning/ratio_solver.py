"""The deterministic planner's ratio solver: per-group ratios from cost shares and probe damage, under caps."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from profiling_agent.state import GroupRow
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


def removed_blocks(ratios: dict[str, float], rows: Sequence[GroupRow]) -> set[str]:
    """Return the module names of the block groups that `ratios` removes."""
    return {
        r.module for r in rows if r.kind == "block" and effective_ratio(r.units, r.min_units, ratios.get(r.name, 0.0))
    }


def estimate_key(target: str) -> str:
    """Return the plan-estimate key that stands for an objective target (size is estimated by params)."""
    return {"params": "params", "macs": "macs", "latency": "latency", "size": "params"}[target]


def effective_ratio(units: int, min_units: int, ratio: float) -> float:
    """Return the fraction of units that pruning at `ratio` really removes (floor, keeping min_units)."""
    if units <= 0:
        return 0.0
    return removed_units(units, min_units, ratio) / units


def aligned_ratio(row: GroupRow, ratio: float, cap: float = 1.0, align: bool = True) -> float:
    """Return the ratio that prunes `row`'s group at about `ratio` (at most `cap`) and keeps whole channel blocks.

    A channel group's kept width is rounded to the nearest multiple of the runtimes' channel block
    (`units.unit_align`: 16 from 32 channels, 8 from 16; heads are whole already), one block more when the
    nearest would pass `cap`; the ratio is returned as removed / units, so the engine's floor removes exactly
    that many units and a pruned width never pays for a partly filled block. `align` False: whole units only.
    """
    if row.units <= 0:
        return 0.0
    block = unit_align(row.kind, row.units) if align else 1
    removed = removed_units(row.units, row.min_units, ratio, block)
    if removed > row.units * cap + 1e-9:
        removed = max(0, removed - block)
    return removed / row.units


def latency_gain(row: GroupRow, config: PlannerConfig) -> float:
    """Return the latency share pruning `row`'s group as far as the planner may saves, by its measured curve if any.

    The curve (the delivered form's node times at a few ratios) says what pruning really buys: on a small model at
    batch 1 narrower layers save little, and the group's node-time share would overstate it.
    """
    curve = row.latency_curve
    if curve is None or row.kind == "block":
        return row.latency_share
    return max(0.0, float(np_interp(ratio_cap(row.kind, config), curve.ratios, curve.saved_share)))


def group_weights(
    rows: Sequence[GroupRow], gamma: float, target: str = "params", config: PlannerConfig | None = None
) -> dict[str, float]:
    """Weight each group by cost / damage**gamma, normalized to mean 1 over the groups.

    The cost is half the latency share and half the MACs share; under a latency target it is what the group's
    pruning saves in the delivered form (`latency_gain`), the only cost that target counts.
    """
    config = config or PlannerConfig()
    raw: dict[str, float] = {}
    damages = [r.damage for r in rows]
    floor = max(1e-4, 0.05 * (sum(damages) / len(damages) if damages else 0.0))
    for row in rows:
        c = 0.5 * row.latency_share + 0.5 * row.macs_share or row.params_share or 1e-6
        if target == "latency":
            c = latency_gain(row, config) or 1e-6
        raw[row.name] = c / (row.damage + floor) ** gamma
    mean = sum(raw.values()) / len(raw) if raw else 1.0
    return {k: v / mean for k, v in raw.items()} if mean > 0 else dict.fromkeys(raw, 1.0)


def _ratios_at(
    level: float,
    rows: Sequence[GroupRow],
    weights: dict[str, float],
    config: PlannerConfig,
    fixed: dict[str, float] | None = None,
) -> dict[str, float]:
    out = {}
    for r in rows:
        if fixed is not None and r.name in fixed:
            out[r.name] = fixed[r.name]
            continue
        cap = ratio_cap(r.kind, config)
        out[r.name] = aligned_ratio(r, min(cap, level * weights[r.name]), cap, config.align_channels)
    return _limit_depth(out, rows, weights, config)


def _limit_depth(
    ratios: dict[str, float], rows: Sequence[GroupRow], weights: dict[str, float], config: PlannerConfig
) -> dict[str, float]:
    """Keep at most `max_block_fraction` of each stack's blocks removed (and one block): the highest weights stay."""
    stacks: dict[str, list[GroupRow]] = {}
    for r in rows:
        if r.kind == "block":
            stacks.setdefault(limit_key(r), []).append(r)
    limits = block_limits(rows, config.max_block_fraction)
    for stack, members in stacks.items():
        allowed = limits[stack]
        removed = [r for r in members if ratios.get(r.name, 0.0) >= 1.0]
        for r in sorted(removed, key=lambda r: (-weights[r.name], r.name))[max(0, allowed) :]:
            ratios[r.name] = 0.0
    return ratios


def estimate_reduction(ratios: dict[str, float], rows: Sequence[GroupRow], target: str) -> float:
    """Estimate the fractional reduction of `target` from per-group ratios and group cost shares."""
    key = estimate_key(target)
    total = 0.0
    gone = removed_blocks(ratios, rows)  # a removed block's cost counts once, through its block group
    for row in rows:
        if row.kind != "block" and row.block in gone:
            continue
        r = effective_ratio(row.units, row.min_units, ratios.get(row.name, 0.0))
        curve = row.latency_curve if key == "latency" else None
        if curve is not None:  # measured on the delivered backend at a few ratios (tools/profiling/latency_model.py)
            total += float(np_interp(r, curve.ratios, curve.saved_share))
        else:
            total += r * row.share(key)
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
    goal: float,
    rows: Sequence[GroupRow],
    weights: dict[str, float],
    target: str,
    config: PlannerConfig,
    fixed: dict[str, float] | None = None,
) -> tuple[dict[str, float], float]:
    """Bisect a common level so the estimated reduction reaches `goal`; return ratios and their estimate.

    `fixed` ({group: ratio}) holds some groups' ratios (the blocks depth pruning removes) out of the level.
    """
    lo, hi = 0.0, 1.0
    while estimate_reduction(_ratios_at(hi, rows, weights, config, fixed), rows, target) < goal and hi < 1e3:
        hi *= 2
    for _ in range(60):
        mid = (lo + hi) / 2
        if estimate_reduction(_ratios_at(mid, rows, weights, config, fixed), rows, target) >= goal:
            hi = mid
        else:
            lo = mid
    ratios = _ratios_at(hi, rows, weights, config, fixed)
    return ratios, estimate_reduction(ratios, rows, target)


def solve_below(
    ceiling: float,
    rows: Sequence[GroupRow],
    weights: dict[str, float],
    target: str,
    config: PlannerConfig,
    fixed: dict[str, float] | None = None,
) -> tuple[dict[str, float], float]:
    """Return the strongest ratios (common level) whose estimated reduction stays strictly below `ceiling`."""
    lo, hi = 0.0, 1.0
    while estimate_reduction(_ratios_at(hi, rows, weights, config, fixed), rows, target) < ceiling and hi < 1e3:
        hi *= 2
    for _ in range(60):
        mid = (lo + hi) / 2
        if estimate_reduction(_ratios_at(mid, rows, weights, config, fixed), rows, target) < ceiling:
            lo = mid
        else:
            hi = mid
    ratios = _ratios_at(lo, rows, weights, config, fixed)
    return ratios, estimate_reduction(ratios, rows, target)


def depth_first_blocks(
    goal: float, rows: Sequence[GroupRow], target: str, config: PlannerConfig, ceiling: float | None = None
) -> dict[str, float]:
    """`depth_plan.depth_first` with this planner's caps and estimate."""
    caps = {r.name: ratio_cap(r.kind, config) for r in rows if r.kind != "block"}
    return depth_first(
        goal,
        rows,
        caps,
        config.max_block_fraction,
        lambda ratios: estimate_reduction(ratios, rows, target),
        ceiling,
    )


def max_feasible(rows: Sequence[GroupRow], target: str, config: PlannerConfig) -> float:
    """Return the largest reduction the ratio caps allow."""
    caps = {r.name: ratio_cap(r.kind, config) for r in rows}
    aligned = {r.name: aligned_ratio(r, caps[r.name], caps[r.name], config.align_channels) for r in rows}
    weights = {r.name: r.share(estimate_key(target)) for r in rows}
    return estimate_reduction(_limit_depth(aligned, rows, weights, config), rows, target)
