"""Torch-Pruning's global pruning on this engine's groups: its group importances, ranked across all groups at once.

Torch-Pruning's `MetaPruner(global_pruning=True)` scores every channel of every dependency group with an
importance criterion, normalizes the scores per group and removes the lowest-scored channels of the whole model.
Here the scores come from Torch-Pruning's own `GroupMagnitudeImportance` and `GroupTaylorImportance`, computed on
the dependency groups of this engine's prunable groups (same protected layers, same channel and head units), and
the units are removed by this engine (`prune_model(chosen=...)`), so a comparison with the other planners differs
only in which units go.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import torch
import torch_pruning as tp
from torch import nn

from profiling_agent.tools.compression.depgraph import (
    build_dependency_graph,
    dependency_groups,
    per_head_params,
    protected_names,
)
from profiling_agent.tools.compression.families import adapter_for
from profiling_agent.tools.compression.families.base import FamilyAdapter, PrunableGroup
from profiling_agent.tools.compression.units import removed_units
from profiling_agent.tools.runtimes.forward import forward_logits

Criterion = Literal["magnitude", "taylor"]
CRITERIA: tuple[Criterion, ...] = ("magnitude", "taylor")


def _importance(criterion: Criterion) -> Any:
    if criterion == "magnitude":
        return tp.importance.GroupMagnitudeImportance(p=2, group_reduction="mean", normalizer="mean")
    if criterion == "taylor":
        return tp.importance.GroupTaylorImportance(group_reduction="mean", normalizer="mean")
    raise ValueError(f"unknown criterion {criterion!r}: use {' or '.join(CRITERIA)}")


def _taylor_gradients(model: nn.Module, pixels: torch.Tensor, labels: torch.Tensor, batch_size: int) -> None:
    """Accumulate the cross-entropy gradient of the calibration images into every parameter's .grad."""
    model.zero_grad(set_to_none=True)
    with torch.enable_grad():
        for start in range(0, len(pixels), batch_size):
            logits = forward_logits(model, pixels[start : start + batch_size]).float()
            loss = nn.functional.cross_entropy(logits, labels[start : start + batch_size], reduction="sum")
            (loss / len(pixels)).backward()


def unit_scores(
    model: nn.Module,
    example_inputs: torch.Tensor,
    criterion: Criterion,
    *,
    pixels: torch.Tensor | None = None,
    labels: torch.Tensor | None = None,
    adapter: FamilyAdapter | None = None,
    batch_size: int = 32,
) -> dict[str, torch.Tensor]:
    """Score every unit (channel or head) of every prunable group with a Torch-Pruning group importance.

    Each group's score is Torch-Pruning's importance of its dependency group(s) (summed over roots that are
    pruned together, e.g. query, key and value), averaged over a head's channels, and divided by the group's mean
    as Torch-Pruning's `normalizer="mean"` does, so scores of different groups can be ranked together.

    Args:
        model: The unpruned model (not modified; with `taylor` its .grad fields are used and cleared).
        example_inputs: Pixels to trace the dependency graph with.
        criterion: "magnitude" (GroupMagnitudeImportance, L2) or "taylor" (GroupTaylorImportance: |w * dL/dw|).
        pixels: Calibration images; required by `taylor`.
        labels: Their model label ids; required by `taylor`.
        adapter: The family adapter (picked from the model when omitted).
        batch_size: Images per backward pass for `taylor`.

    Returns:
        {group name: float64 tensor of shape (units,)}; higher means more important.
    """
    adapter = adapter or adapter_for(model)
    groups = adapter.prunable_groups(model)
    importance = _importance(criterion)
    was_training = model.training
    model.eval()
    if criterion == "taylor":
        if pixels is None or labels is None:
            raise ValueError("taylor importance needs calibration pixels and labels")
        _taylor_gradients(model, pixels, labels, batch_size)
    try:
        with torch.inference_mode(False):
            dg = build_dependency_graph(model, example_inputs, per_head_params(groups))
            protected = protected_names(adapter, model, None)
            scores = {}
            for group in groups:
                channels = list(range(group.units * group.unit_size))
                per_channel = torch.zeros(len(channels), dtype=torch.float64)
                for dep_group in dependency_groups(dg, model, group, channels, protected):
                    per_channel += importance(dep_group).detach().to(torch.float64).cpu()
                per_unit = per_channel.view(group.units, group.unit_size).mean(1)
                mean = float(per_unit.mean())
                scores[group.name] = per_unit / mean if mean > 0 else per_unit
    finally:
        if criterion == "taylor":
            model.zero_grad(set_to_none=True)
        model.train(was_training)
    return scores


def global_removals(
    groups: Sequence[PrunableGroup], scores: Mapping[str, torch.Tensor], fraction: float
) -> dict[str, list[int]]:
    """Pick the lowest-scored `fraction` of all units across groups, each group keeping its minimum.

    Args:
        groups: The prunable groups.
        scores: Normalized per-unit scores from `unit_scores`.
        fraction: Fraction of the model's units (channels and heads pooled) to remove, in [0, 1).

    Returns:
        {group name: sorted unit indices to remove} for every group (possibly empty lists).
    """
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"fraction {fraction} must be in [0, 1)")
    pool = sorted(
        ((float(s), g.name, u) for g in groups for u, s in enumerate(scores[g.name].tolist())),
        key=lambda item: (item[0], item[1], item[2]),
    )
    budget = math.floor(fraction * len(pool) + 1e-9)
    room = {g.name: removed_units(g.units, g.min_units, 0.999999) for g in groups}  # all but min_units
    chosen: dict[str, list[int]] = {g.name: [] for g in groups}
    for _, name, unit in pool:
        if budget <= 0:
            break
        if len(chosen[name]) < room[name]:
            chosen[name].append(unit)
            budget -= 1
    return {name: sorted(units) for name, units in chosen.items()}


def removal_entries(groups: Sequence[PrunableGroup], removals: Mapping[str, Sequence[int]]) -> list[dict[str, Any]]:
    """Plan entries (one anchored regex per group) whose ratios remove exactly len(removals[group]) units."""
    entries = []
    for group in groups:
        n = len(removals.get(group.name, ()))
        if n:
            entries.append({"layer": f"^{re.escape(group.module)}$", "type": group.kind, "ratio": n / group.units})
    return entries
