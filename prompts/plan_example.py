"""The plan-format example the prompts show (a made-up model's groups), and the check that a plan did not copy it.

A leaf module: it imports nothing from the package, so the prompts and the guard can both use it.

The example names groups of a model that does not exist ("example.0.ffn", ...), so a copy of it cannot pass as a
plan for the profiled model. A small model may still translate it position by position (the first two MLP groups
at 0.3, the first head group at 0.25); `example_copy_reasons` refuses that too, with a reason the LLM can act on.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

EXAMPLE_PREFIX = "example."  # every group name of the made-up model starts with it
# the made-up model's entries: (kind, group names, ratio); position i of a kind stands for this model's i-th group
EXAMPLE_ENTRIES: tuple[tuple[str, tuple[str, ...], float], ...] = (
    ("structured", ("example.0.ffn", "example.1.ffn"), 0.3),
    ("head", ("example.0.attn",), 0.25),
)
NEAR = 0.05  # ratios this close to the example's count as the example's


def example_plan_json() -> str:
    """Return the format example as JSON: exact group names of a made-up model, one quantization entry."""
    pruning = [
        {"groups": list(names), "type": kind, "ratio": ratio, "justification": "<why, from the profile>"}
        for kind, names, ratio in EXAMPLE_ENTRIES
    ]
    plan = {
        "pruning": pruning,
        "quantization": [{"layer": "all", "type": "dynamic", "dtype": "qint8", "justification": "<why>"}],
        "rationale": "<one paragraph on the plan as a whole>",
    }
    return json.dumps(plan)


def projected_example(groups: Sequence[tuple[str, str]]) -> dict[str, float]:
    """Map the example onto this model by position: its i-th group of a kind is this model's i-th group of it.

    `groups` are this model's prunable groups as (name, kind), in the profile's order.
    """
    out: dict[str, float] = {}
    for kind, names, ratio in EXAMPLE_ENTRIES:
        mine = [name for name, own in groups if own == kind]
        for name in mine[: len(names)]:
            out[name] = ratio
    return out


def _named(plan: dict[str, Any]) -> list[str]:
    names: list[str] = []
    for entry in plan.get("pruning") or []:
        if not isinstance(entry, dict):
            continue
        listed = entry.get("groups")
        names += [n for n in listed if isinstance(n, str)] if isinstance(listed, list) else []
        layer = entry.get("layer")
        names += [layer] if isinstance(layer, str) else []
    return [n for n in names if EXAMPLE_PREFIX in n]


def example_copy_reasons(
    plan: dict[str, Any], groups: Sequence[tuple[str, str]], ratios: dict[str, float]
) -> list[str]:
    """Return why a plan is the prompt's format example rather than a plan for this model (empty when it is not).

    Args:
        plan: The plan as parsed (entries may name groups or regexes).
        groups: This model's prunable groups as (name, kind), in the profile's order.
        ratios: The plan's resolved ratio per group (the guard's), or {} when it did not resolve.
    """
    copied = _named(plan)
    if copied:
        mine = [name for name, _ in groups][:3]
        return [
            f"{copied[0]!r} is a group of the format example's made-up model, not of this model: choose groups "
            f"and ratios from this model's table (names like {', '.join(mine)}), or call propose_plan for a "
            "starting point"
        ]
    example = projected_example(groups)
    if ratios and set(ratios) == set(example) and all(abs(ratios[k] - example[k]) <= NEAR for k in example):
        return [
            "this is the prompt's format example translated onto this model (the same groups at the same ratios), "
            "not a plan from its profile: pick the groups by cost share and probe damage and set ratios that reach "
            "the objective (propose_plan gives the deterministic planner's plan at a goal)"
        ]
    return []
