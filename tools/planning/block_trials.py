"""Round 1 of a distilled latency plan: try other sets of as many blocks, each briefly distilled; keep the closest.

The probe scores a removed block by what the least-squares refit leaves of the model, which is not what distillation
leaves: on the zoo ResNet the refit ranks stage 0's first block the most damaging (-45.9 pp before distillation,
-0.3 pp after 300 steps), so the planner took the identity block and stages 1 and 2, the one set of three that
distillation recovers worst (-1.75 pp held-out after 3,000 steps, where the identity block with stages 0 and 1 gained
0.35 pp). Blocks fail together, too: each of the four alone lost at most 0.3 pp after 300 steps. So the first round
tries the planner's set and the next cheapest sets of the same size, each pruned, refit and distilled TRIAL_STEPS
steps on the training images, and keeps the one whose logits end closest to the baseline's on the trial slice
(validation images the model never trained on; mean KL; the sets' order after 100 and 300 steps matched the order
after 3,000 steps on held-out images).
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Callable, Sequence

from profiling_agent.state import BlockTrial, CompressionPlan, GroupRow, Trial
from profiling_agent.tools.compression.depth import block_limits, limit_key
from profiling_agent.tools.planning.depth_plan import block_cost
from profiling_agent.tools.text import one_line

TRIAL_SETS = 4  # block sets tried in round 1, the planner's own first
TRIAL_STEPS = 200  # distillation steps of each trial
ESTIMATE_SLACK = 0.01  # a set's estimated reduction may fall this far short of the target
MAX_COMBINATIONS = 20_000  # sets of blocks enumerated at most (beyond it only the planner's set: no trial)


def block_sets(
    rows: Sequence[GroupRow],
    max_block_fraction: float,
    chosen: Sequence[str],
    limit: int = 4 * TRIAL_SETS,
) -> list[list[str]]:
    """Return the planner's `chosen` blocks, then the other sets of as many blocks, cheapest first; `limit` in all.

    A set is allowed when it takes at most `max_block_fraction` of each stack (`block_limits`); its cost is the sum
    of its blocks' probe damage per latency share saved (`depth_plan.block_cost`). Names keep the groups' order.
    """
    blocks = [r for r in rows if r.kind == "block"]
    k, own = len(chosen), set(chosen)
    if not k or math.comb(len(blocks), k) > MAX_COMBINATIONS:
        return [list(chosen)] if k else []
    limits = block_limits(blocks, max_block_fraction)
    ranked = []
    for combo in itertools.combinations(blocks, k):
        per_stack = Counter(limit_key(g) for g in combo)
        names = [r.name for r in combo]
        if set(names) != own and all(n <= limits[stack] for stack, n in per_stack.items()):
            ranked.append((sum(block_cost(r) for r in combo), names))
    ranked.sort(key=lambda r: r[0])
    ordered = [r.name for r in blocks if r.name in own]
    return [ordered] + [names for _, names in ranked[: max(0, limit - 1)]]


def _kl(record: BlockTrial) -> float:
    return math.inf if record.kl is None else record.kl


def choose_block_set(
    sets: list[list[str]],
    plan_for: Callable[[list[str]], tuple[CompressionPlan, float]],
    trial: Callable[[CompressionPlan], Trial],
    target: float,
    limit: int = TRIAL_SETS,
) -> tuple[int, list[BlockTrial], list[CompressionPlan]]:
    """Try the sets' plans and return the index of the one closest to the baseline, one record and plan per trial.

    `plan_for` returns a set's plan (width filling the rest of the goal) and its estimated reduction. A set is tried
    when its estimate reaches `target` (the objective's reduction), or the first set's (the planner's own) when that
    falls short of it, within ESTIMATE_SLACK: one short of it would win by removing less. The first `limit` such sets
    are tried, and none when fewer than two are (nothing to choose: no records). `trial` prunes, refits and briefly
    distils a baseline copy by a plan and returns its trial (`kl_to_baseline`, `accuracy_drop_pp`); a
    trial that raises is recorded with its error and never kept unless every one failed (then the planner's set
    is). Ties keep the earlier (cheaper by the probe) set.
    """
    eligible: list[tuple[list[str], CompressionPlan, float]] = []
    floor = None
    for names in sets:
        plan, estimate = plan_for(names)
        floor = min(estimate, target) - ESTIMATE_SLACK if floor is None else floor
        if estimate >= floor:
            eligible.append((names, plan, estimate))
        if len(eligible) >= limit:
            break
    if len(eligible) < 2:
        return 0, [], []
    records: list[BlockTrial] = []
    for names, plan, estimate in eligible:
        width = sum(e.type != "block" for e in plan.pruning)
        record = BlockTrial(blocks=names, estimate=round(float(estimate), 4), width_groups=width, kl=None)
        try:
            tried = trial(plan)
            if tried.kl_to_baseline is None:
                raise ValueError("the trial measured no KL divergence from the baseline")
            record.kl = round(float(tried.kl_to_baseline), 5)
            record.calib_drop_pp = round(float(tried.accuracy_drop_pp), 3)
        except Exception as exc:  # a trial that fails rules its set out, not the round
            record.kl, record.error = None, one_line(exc)
        records.append(record)
    best = min(range(len(records)), key=lambda i: (_kl(records[i]), i))
    return best, records, [plan for _, plan, _ in eligible]
