"""Uniform pruning baselines (L1-norm, L2-norm, seeded random) on the same dependency-aware pruning engine."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from torch import nn

from profiling_agent.state import (
    BASELINE_PLANNERS,
    BaselinePlanner,
    CompressionPlan,
    GroupRow,
    PruneEntry,
    PruneType,
    QuantEntry,
    QuantizeChoice,
)
from profiling_agent.tools.compression.families import adapter_for
from profiling_agent.tools.compression.families.base import FamilyAdapter, PrunableGroup
from profiling_agent.tools.compression.pruning import prune_model
from profiling_agent.tools.compression.units import PruneReport, removed_units

Baseline = BaselinePlanner
BASELINES: tuple[Baseline, ...] = BASELINE_PLANNERS  # the planner names Objective accepts with a ratio
KIND_ORDER: tuple[PruneType, ...] = ("structured", "head")
ALL_MODULES = ".*"  # uniform: the entry's regex matches every group of its kind

_DESCRIPTION = {
    "l1": "lowest L1 norm",
    "l2": "lowest L2 norm",
    "random": "a seeded random draw",
}

__all__ = [
    "BASELINES",
    "Baseline",
    "check_ratio",
    "is_baseline",
    "prune_uniform",
    "uniform_entries",
    "uniform_plan",
    "uniform_removals",
]


def is_baseline(planner: str) -> bool:
    """Return True when `planner` names a uniform baseline (l1, l2 or random)."""
    return planner in BASELINES


def as_baseline(planner: str) -> Baseline:
    """Return `planner` as a uniform baseline's name.

    Raises:
        ValueError: When it names no baseline.
    """
    for name in BASELINES:
        if planner == name:
            return name
    raise ValueError(f"unknown baseline {planner!r}: use one of {', '.join(BASELINES)}")


def check_ratio(ratio: float | None, planner: str = "l2") -> float:
    """Return `ratio` as a float when it lies in (0, 1).

    Raises:
        ValueError: When the ratio is missing or outside (0, 1).
    """
    if ratio is None:
        raise ValueError(f"the {planner} baseline needs a pruning ratio in (0, 1)")
    ratio = float(ratio)
    if not 0.0 < ratio < 1.0:
        raise ValueError(f"pruning ratio {ratio} must be in (0, 1)")
    return ratio


# a baseline reads a group's name, kind and sizes: the planners' typed row, or the adapter's group on a live model
Group = GroupRow | PrunableGroup


def uniform_entries(kinds: Iterable[str], ratio: float, planner: Baseline = "l2") -> list[PruneEntry]:
    """Build one plan entry per group kind that prunes every group of that kind by `ratio`.

    Args:
        kinds: Group kinds present in the model ("structured", "head"); repeats are ignored.
        ratio: Fraction of each group's units to remove, in (0, 1).
        planner: Which baseline the entries are for (named in the justification).

    Returns:
        Entries in the order structured, head.
    """
    ratio = check_ratio(ratio, planner)
    present = set(kinds)
    unit = {"structured": "channels", "head": "attention heads"}
    return [
        PruneEntry(
            layer=ALL_MODULES,
            type=kind,
            ratio=ratio,
            justification=f"Uniform {planner} baseline: floor({ratio:g} x units) {unit[kind]} removed from "
            f"every {kind} group, chosen by {_DESCRIPTION[planner]}.",
        )
        for kind in KIND_ORDER
        if kind in present
    ]


def uniform_removals(groups: Sequence[Group], ratio: float) -> dict[str, int]:
    """Return how many units uniform pruning at `ratio` removes from each group (floor, keeping min_units)."""
    return {g.name: removed_units(int(g.units), int(g.min_units or 1), ratio) for g in groups}


def uniform_plan(
    groups: Sequence[Group],
    ratio: float,
    planner: Baseline = "l2",
    quantize: QuantizeChoice = "none",
) -> CompressionPlan:
    """Build the uniform baseline plan: every prunable group pruned by `ratio`, plus optional quantization.

    Args:
        groups: The model's prunable groups: the planners' rows (`GroupRow`, read from the profile) or the
            adapter's groups of a live model (`PrunableGroup`).
        ratio: Fraction of each group's units to remove, in (0, 1).
        planner: "l1", "l2" or "random": how units are chosen (the pruning node passes it as importance).
        quantize: "qint8", "float16" or "none": dynamic quantization of every nn.Linear after pruning.

    Returns:
        A valid CompressionPlan.

    Raises:
        ValueError: On an unknown planner or a ratio outside (0, 1).
    """
    if planner not in BASELINES:
        raise ValueError(f"unknown baseline {planner!r}: use one of {', '.join(BASELINES)}")
    ratio = check_ratio(ratio, planner)
    entries = uniform_entries((str(g.kind) for g in groups), ratio, planner)
    removals = uniform_removals(groups, ratio)
    untouched = sum(1 for n in removals.values() if n == 0)
    quant = []
    if quantize != "none":
        quant = [QuantEntry(layer="all", dtype=quantize, justification="Same quantization as the agent's plans.")]
    rationale = (
        f"Uniform {planner} baseline at ratio {ratio:g}: all {len(removals)} prunable groups pruned alike "
        f"(units chosen by {_DESCRIPTION[planner]}), ignoring the profile; "
        f"{untouched} groups are too small to lose a unit at this ratio (floor)."
    )
    return CompressionPlan(pruning=entries, quantization=quant, rationale=rationale)


def prune_uniform(
    model: nn.Module,
    ratio: float,
    example_inputs: Any,
    *,
    importance: Baseline = "l2",
    seed: int = 0,
    adapter: FamilyAdapter | None = None,
) -> PruneReport:
    """Prune every prunable group of `model` in place by `ratio` with the dependency-aware engine.

    Args:
        model: The model to prune (mutated: pass a fresh copy).
        ratio: Fraction of each group's units to remove, in (0, 1); each group loses floor(units * ratio).
        example_inputs: A pixel_values tensor used to trace the dependency graph.
        importance: "l1", "l2" (group norm of each unit's weights) or "random" (seeded).
        seed: Seed of the random choice.
        adapter: Family adapter; picked from the model when omitted.

    Returns:
        The engine's PruneReport (applied rows carry the removed unit indices).
    """
    if importance not in BASELINES:
        raise ValueError(f"unknown baseline {importance!r}: use one of {', '.join(BASELINES)}")
    adapter = adapter or adapter_for(model)
    entries = uniform_entries((g.kind for g in adapter.prunable_groups(model)), ratio, importance)
    return prune_model(model, entries, example_inputs, importance=importance, seed=seed, adapter=adapter)
