"""torch-pruning dependency graphs and the checks every dependency group passes before any weight changes."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch_pruning as tp
from torch import nn
from torch_pruning.dependency.group import Group as DepGroup

from profiling_agent.state import PruneEntry
from profiling_agent.tools.compression.families.base import FamilyAdapter, PrunableGroup
from profiling_agent.tools.compression.self_check import clone_inputs
from profiling_agent.tools.compression.units import PruneError, PruneReport, match_groups, units_to_remove
from profiling_agent.tools.runtimes.forward import forward_logits

logger = logging.getLogger(__name__)


@contextlib.contextmanager
def _grad_enabled_params(model: nn.Module) -> Iterator[None]:
    """Temporarily make every parameter require grad (the DependencyGraph traces autograd), then restore."""
    frozen = [p for p in model.parameters() if not p.requires_grad]
    for p in frozen:
        p.requires_grad_(True)
    try:
        with torch.inference_mode(False), torch.enable_grad():
            yield
    finally:
        for p in frozen:
            p.requires_grad_(False)


def clear_method_caches(model: nn.Module) -> int:
    """Clear the functools caches of methods on the model's module classes; return how many were cleared.

    Some transformers classes (BEiT, Data2VecVision, DINOv3...) cache tensors in class-level lru caches, e.g.
    `generate_relative_position_index`. A tensor cached during an inference-mode forward cannot enter the
    autograd trace that builds the DependencyGraph ("Inference tensors cannot be saved for backward").
    """
    cleared = 0
    classes = {klass for module in model.modules() for klass in type(module).__mro__}
    for klass in classes:
        for attr in vars(klass).values():
            func = attr.__func__ if isinstance(attr, (staticmethod, classmethod)) else attr
            # transformers' compile_compatible_method_lru_cache hides the lru_cache in the wrapper's closure
            cells = [cell.cell_contents for cell in getattr(func, "__closure__", None) or () if _filled(cell)]
            for candidate in (func, *cells):
                if callable(getattr(candidate, "cache_clear", None)):
                    candidate.cache_clear()
                    cleared += 1
    return cleared


def _filled(cell: Any) -> bool:
    """Return True when a closure cell holds a value (an unfilled cell raises ValueError)."""
    try:
        cell.cell_contents  # noqa: B018 - the access is the test
    except ValueError:
        return False
    return True


def build_dependency_graph(
    model: nn.Module, example_inputs: Any, ignored_params: Iterable[str] = ()
) -> tp.DependencyGraph:
    """Trace `model` on `example_inputs` (a pixel tensor or a dict of inputs) into a DependencyGraph.

    Args:
        model: The model to trace (left in eval mode).
        example_inputs: A pixel_values tensor or a dict of model inputs.
        ignored_params: Parameter names the graph must never prune (per-head tensors owned by the adapter).

    Raises:
        PruneError: The model cannot be traced (one line naming the model and the cause).
    """
    model.eval()
    ignored = [model.get_parameter(name) for name in ignored_params]
    clear_method_caches(model)
    with _grad_enabled_params(model):
        try:
            return tp.DependencyGraph().build_dependency(
                model,
                example_inputs=clone_inputs(example_inputs),
                forward_fn=forward_logits,
                ignored_params=ignored,
                verbose=False,
            )
        except Exception as exc:  # noqa: BLE001 - any tracing failure means this model cannot be pruned here
            reason = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
            raise PruneError(f"cannot trace {type(model).__name__} for pruning: {reason}") from exc


def per_head_params(groups: Iterable[PrunableGroup]) -> list[str]:
    """Collect the per-head parameter names the groups declare in extra["per_head_params"]."""
    return [name for group in groups for name in group.extra.get("per_head_params", [])]


# ---------------------------------------------------------------- dependency checks


def _is_under(name: str, prefixes: Iterable[str]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def _check_dep_group(
    dg: tp.DependencyGraph, dep_group: DepGroup, group: PrunableGroup, protected: list[str]
) -> set[str]:
    """Check one torch-pruning group against the adapter's declaration.

    Every real module the coupling reaches must be a member of `group`, receive the root's indices, and not be
    protected (a protected member may only lose input channels, e.g. a block's last conv consuming a pruned
    middle conv). Raw parameters (cls tokens, position embeddings, bias tables) must never be reached: per-head
    tensors declared in a group's extra["per_head_params"] are left out of the graph and pruned by the
    adapter's `before_head_prune`.

    Returns:
        The roots whose output channels the group prunes.

    Raises:
        PruneError: On any violation.
    """
    root_idxs = sorted(dep_group[0].idxs)
    covered = set()
    for item in dep_group.items:
        target = item.dep.target.module
        if isinstance(target, nn.Parameter):
            pname = dg._param_to_name.get(target, "<parameter>")
            where = "protected parameter" if _is_under(pname.rsplit(".", 1)[0], protected) else "parameter"
            raise PruneError(f"group {group.name} would change {where} {pname}")
        name = dg._module2name.get(target)
        if name is None:  # torch-pruning's placeholder ops (reshape, elementwise...)
            continue
        is_out = dg.is_out_channel_pruning_fn(item.dep.handler)
        if _is_under(name, protected) and (is_out or name not in group.members):
            raise PruneError(f"group {group.name} would change protected module {name}")
        if name not in group.members:
            raise PruneError(f"group {group.name} would change {name}, which is not one of its members")
        if sorted(item.idxs) != root_idxs:
            raise PruneError(f"group {group.name}: {name} would lose different channels than the root")
        if is_out and name in group.roots:
            covered.add(name)
    return covered


def dependency_groups(
    dg: tp.DependencyGraph, model: nn.Module, group: PrunableGroup, channels: list[int], protected: list[str]
) -> list[DepGroup]:
    """Return checked torch-pruning groups that remove `channels` from every root of `group`, once each."""
    result: list[DepGroup] = []
    covered: set[str] = set()
    touched: set[tuple[str, Any]] = set()
    for root in group.roots:
        if root in covered:
            continue
        module = model.get_submodule(root)
        pruner = dg.get_pruner_of_module(module)
        if pruner is None or module not in dg.module2node:
            raise PruneError(f"group {group.name}: root {root} is not in the traced dependency graph")
        dep_group = dg.get_pruning_group(module, pruner.prune_out_channels, channels)
        hit = _check_dep_group(dg, dep_group, group, protected)
        if root not in hit:
            raise PruneError(f"group {group.name}: pruning {root} does not prune its own output channels")
        layers = {
            (dg._module2name[i.dep.target.module], i.dep.handler)
            for i in dep_group.items
            if i.dep.target.module in dg._module2name
        }
        if layers & touched:
            raise PruneError(f"group {group.name}: roots couple to the same layers without being coupled together")
        touched |= layers
        covered |= hit
        result.append(dep_group)
    return result


def protected_names(adapter: FamilyAdapter, model: nn.Module, extra: Iterable[str] | None) -> list[str]:
    """List the modules a plan must not prune: the family's own, then the caller's extra ones."""
    return list(dict.fromkeys([*adapter.protected_modules(model), *(extra or [])]))


# ---------------------------------------------------------------- pruning


@dataclass(frozen=True)
class PlanStep:
    """One pruning step: a group and the ratio (or exact units) to remove from it."""

    group: PrunableGroup
    ratio: float
    n_remove: int


def plan_steps(
    adapter: FamilyAdapter, model: nn.Module, entries: Iterable[PruneEntry | Mapping[str, Any]]
) -> list[PlanStep]:
    """Turn plan entries into ordered steps on the model's prunable groups."""
    groups = adapter.prunable_groups(model)
    ratios = match_groups(groups, entries)
    return [PlanStep(g, ratios[g.name], units_to_remove(g, ratios[g.name])) for g in groups if g.name in ratios]


def output_width(model: nn.Module, name: str) -> int:
    """Return the output channels (dim 0 of the weight) of the module `name`.

    Raises:
        PruneError: When the module has no weight tensor.
    """
    weight = getattr(model.get_submodule(name), "weight", None)
    if not isinstance(weight, torch.Tensor):
        raise PruneError(f"{name} has no weight tensor")
    return int(weight.shape[0])


def _check_step(dg: tp.DependencyGraph, model: nn.Module, step: PlanStep, protected: list[str]) -> None:
    """Check one step without changing anything: targets, live sizes and the traced coupling.

    Raises:
        PruneError: On the first problem found.
    """
    group = step.group
    if _is_under(group.module, protected) or any(_is_under(r, protected) for r in group.roots):
        raise PruneError(f"group {group.name} targets protected module {group.module}")
    for root in group.roots:
        width = output_width(model, root)
        if width != group.units * group.unit_size:
            raise PruneError(f"group {group.name}: {root} has {width} outputs, not {group.units} units")
    if step.n_remove:
        dependency_groups(dg, model, group, list(range(group.units * group.unit_size)), protected)


def validate_steps(
    dg: tp.DependencyGraph,
    model: nn.Module,
    steps: list[PlanStep],
    protected: list[str],
    adapter: FamilyAdapter,
    report: PruneReport,
) -> list[PlanStep]:
    """Dry-run every step before anything changes; unsafe adapters drop bad groups (logged), safe ones raise."""
    valid = []
    for step in steps:
        try:
            _check_step(dg, model, step, protected)
        except PruneError as exc:
            if adapter.safe:
                raise
            logger.warning("skipping %s group %s: %s", adapter.name, step.group.name, exc)
            report.skipped.append({"group": step.group.name, "reason": str(exc)})
            continue
        valid.append(step)
    return valid
