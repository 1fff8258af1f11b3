"""Depth-first latency plans: which whole blocks a plan removes before channels and heads fill the rest."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from profiling_agent.state import GroupRow, PastRound
from profiling_agent.tools.compression.depth import block_limits, limit_key
from profiling_agent.tools.planning.search import AIM, line_goal


def depth_first(
    goal: float,
    rows: Sequence[GroupRow],
    caps: dict[str, float],
    max_block_fraction: float,
    estimate: Callable[[dict[str, float]], float],
    ceiling: float | None = None,
) -> dict[str, float]:
    """Choose which blocks a latency plan removes: the fewest that, with width pruning at its caps, reach `goal`.

    Blocks are taken cheapest first (probe damage per latency share saved), at most `max_block_fraction` of a
    stack; `caps` are the width groups' largest ratios and `estimate` the planner's reduction estimate of a plan.
    Width pruning is then solved for what is left; on a small model at batch 1 it buys little, so depth comes
    first (bench/latency_floor.py). With `ceiling`, the blocks alone stay below it.

    Returns:
        {block group: 1.0 removed, or 0.0 kept} for every block group.
    """
    blocks = [r for r in rows if r.kind == "block"]
    allowed = cheapest_blocks(rows, max_block_fraction)
    fixed = {r.name: 0.0 for r in blocks}
    for k in range(len(allowed) + 1):
        trial = {**{r.name: 0.0 for r in blocks}, **{r.name: 1.0 for r in allowed[:k]}}
        if ceiling is not None and estimate(trial) >= ceiling:
            break
        fixed = trial
        if estimate({**trial, **caps}) >= goal:
            break
    return fixed


def block_cost(row: GroupRow) -> float:
    """Return a block group's probe damage per latency share its removal saves (lower is cheaper)."""
    return row.damage / max(row.latency_share, 1e-6)


def cheapest_blocks(rows: Sequence[GroupRow], max_block_fraction: float) -> list[GroupRow]:
    """Return the block groups a plan may take out, cheapest first (probe damage per latency share saved).

    At most `max_block_fraction` of a stack (`block_limits`): the cheapest of each stack come first and the others
    are left out.
    """
    blocks = [r for r in rows if r.kind == "block"]
    allowed: list[GroupRow] = []
    per_stack: dict[str, int] = {}
    limits = block_limits(blocks, max_block_fraction)
    for g in sorted(blocks, key=lambda r: (block_cost(r), r.name)):
        stack = limit_key(g)
        if per_stack.get(stack, 0) < limits[stack]:
            per_stack[stack] = per_stack.get(stack, 0) + 1
            allowed.append(g)
    return allowed


def block_names(rows: Sequence[GroupRow], layers: Sequence[str]) -> list[str]:
    """Return the block groups (in the groups' order) whose exact plan pattern (`^module$`, escaped) is in `layers`."""
    wanted = set(layers)
    return [r.name for r in rows if r.kind == "block" and f"^{re.escape(r.module)}$" in wanted]


def carried_blocks(history: Sequence[PastRound], rows: Sequence[GroupRow], goal: float) -> tuple[list[str], int]:
    """Return the blocks a backing-off round keeps: those of a failed plan that also pruned width, or none.

    A plan that removed blocks and pruned channels or heads on top and then missed the budget is backed off
    width first: distillation recovers a removed block (the zoo ViT's two layers: 0.00 pp on validation after
    300 steps) where the width fill on top lost 1.2-4.9 pp for 3-5 points of latency. The blocks are kept unless
    a plan removing exactly them without width also missed it, and only for a round aiming below that plan's goal.
    Rounds are the planner history's dicts (`goal`, `passed`, `blocks` as plan layer patterns, `width`); a block
    is recognised by the exact pattern the planners write for it (`^module$`, escaped), never by running a
    pattern from the history.

    Returns:
        (block group names to keep removed, the iteration they come from), or ([], 0).
    """
    failed_alone = {tuple(h.blocks) for h in history if not h.passed and not h.width}
    for h in reversed(history):
        blocks = tuple(h.blocks)
        if h.passed or not blocks or not h.width or goal >= h.goal or blocks in failed_alone:
            continue
        names = block_names(rows, blocks)
        if len(names) == len(blocks):
            return names, int(h.iteration or 0)
    return [], 0


def backed_off_blocks(
    history: Sequence[PastRound],
    goal: float,
    rows: Sequence[GroupRow],
    max_block_fraction: float,
    estimate: Callable[[dict[str, float]], float],
    ceiling: float | None = None,
) -> tuple[dict[str, float] | None, str]:
    """Return a plan of blocks alone for a round after a depth plan missed the budget, and why; or (None, "").

    After such a miss the width is what to drop first: distillation recovered one removed or replaced block on every
    zoo model, where width pruning on top lost 1.2-4.9 pp for 3-5 points of latency (zoo ViT) and 2.54 pp on the zoo
    ResNet (a stage-2 replacement alone: +0.20 pp). So the round keeps the blocks of a failed plan that also pruned
    width (`carried_blocks`), or else takes the cheapest blocks (probe damage per latency share) whose estimate stays
    within `goal` (when not one fits, the cheapest single block: the smallest step depth has), and prunes no width.
    None of these is planned when it would not reach past the best passing round (a plan already measured, or a
    step backwards) or would reach `ceiling` (a refused goal); the caller then plans blocks and width as before.

    Returns:
        ({group: ratio} for every group: 1.0 for the chosen blocks, 0.0 for everything else, or None; the note).
    """
    if not any(not h.passed and h.blocks for h in history):
        return None, ""
    best_pass = max((float(h.goal) for h in history if h.passed), default=0.0)
    zeros = {r.name: 0.0 for r in rows}

    def usable(plan: dict[str, float]) -> bool:
        est = estimate(plan)
        return any(plan.values()) and est > best_pass + 1e-9 and (ceiling is None or est < ceiling - 1e-9)

    kept, source = carried_blocks(history, rows, goal)
    carried = {**zeros, **{name: 1.0 for name in kept}}
    if kept and usable(carried):
        return carried, f"keeping the {len(kept)} blocks round {source} removed and backing off its width pruning"
    why = "blocks alone, no width: a plan with blocks missed the budget (see backed_off_blocks)"
    chosen = {**zeros, **depth_first(goal, rows, {}, max_block_fraction, estimate, goal + 1e-9)}
    if usable(chosen):
        return chosen, why
    if not any(chosen.values()):  # no block fits within the goal: the smallest step there is, one block
        for g in cheapest_blocks(rows, max_block_fraction):
            single = {**zeros, g.name: 1.0}
            if usable(single):
                return single, why + "; one block, past the goal: none fits within it"
    return None, ""


def depth_secant(history: Sequence[PastRound], max_acc_drop: float) -> float | None:
    """Return a lower goal for the next round when no round kept the budget and the lowest missed plan took blocks.

    A plan that takes blocks out gets no calibration trial (distillation, not the refit, decides what it costs), so
    its validation loss is the only measure of how far it overshot. The goal is scaled down by the line from no
    pruning through that plan: its goal x AIM x budget / its loss. Accuracy loss grows faster than linearly with
    the reduction, so the line errs low, and a goal below every block's share falls back to the single cheapest
    block (`backed_off_blocks`). Bisection halved the goal instead: the zoo ResNet's four blocks lost 22.95 pp, the
    two of them bisection kept next lost 3.95 pp, and only the third round reached the one block that held.

    Returns:
        The goal, or None (a round passed, the lowest missed plan took no blocks, or it kept within the budget).
    """
    if any(h.passed for h in history):
        return None
    failed = [h for h in history if not h.passed and h.drop is not None]
    if not failed:
        return None
    low = min(failed, key=lambda h: float(h.goal))
    if not low.blocks or low.drop is None or float(low.drop) <= max_acc_drop:
        return None
    return line_goal((0.0, 0.0), (float(low.goal), float(low.drop)), AIM * max_acc_drop)
