"""Structured pruning of image classifiers driven by plan entries, on torch-pruning's DependencyGraph."""

from __future__ import annotations

import contextlib
import copy
import inspect
import logging
import math
import re
import zlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import torch
import torch_pruning as tp
from torch import nn
from torch_pruning.dependency.group import Group as DepGroup

from profiling_agent.state import PruneEntry
from profiling_agent.tools.families import adapter_for
from profiling_agent.tools.families.base import FamilyAdapter, PrunableGroup

logger = logging.getLogger(__name__)

Importance = Literal["l2", "l1", "random"]
KINDS = ("structured", "head")
_EPS = 1e-9  # guards floor(units * ratio) against float error (0.29 * 100 = 28.999...)

__all__ = [
    "Importance",
    "PruneCheckError",
    "PruneError",
    "PruneReport",
    "build_dependency_graph",
    "clear_method_caches",
    "count_params",
    "estimate_pruning",
    "mask_removed_units",
    "match_groups",
    "per_head_params",
    "prune_model",
    "select_units",
    "self_check",
    "unit_scores",
    "units_to_remove",
]


class PruneError(RuntimeError):
    """Pruning cannot be applied as planned (protected module reached, bad coupling, size mismatch)."""


class PruneCheckError(RuntimeError):
    """A pruned model failed its numerical or structural self-check."""


@dataclass
class PruneReport:
    """What `prune_model` did.

    Attributes:
        family: Adapter name used (vit, resnet, ...).
        applied: One dict per matched group: group, module, kind, ratio, units_before, units_after, removed
            (unit indices: channels, or heads).
        attrs: Attributes set by the adapter's fix_up, {module_name: {attr: value}}.
        params_before: Parameter count before pruning.
        params_after: Parameter count after pruning.
        skipped: Groups of an unsafe (generic) adapter dropped because their coupling was not safe, with reasons.
    """

    family: str
    applied: list[dict[str, Any]] = field(default_factory=list)
    attrs: dict[str, dict[str, Any]] = field(default_factory=dict)
    params_before: int = 0
    params_after: int = 0
    skipped: list[dict[str, str]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """Return the report as plain JSON-ready data."""
        return asdict(self)


# ---------------------------------------------------------------- plan entries -> groups


@dataclass(frozen=True)
class _Entry:
    """A validated plan entry."""

    pattern: re.Pattern[str]
    kind: str
    ratio: float


def _parse_entry(entry: PruneEntry | Mapping[str, Any]) -> _Entry:
    """Validate one entry (PruneEntry or dict with layer/type/ratio) and compile its regex."""
    if isinstance(entry, PruneEntry):
        layer, kind, ratio = entry.layer, entry.type, entry.ratio
    elif isinstance(entry, Mapping):
        missing = [key for key in ("layer", "type", "ratio") if key not in entry]
        if missing:
            raise ValueError(f"prune entry {dict(entry)!r} lacks {missing}")
        layer, kind, ratio = entry["layer"], entry["type"], entry["ratio"]
    else:
        raise TypeError(f"prune entry must be a PruneEntry or a dict, not {type(entry).__name__}")
    if kind not in KINDS:
        raise ValueError(f"unknown prune type {kind!r}: use one of {KINDS}")
    ratio = float(ratio)
    if not 0.0 <= ratio < 1.0:
        raise ValueError(f"prune ratio {ratio} for {layer!r} must be in [0, 1)")
    try:
        pattern = re.compile(str(layer))
    except re.error as exc:
        raise ValueError(f"invalid layer regex {layer!r}: {exc}") from exc
    return _Entry(pattern, kind, ratio)


def match_groups(
    groups: Sequence[PrunableGroup], entries: Iterable[PruneEntry | Mapping[str, Any]]
) -> dict[str, float]:
    """Map each group targeted by the entries to its ratio; later entries override earlier ones.

    An entry targets the groups of its `type` (kind) whose `module` name contains a match of its `layer`
    regex (re.search).

    Args:
        groups: The model's prunable groups.
        entries: PruneEntry objects or dicts with keys layer, type and ratio (ratio in [0, 1)).

    Returns:
        {group name: ratio}, in group order.

    Raises:
        ValueError: On an invalid regex, type or ratio.
    """
    parsed = [_parse_entry(entry) for entry in entries]
    ratios: dict[str, float] = {}
    for entry in parsed:
        for group in groups:
            if group.kind == entry.kind and entry.pattern.search(group.module):
                ratios[group.name] = entry.ratio
    return {group.name: ratios[group.name] for group in groups if group.name in ratios}


def units_to_remove(group: PrunableGroup, ratio: float) -> int:
    """Return floor(units * ratio), clamped so at least `min_units` remain (never negative)."""
    wanted = math.floor(group.units * ratio + _EPS)
    return max(0, min(wanted, group.units - max(1, group.min_units)))


# ---------------------------------------------------------------- importance


def _channel_terms(module: nn.Module, is_root: bool, channels: int, power: int) -> torch.Tensor | None:
    """Sum |w|^power per channel of one member: root output rows (+bias), norm scales, consumer input columns."""
    weight = getattr(module, "weight", None)
    if not isinstance(weight, torch.Tensor):
        return None
    w = weight.detach().to(torch.float64).abs().pow(power)
    if is_root:
        if w.shape[0] != channels:
            raise PruneError(f"root weight has {w.shape[0]} output channels, group expects {channels}")
        terms = w.reshape(channels, -1).sum(1)
        bias = getattr(module, "bias", None)
        if isinstance(bias, torch.Tensor):
            terms = terms + bias.detach().to(torch.float64).abs().pow(power)
        return terms
    if w.ndim == 1 and w.shape[0] == channels:  # BatchNorm / LayerNorm scale of the pruned channels
        return w
    if w.ndim >= 2 and w.shape[1] == channels and getattr(module, "groups", 1) == 1:  # consumer's input columns
        return w.transpose(0, 1).reshape(channels, -1).sum(1)
    return None


def unit_scores(model: nn.Module, group: PrunableGroup, importance: Literal["l2", "l1"] = "l2") -> torch.Tensor:
    """Score each unit of `group` by the norm of all its weights across the group's members.

    A unit's weights are its rows (and bias) in every root, its scale in a member norm layer, and its input
    columns in every consumer member (e.g. fc2, o_proj, the next conv). For heads a unit spans `unit_size`
    consecutive channels.

    Returns:
        A float64 tensor of shape (units,): L2 norm (importance="l2") or L1 norm ("l1").
    """
    if importance not in ("l2", "l1"):
        raise ValueError(f"unknown importance {importance!r}: use l2, l1 or random")
    power = 2 if importance == "l2" else 1
    channels = group.units * group.unit_size
    per_channel = torch.zeros(channels, dtype=torch.float64)
    for name in group.members:
        terms = _channel_terms(model.get_submodule(name), name in group.roots, channels, power)
        if terms is not None:
            per_channel += terms
    per_unit = per_channel.view(group.units, group.unit_size).sum(1)
    return per_unit.sqrt() if power == 2 else per_unit


def select_units(
    model: nn.Module, group: PrunableGroup, n_remove: int, importance: Importance = "l2", seed: int = 0
) -> list[int]:
    """Pick the `n_remove` least important units (channels or heads) of `group`.

    Args:
        model: The model holding the group's modules.
        group: The group to prune.
        n_remove: How many units to remove (0..units).
        importance: "l2" or "l1" group norm (see `unit_scores`; ties go to the lower index), or "random",
            seeded by `seed` and the group name (so different groups get different draws).
        seed: Seed of the random choice.

    Returns:
        Sorted unit indices.
    """
    if not 0 <= n_remove <= group.units:
        raise ValueError(f"cannot remove {n_remove} of {group.units} units of {group.name}")
    if n_remove == 0:
        return []
    if importance == "random":
        generator = torch.Generator().manual_seed(seed + zlib.crc32(group.name.encode()))
        return sorted(torch.randperm(group.units, generator=generator)[:n_remove].tolist())
    scores = unit_scores(model, group, importance).tolist()
    order = sorted(range(group.units), key=lambda unit: (scores[unit], unit))
    return sorted(order[:n_remove])


# ---------------------------------------------------------------- forward helpers


def _takes_pixel_values(model: nn.Module) -> bool:
    try:
        return "pixel_values" in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False


def _call(model: nn.Module, inputs: Any) -> Any:
    """Run `model` on a tensor (as pixel_values for HF models) or a dict of keyword inputs."""
    if isinstance(inputs, Mapping):
        return model(**inputs)
    if _takes_pixel_values(model):
        return model(pixel_values=inputs)
    return model(inputs)


def _logits(output: Any) -> torch.Tensor:
    """Extract logits from a model output (ModelOutput, tuple or tensor)."""
    if isinstance(output, torch.Tensor):
        return output
    logits = getattr(output, "logits", None)
    if isinstance(logits, torch.Tensor):
        return logits
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    raise TypeError(f"cannot find logits in a {type(output).__name__}")


def _forward_logits(model: nn.Module, inputs: Any) -> torch.Tensor:
    return _logits(_call(model, inputs))


def _batch_size(inputs: Any) -> int:
    if isinstance(inputs, Mapping):
        inputs = inputs.get("pixel_values", next(iter(inputs.values())))
    return int(inputs.shape[0])


def _clone_inputs(inputs: Any) -> Any:
    """Copy inputs into normal (non-inference) tensors so autograd can trace them."""
    if isinstance(inputs, Mapping):
        return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
    return inputs.clone()


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
                example_inputs=_clone_inputs(example_inputs),
                forward_fn=_forward_logits,
                ignored_params=ignored,
                verbose=False,
            )
        except Exception as exc:  # noqa: BLE001 - any tracing failure means this model cannot be pruned here
            reason = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
            raise PruneError(f"cannot trace {type(model).__name__} for pruning: {reason}") from exc


def per_head_params(groups: Iterable[PrunableGroup]) -> list[str]:
    """Collect the per-head parameter names the groups declare in extra["per_head_params"]."""
    return [name for group in groups for name in group.extra.get("per_head_params", [])]


def count_params(model: nn.Module) -> int:
    """Count the model's parameters."""
    return sum(p.numel() for p in model.parameters())


# ---------------------------------------------------------------- dependency checks


def _is_under(name: str, prefixes: Iterable[str]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def _channels_of(group: PrunableGroup, units: Iterable[int]) -> list[int]:
    """Expand unit indices into channel indices (unit_size consecutive channels per unit)."""
    return [u * group.unit_size + j for u in units for j in range(group.unit_size)]


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


def _dependency_groups(
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
        layers = {(dg._module2name[i.dep.target.module], i.dep.handler) for i in dep_group.items
                  if i.dep.target.module in dg._module2name}
        if layers & touched:
            raise PruneError(f"group {group.name}: roots couple to the same layers without being coupled together")
        touched |= layers
        covered |= hit
        result.append(dep_group)
    return result


def _protected_names(adapter: FamilyAdapter, model: nn.Module, extra: Iterable[str] | None) -> list[str]:
    return list(dict.fromkeys([*adapter.protected_modules(model), *(extra or [])]))


# ---------------------------------------------------------------- pruning


@dataclass(frozen=True)
class _Step:
    group: PrunableGroup
    ratio: float
    n_remove: int


def _plan_steps(
    adapter: FamilyAdapter, model: nn.Module, entries: Iterable[PruneEntry | Mapping[str, Any]]
) -> list[_Step]:
    groups = adapter.prunable_groups(model)
    ratios = match_groups(groups, entries)
    return [_Step(g, ratios[g.name], units_to_remove(g, ratios[g.name])) for g in groups if g.name in ratios]


def _check_step(dg: tp.DependencyGraph, model: nn.Module, step: _Step, protected: list[str]) -> None:
    """Check one step without changing anything: targets, live sizes and the traced coupling.

    Raises:
        PruneError: On the first problem found.
    """
    group = step.group
    if _is_under(group.module, protected) or any(_is_under(r, protected) for r in group.roots):
        raise PruneError(f"group {group.name} targets protected module {group.module}")
    for root in group.roots:
        width = model.get_submodule(root).weight.shape[0]
        if width != group.units * group.unit_size:
            raise PruneError(f"group {group.name}: {root} has {width} outputs, not {group.units} units")
    if step.n_remove:
        _dependency_groups(dg, model, group, list(range(group.units * group.unit_size)), protected)


def _validate_steps(
    dg: tp.DependencyGraph,
    model: nn.Module,
    steps: list[_Step],
    protected: list[str],
    adapter: FamilyAdapter,
    report: PruneReport,
) -> list[_Step]:
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


def _prune_step(
    dg: tp.DependencyGraph | None,
    model: nn.Module,
    step: _Step,
    adapter: FamilyAdapter,
    protected: list[str],
    importance: Importance,
    seed: int,
) -> list[int]:
    """Remove the chosen units of one group and return their indices."""
    removed = select_units(model, step.group, step.n_remove, importance, seed)
    if not removed:
        return removed
    if dg is None:
        raise PruneError(f"group {step.group.name}: no dependency graph was built")
    dep_groups = _dependency_groups(dg, model, step.group, _channels_of(step.group, removed), protected)
    if step.group.kind == "head":
        adapter.before_head_prune(model, step.group, removed)
    for dep_group in dep_groups:
        dep_group.prune(record_history=False)
    return removed


def _verify_sizes(model: nn.Module, steps: list[_Step], applied: list[dict[str, Any]]) -> None:
    """Check every root now has exactly units_after * unit_size output channels."""
    for step, row in zip(steps, applied, strict=True):
        expected = row["units_after"] * step.group.unit_size
        for root in step.group.roots:
            weight = model.get_submodule(root).weight
            if weight.shape[0] != expected:
                raise PruneError(f"group {step.group.name}: {root} has {weight.shape[0]} outputs, expected {expected}")


def _applied_row(step: _Step, removed: list[int]) -> dict[str, Any]:
    group = step.group
    return {
        "group": group.name,
        "module": group.module,
        "kind": group.kind,
        "ratio": step.ratio,
        "units_before": group.units,
        "units_after": group.units - len(removed),
        "removed": removed,
    }


VERIFY_TOLERANCE = 1e-3  # largest |pruned - masked| logit gap accepted, relative to 1 + max |masked logit|


def mask_removed_units(
    model: nn.Module, applied: Iterable[Mapping[str, Any]], groups: Mapping[str, PrunableGroup]
) -> None:
    """Zero, in an unpruned model, the input channels that read the removed units (what pruning must equal).

    A removed unit contributes nothing downstream once every member that consumes it (fc2, o_proj, the next conv)
    has zero input columns for it, so the masked model computes exactly what the pruned model should.

    Args:
        model: An unpruned copy of the model; changed in place.
        applied: `PruneReport.applied` rows (group name and removed unit indices).
        groups: The groups the rows name, with their sizes before pruning, by name.
    """
    with torch.no_grad():
        for row in applied:
            if not row["removed"]:
                continue
            group = groups[row["group"]]
            channels = _channels_of(group, row["removed"])
            width = group.units * group.unit_size
            for name in group.members:
                module = model.get_submodule(name)
                weight = getattr(module, "weight", None)
                consumer = isinstance(weight, torch.Tensor) and weight.ndim >= 2 and weight.shape[1] == width
                if name not in group.roots and consumer and getattr(module, "groups", 1) == 1:
                    weight[:, channels] = 0.0


def _verification_inputs(example_inputs: Any, seed: int) -> Any:
    """Return seeded standard-normal pixels shaped like the example's (a zero batch can hide channel mix-ups)."""
    pixels = example_inputs.get("pixel_values") if isinstance(example_inputs, Mapping) else example_inputs
    if not isinstance(pixels, torch.Tensor) or not pixels.is_floating_point():
        return example_inputs
    noise = torch.randn(pixels.shape, generator=torch.Generator().manual_seed(seed), dtype=pixels.dtype)
    noise = noise.to(pixels.device)
    return {**example_inputs, "pixel_values": noise} if isinstance(example_inputs, Mapping) else noise


def _verify_against_masking(
    reference: nn.Module,
    model: nn.Module,
    report: PruneReport,
    groups: Mapping[str, PrunableGroup],
    example_inputs: Any,
    seed: int,
) -> None:
    """Check the pruned model computes what the unpruned `reference` computes with the removed units masked.

    Raises:
        PruneError: The outputs differ, or the pruned model no longer runs: an operation between a group's
            layers reorders or mixes channels, which the dependency graph cannot see.
    """
    mask_removed_units(reference, report.applied, groups)
    inputs = _verification_inputs(example_inputs, seed)
    where = f"{report.family} adapter on {type(model).__name__}"
    with torch.inference_mode():
        expected = _forward_logits(reference.eval(), inputs).float()
        try:
            got = _forward_logits(model, inputs).float()
        except Exception as exc:  # noqa: BLE001 - a pruned model that no longer runs is the finding
            reason = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
            raise PruneError(f"pruning is unsafe for this model ({where}): the pruned model fails: {reason}") from exc
    gap = (got - expected).abs().max().item() if got.shape == expected.shape else math.inf
    limit = VERIFY_TOLERANCE * (1.0 + expected.abs().max().item())
    if not gap <= limit:
        raise PruneError(
            f"pruning is unsafe for this model ({where}): outputs differ from masking the removed units by "
            f"{gap:.3g} (limit {limit:.3g}); an operation between a group's layers reorders or mixes channels"
        )


def prune_model(
    model: nn.Module,
    entries: Iterable[PruneEntry | Mapping[str, Any]],
    example_inputs: Any,
    *,
    importance: Importance = "l2",
    seed: int = 0,
    protected: Iterable[str] | None = None,
    adapter: FamilyAdapter | None = None,
    verify: bool | None = None,
) -> PruneReport:
    """Prune `model` in place by the plan entries and repair it with its family adapter.

    Each matched group loses floor(units * ratio) units (clamped so `min_units` remain; 0 removes nothing),
    chosen by `select_units`. Couplings come from torch-pruning's DependencyGraph traced on `example_inputs`;
    every coupling is checked against the group's members and the protected modules before any weight changes.
    The model is left in eval mode.

    Args:
        model: The model to prune; mutated, so pass a fresh copy.
        entries: PruneEntry objects or dicts with layer/type/ratio; later entries override earlier ones.
        example_inputs: A pixel_values tensor (or a dict of model inputs) used to trace the graph.
        importance: "l2", "l1" or "random".
        seed: Seed for random importance.
        protected: Module names to protect in addition to the adapter's own. A protected module (or anything
            under it) never loses output channels and is never reached by a group it is not a member of; the only
            change allowed is losing input channels as a declared member (a ResNet block's last conv consuming
            its pruned middle conv).
        adapter: Family adapter; picked with `adapter_for` when omitted.
        verify: Compare the pruned model's logits with an unpruned copy whose removed units are masked (see
            `mask_removed_units`) on seeded random inputs shaped like `example_inputs`. None (the default)
            verifies only with an unsafe (generic fallback) adapter; it costs a copy of the model and two forwards.

    Returns:
        A PruneReport.

    Raises:
        ValueError: On an invalid entry.
        PruneError: When a group would reach a protected module or outside its members (generic adapter
            groups are skipped instead), the model cannot be traced, the result does not have the expected
            sizes, or verification finds the pruned model differs from the masked one.
    """
    adapter = adapter or adapter_for(model)
    guard = _protected_names(adapter, model, protected)
    report = PruneReport(family=adapter.name, params_before=count_params(model))
    frozen = {name for name, p in model.named_parameters() if not p.requires_grad}
    steps = _plan_steps(adapter, model, entries)
    check = (not adapter.safe) if verify is None else verify
    reference = copy.deepcopy(model) if check and any(step.n_remove for step in steps) else None
    with torch.inference_mode(False):  # new weights must be normal tensors even if the caller is in inference mode
        dg = None
        if any(step.n_remove for step in steps):
            dg = build_dependency_graph(model, example_inputs, per_head_params(adapter.prunable_groups(model)))
            steps = _validate_steps(dg, model, steps, guard, adapter, report)
        for step in steps:
            report.applied.append(_applied_row(step, _prune_step(dg, model, step, adapter, guard, importance, seed)))
        report.attrs = adapter.fix_up(model)
    _verify_sizes(model, steps, report.applied)
    for name, param in model.named_parameters():  # torch-pruning replaces pruned Parameters with trainable ones
        param.requires_grad_(name not in frozen)
    report.params_after = count_params(model)
    model.eval()
    if reference is not None:
        _verify_against_masking(reference, model, report, {s.group.name: s.group for s in steps}, example_inputs, seed)
    logger.info(
        "pruned %d groups (%s): params %d -> %d", len(report.applied), adapter.name, report.params_before,
        report.params_after,
    )
    return report


# ---------------------------------------------------------------- checks


def _attention_problem(name: str, module: nn.Module) -> str | None:
    """Describe an inconsistency between an attention module's head count, head_dim and projections."""
    q_proj, head_dim = getattr(module, "q_proj", None), getattr(module, "head_dim", None)
    heads = getattr(module, "num_attention_heads", getattr(module, "num_heads", None))
    if not isinstance(q_proj, nn.Linear) or not isinstance(head_dim, int) or not isinstance(heads, int):
        return None
    width = q_proj.out_features
    if heads * head_dim != width:
        return f"{name}: {heads} heads x head_dim {head_dim} != q_proj out_features {width}"
    for proj in ("k_proj", "v_proj"):
        other = getattr(module, proj, None)
        if isinstance(other, nn.Linear) and other.out_features != width:
            return f"{name}: {proj} out_features {other.out_features} != q_proj out_features {width}"
    o_proj = getattr(module, "o_proj", None)
    if isinstance(o_proj, nn.Linear) and o_proj.in_features != width:
        return f"{name}: o_proj in_features {o_proj.in_features} != q_proj out_features {width}"
    return None


def self_check(model: nn.Module, example_inputs: Any, num_labels: int) -> None:
    """Check a (pruned) model: attention sizes agree, and one eval forward gives finite (B, num_labels) logits.

    Raises:
        PruneCheckError: With a one-line reason.
    """
    for name, module in model.named_modules():
        problem = _attention_problem(name, module)
        if problem:
            raise PruneCheckError(problem)
    model.eval()
    with torch.inference_mode():
        try:
            logits = _forward_logits(model, example_inputs)
        except Exception as exc:  # noqa: BLE001 - any failure of the forward pass is the finding
            raise PruneCheckError(f"forward pass failed: {type(exc).__name__}: {exc}".splitlines()[0]) from exc
    expected = (_batch_size(example_inputs), num_labels)
    if tuple(logits.shape) != expected:
        raise PruneCheckError(f"logits shape {tuple(logits.shape)} != expected {expected}")
    if not torch.isfinite(logits).all():
        raise PruneCheckError("logits contain NaN or Inf")


# ---------------------------------------------------------------- analytic estimate

_WEIGHTED = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)


@dataclass
class _Shape:
    """Live (simulated) size of one member while the estimate walks the plan."""

    out: int  # output channels (rows)
    inp: int  # input channels (columns; 0 for norms)
    kernel: int  # weights per (row, column) pair: k*k for convs, 1 for Linear
    per_out: int  # parameters per output channel besides the weight row: bias, norm scale/shift


def _shape_of(module: nn.Module) -> _Shape:
    weight = getattr(module, "weight", None)
    if isinstance(module, _WEIGHTED) and isinstance(weight, torch.Tensor) and getattr(module, "groups", 1) == 1:
        bias = 1 if getattr(module, "bias", None) is not None else 0
        return _Shape(weight.shape[0], weight.shape[1], weight[0, 0].numel(), bias)
    params = list(module.parameters(recurse=False))
    if params and all(p.ndim == 1 and p.shape[0] == params[0].shape[0] for p in params):  # a norm layer
        return _Shape(params[0].shape[0], 0, 0, len(params))
    return _Shape(0, 0, 0, 0)  # parameters that do not shrink with channels (handled via per_head_params)


def _positions(model: nn.Module, example_inputs: Any) -> dict[str, float]:
    """Return, per Linear/Conv module, its output positions per image (tokens, or H*W), from one forward."""
    names = {m: n for n, m in model.named_modules() if isinstance(m, _WEIGHTED)}
    batch = _batch_size(example_inputs)
    positions: dict[str, float] = {}

    def hook(module: nn.Module, _inputs: Any, output: torch.Tensor) -> None:
        width = module.out_features if isinstance(module, nn.Linear) else module.out_channels
        positions[names[module]] = output.numel() / (batch * width)

    handles = [m.register_forward_hook(hook) for m in names]
    model.eval()
    try:
        with torch.inference_mode():
            _call(model, example_inputs)
    finally:
        for handle in handles:
            handle.remove()
    return positions


def _shrink(shape: _Shape, is_root: bool, n: int, positions: float) -> tuple[int, float]:
    """Remove `n` channels from a member (output rows for roots and norms, input columns for consumers).

    Returns:
        (parameters removed, MACs per image removed; norms count no MACs).
    """
    if is_root or shape.inp == 0:
        params = n * (shape.inp * shape.kernel + shape.per_out)
        macs = n * shape.inp * shape.kernel * positions
        shape.out -= n
    else:
        params = n * shape.out * shape.kernel
        macs = n * shape.out * shape.kernel * positions
        shape.inp -= n
    return params, macs


def estimate_pruning(
    model: nn.Module,
    entries: Iterable[PruneEntry | Mapping[str, Any]],
    example_inputs: Any = None,
    *,
    adapter: FamilyAdapter | None = None,
) -> dict[str, Any]:
    """Predict, without pruning, the parameters (and MACs) the entries would remove.

    Groups are walked in the order `prune_model` applies them, on simulated layer sizes, so groups that share a
    layer (a bottleneck's middle conv loses input columns to conv1 and output rows to conv2) are not counted
    twice. Params are exact: root rows and biases, norm scales/shifts, consumer columns, declared per-head
    tensors. MACs (only with `example_inputs`) count Linear/Conv multiply-accumulates per image; norm and
    attention-matmul costs are left out, so head pruning saves somewhat more than estimated.

    Returns:
        {family, params_before, params_removed, params_after, params_fraction_removed, macs_removed (or None),
        groups: [{group, module, kind, ratio, units, units_removed, units_after, params_removed, macs_removed}]}.
    """
    adapter = adapter or adapter_for(model)
    steps = _plan_steps(adapter, model, entries)
    positions = _positions(model, example_inputs) if example_inputs is not None else {}
    shapes: dict[str, _Shape] = {}
    rows = []
    for step in steps:
        group, n = step.group, step.n_remove * step.group.unit_size
        params = macs = 0.0
        for name in group.members:
            shape = shapes.setdefault(name, _shape_of(model.get_submodule(name)))
            p, m = _shrink(shape, name in group.roots, n, positions.get(name, 0.0))
            params, macs = params + p, macs + m
        for pname in group.extra.get("per_head_params", []):  # e.g. Swin's bias table: one column per head
            params += step.n_remove * (model.get_parameter(pname).numel() // group.units)
        rows.append(
            {
                "group": group.name, "module": group.module, "kind": group.kind, "ratio": step.ratio,
                "units": group.units, "units_removed": step.n_remove, "units_after": group.units - step.n_remove,
                "params_removed": int(params), "macs_removed": round(macs) if example_inputs is not None else None,
            }
        )
    before = count_params(model)
    removed_total = sum(row["params_removed"] for row in rows)
    return {
        "family": adapter.name,
        "params_before": before,
        "params_removed": removed_total,
        "params_after": before - removed_total,
        "params_fraction_removed": removed_total / before if before else 0.0,
        "macs_removed": sum(row["macs_removed"] for row in rows) if example_inputs is not None else None,
        "groups": rows,
    }
