"""Layers of one shape: recognised by their structure, their timings pooled so each gets one figure.

A ViT's or DeiT's encoder layers, a ResNet stage's blocks after the first and a Swin stage's unshifted (or shifted)
blocks compute the same thing on the same shapes. Timed one by one, they still read different times (the caches, the
scheduler, a timer's microsecond steps), and a planner reading those differences prunes one layer's heads rather than
its twin's for no reason. So sibling layers of one structure form a class; every timing row under a member (the
member itself or a module below it) is replaced by the class's mean of the same row, which keeps the rows' sum and
gives identical layers identical shares by construction.

Structure is the module's class, the shapes of its parameters and buffers, and the scalar settings of it and every
module below it (a Swin block's `shift_size`, a convolution's stride); dropouts and drop paths (the identity at
inference, whatever their rate) and layer indices (a position, not a shape) are left out.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from torch import nn

SCALARS = (bool, int, float, str)
IGNORED = ("training", "drop", "idx", "index", "layer_id", "name_or_path")  # settings that do not change the cost


def _settings(module: nn.Module) -> tuple[tuple[str, Any], ...]:
    out = []
    for key, value in sorted(vars(module).items()):
        if key.startswith("_") or any(word in key for word in IGNORED):
            continue
        if isinstance(value, SCALARS) or (isinstance(value, tuple) and all(isinstance(v, SCALARS) for v in value)):
            out.append((key, value))
    return tuple(out)


def layer_signature(module: nn.Module) -> tuple[Any, ...]:
    """Return what makes two layers compute alike: classes, parameter and buffer shapes, scalar settings."""
    modules = tuple(
        (name, type(m).__qualname__, _settings(m))
        for name, m in module.named_modules()
        if "drop" not in name.rpartition(".")[2]  # a dropout or drop path is the identity at inference
    )
    tensors = tuple((name, tuple(t.shape)) for name, t in (*module.named_parameters(), *module.named_buffers()))
    return modules, tensors


def identical_layers(model: nn.Module) -> list[list[str]]:
    """Return the classes of sibling layers of one structure (module paths, two or more each, in model order).

    Siblings are the children of one `nn.ModuleList` or `nn.Sequential`; a layer in a class is not searched for
    classes inside it (its whole subtree is pooled with its twins').
    """
    classes: list[list[str]] = []
    claimed: list[str] = []
    for name, module in model.named_modules():
        if not isinstance(module, (nn.ModuleList, nn.Sequential)) or len(module) < 2:
            continue
        if any(name == c or name.startswith(c + ".") for c in claimed):
            continue
        by_signature: dict[tuple[Any, ...], list[str]] = {}
        for child_name, child in module.named_children():
            path = f"{name}.{child_name}" if name else child_name
            by_signature.setdefault(layer_signature(child), []).append(path)
        for members in by_signature.values():
            if len(members) >= 2:
                classes.append(members)
                claimed += members
    return classes


def _under(row: str, member: str) -> str | None:
    """Return `row`'s path below `member` ('' for the member itself), or None when it is not under it."""
    if row == member:
        return ""
    return row[len(member) :] if row.startswith(member + ".") else None


def pooled_rows(rows: Mapping[str, float], classes: Sequence[Sequence[str]]) -> dict[str, float]:
    """Return `rows` (module path -> time) with every row under a class member replaced by the class mean.

    The mean is over the class's members (a member without the row counts 0), so the rows' sum is unchanged.
    """
    out = dict(rows)
    for members in classes:
        suffixes = {s for row in rows for m in members if (s := _under(row, m)) is not None}
        for suffix in suffixes:
            mean = statistics.fmean(float(rows.get(m + suffix, 0.0)) for m in members)
            out.update({m + suffix: mean for m in members})
    return out


def pool_layer_rows(layers: list[dict[str, Any]], classes: Sequence[Sequence[str]], keys: Sequence[str]) -> None:
    """Pool the profile rows' `keys` (latency_ms, latency_share) over identical layers, in place (`pooled_rows`)."""
    by_name = {row["name"]: row for row in layers}
    for key in keys:
        pooled = pooled_rows({name: float(row.get(key, 0.0)) for name, row in by_name.items()}, classes)
        for name, value in pooled.items():
            if name in by_name:
                by_name[name][key] = value
