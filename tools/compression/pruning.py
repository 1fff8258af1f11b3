"""Structured pruning of image classifiers driven by plan entries, on torch-pruning's DependencyGraph."""

from __future__ import annotations

import copy
import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch_pruning as tp
from torch import nn

from profiling_agent.state import PruneEntry
from profiling_agent.tools.compression.depgraph import (
    PlanStep,
    build_dependency_graph,
    dependency_groups,
    output_width,
    per_head_params,
    plan_steps,
    protected_names,
    validate_steps,
)
from profiling_agent.tools.compression.families import adapter_for
from profiling_agent.tools.compression.families.base import FamilyAdapter
from profiling_agent.tools.compression.self_check import verify_against_masking
from profiling_agent.tools.compression.units import (
    Importance,
    PrunedGroup,
    PruneError,
    PruneReport,
    channels_of,
    match_groups,
    select_units,
    units_to_remove,
)
from profiling_agent.tools.models.sizes import count_params

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PruneGuard:
    """What prune_model checks beyond its family adapter's own rules: more protected modules, a numerical check.

    Attributes:
        protected: Module names to protect in addition to the adapter's own. A protected module (or anything
            under it) never loses output channels and is never reached by a group it is not a member of; the only
            change allowed is losing input channels as a declared member (a ResNet block's last conv consuming
            its pruned middle conv).
        verify: Compare the pruned model's logits with an unpruned copy whose removed units are masked (see
            `mask_removed_units`) on seeded random inputs shaped like the example inputs. None (the default)
            verifies only with an unsafe (generic fallback) adapter; it costs a copy of the model and two forwards.
    """

    protected: tuple[str, ...] = ()
    verify: bool | None = None


def _prune_step(
    dg: tp.DependencyGraph | None,
    model: nn.Module,
    step: PlanStep,
    adapter: FamilyAdapter,
    protected: list[str],
    importance: Importance,
    seed: int,
    chosen: Mapping[str, Sequence[int]] | None = None,
) -> list[int]:
    """Remove the chosen units of one group (given, or picked by `importance`) and return their indices."""
    if chosen is not None and step.group.name in chosen:
        removed = sorted(int(u) for u in chosen[step.group.name])
        if (
            len(removed) != step.n_remove
            or len(set(removed)) != len(removed)
            or not set(removed) <= set(range(step.group.units))
        ):
            raise PruneError(f"group {step.group.name}: chosen units {removed} do not match {step.n_remove} removals")
    else:
        removed = select_units(model, step.group, step.n_remove, importance, seed)
    if not removed:
        return removed
    if dg is None:
        raise PruneError(f"group {step.group.name}: no dependency graph was built")
    dep_groups = dependency_groups(dg, model, step.group, channels_of(step.group, removed), protected)
    if step.group.kind == "head":
        adapter.before_head_prune(model, step.group, removed)
    for dep_group in dep_groups:
        dep_group.prune(record_history=False)
    return removed


def _verify_sizes(model: nn.Module, steps: list[PlanStep], applied: list[PrunedGroup]) -> None:
    """Check every root now has exactly units_after * unit_size output channels."""
    for step, row in zip(steps, applied, strict=True):
        expected = row.units_after * step.group.unit_size
        for root in step.group.roots:
            width = output_width(model, root)
            if width != expected:
                raise PruneError(f"group {step.group.name}: {root} has {width} outputs, expected {expected}")


def _applied_row(step: PlanStep, removed: list[int]) -> PrunedGroup:
    group = step.group
    return PrunedGroup(
        group=group.name,
        module=group.module,
        kind=group.kind,
        ratio=step.ratio,
        units_before=group.units,
        units_after=group.units - len(removed),
        removed=removed,
    )


def _renamed(name: str, renamed: Mapping[str, str]) -> str:
    """Return a module or parameter name after its block was renumbered (`renamed`: old block -> new block)."""
    for old, new in renamed.items():
        if name == old or name.startswith(old + "."):
            return new + name[len(old) :]
    return name


def _drop_blocks(
    model: nn.Module,
    adapter: FamilyAdapter,
    entries: list[PruneEntry | Mapping[str, Any]],
    chosen: Mapping[str, Sequence[int]] | None,
    report: PruneReport,
) -> tuple[list[PruneEntry | Mapping[str, Any]], Mapping[str, Sequence[int]] | None, dict[str, str]]:
    """Remove the blocks the entries name (type "block"); return the width entries and choices on the new names.

    Entries are matched against the groups of the unpruned model, so a plan's names always mean the model it was
    written for. Width groups inside a removed block are moot (listed in `report.skipped`); the others are
    re-targeted by exact module name after the renumbering. Block rows go first in `report.applied`.
    """
    if not any(_kind_of(e) == "block" for e in entries):
        return entries, chosen, {}
    width, blocks = adapter.prunable_groups(model), adapter.block_groups(model)
    ratios = match_groups([*width, *blocks], entries)  # validates every entry (a block's ratio 1.0, the regex)
    drop = [g for g in blocks if units_to_remove(g, ratios.get(g.name, 0.0)) == 1]
    if not drop:
        return [e for e in entries if _kind_of(e) != "block"], chosen, {}
    try:
        renamed = adapter.drop_blocks(model, [g.module for g in drop])
    except ValueError as err:
        raise PruneError(str(err)) from None
    gone = {g.module for g in drop}
    after = {(g.module, g.kind): g for g in adapter.prunable_groups(model)}
    kept: list[PruneEntry | Mapping[str, Any]] = []
    moved: dict[str, Sequence[int]] = {}
    for group in width:
        ratio = ratios.get(group.name, 0.0)
        if not ratio:
            continue
        if group.block in gone:
            report.skipped.append({"group": group.name, "reason": f"inside removed block {group.block}"})
            continue
        new = after.get((_renamed(group.module, renamed), group.kind))
        if new is None:
            raise PruneError(f"group {group.name} has no counterpart after removing {sorted(gone)}")
        kept.append({"layer": f"^{re.escape(new.module)}$", "type": new.kind, "ratio": ratio})
        if chosen is not None and group.name in chosen:
            moved[new.name] = chosen[group.name]
    for group in drop:
        report.applied.append(
            PrunedGroup(
                group=group.name,
                module=group.module,
                kind="block",
                ratio=1.0,
                units_before=1,
                units_after=0,
                removed=[0],
            )
        )
    return kept, (moved if chosen is not None else None), renamed


def _kind_of(entry: PruneEntry | Mapping[str, Any]) -> str:
    return str(entry.type if isinstance(entry, PruneEntry) else entry.get("type", ""))


def prune_model(
    model: nn.Module,
    entries: Iterable[PruneEntry | Mapping[str, Any]],
    example_inputs: Any,
    *,
    importance: Importance = "l2",
    seed: int = 0,
    adapter: FamilyAdapter | None = None,
    chosen: Mapping[str, Sequence[int]] | None = None,
    guard: PruneGuard = PruneGuard(),
) -> PruneReport:
    """Prune `model` in place by the plan entries and repair it with its family adapter.

    Block entries (type "block", ratio 1.0) first remove whole blocks through the adapter's `drop_blocks` (the
    remaining blocks are renumbered; see `_drop_blocks`). Each matched width group then loses floor(units * ratio)
    units (clamped so `min_units` remain; 0 removes nothing),
    chosen by `select_units`. Couplings come from torch-pruning's DependencyGraph traced on `example_inputs`;
    every coupling is checked against the group's members and the protected modules before any weight changes.
    The model is left in eval mode.

    Args:
        model: The model to prune; mutated, so pass a fresh copy.
        entries: PruneEntry objects or dicts with layer/type/ratio; later entries override earlier ones.
        example_inputs: A pixel_values tensor (or a dict of model inputs) used to trace the graph.
        importance: "l2", "l1" or "random".
        seed: Seed for random importance.
        adapter: Family adapter; picked with `adapter_for` when omitted.
        chosen: {group name: unit indices} to remove instead of the ones `importance` picks (e.g. Torch-Pruning's
            global ranking, `global_pruning.py`); each list must have the entry's number of removals.
        guard: More protected modules and the numerical check against masking (`PruneGuard`).

    Returns:
        A PruneReport.

    Raises:
        ValueError: On an invalid entry.
        PruneError: When a group would reach a protected module or outside its members (generic adapter
            groups are skipped instead), the model cannot be traced, the result does not have the expected
            sizes, or verification finds the pruned model differs from the masked one.
    """
    adapter = adapter or adapter_for(model)
    report = PruneReport(family=adapter.name, params_before=count_params(model))
    frozen = {name for name, p in model.named_parameters() if not p.requires_grad}
    entries, chosen, renamed = _drop_blocks(model, adapter, list(entries), chosen, report)
    frozen = {_renamed(name, renamed) for name in frozen}
    protected = protected_names(adapter, model, guard.protected)
    steps = plan_steps(adapter, model, entries)
    check = (not adapter.safe) if guard.verify is None else guard.verify
    reference = copy.deepcopy(model) if check and any(step.n_remove for step in steps) else None
    with torch.inference_mode(False):  # new weights must be normal tensors even if the caller is in inference mode
        dg = None
        if any(step.n_remove for step in steps):
            dg = build_dependency_graph(model, example_inputs, per_head_params(adapter.prunable_groups(model)))
            steps = validate_steps(dg, model, steps, protected, adapter, report)
        for step in steps:
            removed = _prune_step(dg, model, step, adapter, protected, importance, seed, chosen)
            report.applied.append(_applied_row(step, removed))
        report.attrs = adapter.fix_up(model)
    _verify_sizes(model, steps, [row for row in report.applied if row.kind != "block"])
    for name, param in model.named_parameters():  # torch-pruning replaces pruned Parameters with trainable ones
        param.requires_grad_(name not in frozen)
    report.params_after = count_params(model)
    model.eval()
    if reference is not None:
        verify_against_masking(reference, model, report, {s.group.name: s.group for s in steps}, example_inputs, seed)
    logger.info(
        "pruned %d groups (%s): params %d -> %d",
        len(report.applied),
        adapter.name,
        report.params_before,
        report.params_after,
    )
    return report
