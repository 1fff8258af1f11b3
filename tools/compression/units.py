"""Which units (channels or heads) a plan entry removes from each prunable group, and by what importance."""

from __future__ import annotations

import math
import re
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, get_args

import torch
from pydantic import Field
from torch import nn

from profiling_agent.state import AppliedGroup, PruneEntry
from profiling_agent.tools.compression.families.base import PrunableGroup

Importance = Literal["l2", "l1", "random"]
KINDS = ("structured", "head", "block")
_EPS = 1e-9  # guards floor(units * ratio) against float error (0.29 * 100 = 28.999...)


class PruneError(RuntimeError):
    """Pruning cannot be applied as planned (protected module reached, bad coupling, size mismatch)."""


class PruneCheckError(RuntimeError):
    """A pruned model failed its numerical or structural self-check."""


class PrunedGroup(AppliedGroup):
    """One group as `prune_model` applied it, with the removed unit indices (channels, or heads)."""

    removed: list[int] = Field(default_factory=list, description="Indices of the removed units, sorted.")

    def applied(self) -> AppliedGroup:
        """Return the record the state keeps (the unit indices stay in the pruned artifact's JSON)."""
        return AppliedGroup.model_validate(self.model_dump(exclude={"removed"}))


@dataclass
class PruneReport:
    """What `prune_model` did.

    Attributes:
        family: Adapter name used (vit, resnet, ...).
        applied: One PrunedGroup per matched group: group, module, kind, ratio, units_before, units_after,
            removed (unit indices: channels, or heads).
        attrs: Attributes set by the adapter's fix_up, {module_name: {attr: value}}.
        params_before: Parameter count before pruning.
        params_after: Parameter count after pruning.
        skipped: Groups of an unsafe (generic) adapter dropped because their coupling was not safe, with reasons.
    """

    family: str
    applied: list[PrunedGroup] = field(default_factory=list)
    attrs: dict[str, dict[str, Any]] = field(default_factory=dict)
    params_before: int = 0
    params_after: int = 0
    skipped: list[dict[str, str]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """Return the report as plain JSON-ready data."""
        return {**asdict(self), "applied": [row.model_dump() for row in self.applied]}


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
    if kind == "block" and ratio not in (0.0, 1.0):
        raise ValueError(f"a block entry for {layer!r} removes whole blocks: its ratio must be 1.0, not {ratio:g}")
    if kind != "block" and not 0.0 <= ratio < 1.0:
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


def unit_align(kind: str, units: int) -> int:
    """Return the multiple a channel group's kept width is rounded to (1: none; heads are never rounded).

    CPU runtimes (ONNX Runtime's MLAS, OpenVINO's oneDNN) block convolution and GEMM channels by the vector width:
    16 float lanes with AVX-512, 8 with AVX2; tensor cores want multiples of 8. A width between two blocks pays
    for the next block and more, so a group of 32 channels or more keeps a multiple of 16, one of 16 or more a
    multiple of 8, and a smaller one any width.
    """
    if kind != "structured":
        return 1
    return 16 if units >= 32 else 8 if units >= 16 else 1


def removed_units(units: int, min_units: int, ratio: float, align: int = 1) -> int:
    """Return how many of `units` pruning at `ratio` removes: floor(units * ratio), keeping at least `min_units`.

    At least one unit stays unless `min_units` is 0, which only a block group has (one unit, removed whole at
    ratio 1.0); channel and head groups are built with `min_units` >= 1.

    With `align` > 1 the kept width is rounded to the nearest multiple of `align` (half up, at least `align`, at most
    `units`), so a pruned group's width stays a multiple of the runtimes' channel block (`unit_align`).
    This is the one rule; the engine, the uniform baselines, the planners' estimates and the probe all call it.
    """
    wanted = max(0, min(math.floor(units * ratio + _EPS), units - (max(1, min_units) if min_units else 0)))
    if align > 1 and wanted > 0:
        kept = max(align, align * math.floor((units - wanted) / align + 0.5), max(1, min_units))
        wanted = max(0, units - kept)
    return wanted


def units_to_remove(group: PrunableGroup, ratio: float) -> int:
    """Return how many units of `group` pruning at `ratio` removes (see `removed_units`).

    The engine removes what the ratio says; the deterministic planner chooses ratios whose kept widths are whole
    channel blocks (`unit_align`), and any other plan is applied as written.
    """
    return removed_units(group.units, group.min_units, ratio)


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


def as_importance(value: str) -> Importance:
    """Return `value` as an importance name (l2, l1 or random).

    Raises:
        ValueError: On any other name.
    """
    for name in get_args(Importance):
        if value == name:
            return name
    raise ValueError(f"unknown importance {value!r}: use l2, l1 or random")


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


def channels_of(group: PrunableGroup, units: Iterable[int]) -> list[int]:
    """Expand unit indices into channel indices (unit_size consecutive channels per unit)."""
    return [u * group.unit_size + j for u in units for j in range(group.unit_size)]
