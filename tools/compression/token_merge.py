"""Token merging for ViT and DeiT: choose a schedule (one rate or r per layer), check it and install it.

Width pruning shrinks the GEMMs' K and N; merging tokens (ToMe, Bolya et al., ICLR 2023) shrinks M, so the two
compose, and both compose with INT8. `apply_token_merging(model, schedule)` installs the merging forward of
`models.merged_tokens` on every layer: `schedule` is a list of r (tokens merged after each layer's attention) or one
rate r for every layer (capped per layer as ToMe does, so at least the protected tokens + 1 remain). A plan entry
`{"type": "tokens", "schedule": [...]}` or `{"type": "tokens", "rate": r}` names the same thing
(`schedule_from_entry`). Apply merging after pruning: the pruning engine traces the unmerged model. Swin
(windowed attention) and CNNs have no token axis and are refused with the reason.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from torch import nn

from profiling_agent.tools.models.merged_tokens import (
    PROTECTED,
    TokenScheduleError,
    check_schedule,
    install_token_merging,
    remove_token_merging,
    token_count,
    token_layers,
    token_schedule,
)

__all__ = [
    "TokenScheduleError",
    "apply_token_merging",
    "fit_schedule",
    "has_token_axis",
    "layer_count",
    "merge_planned",
    "remove_token_merging",
    "schedule_from_entry",
    "schedule_from_rate",
    "token_schedule",
    "tokens_per_layer",
    "tokens_unmerged",
]

Schedule = int | Sequence[int]


def schedule_from_rate(model: nn.Module, rate: int) -> list[int]:
    """Return ToMe's constant schedule: `rate` tokens per layer, capped where a layer has fewer to merge.

    Raises:
        TokenScheduleError: `rate` is not a whole number >= 0, or the model has no token axis.
    """
    if isinstance(rate, bool) or not isinstance(rate, int) or rate < 0:
        raise TokenScheduleError(f"a token merging rate must be a whole number >= 0, got {rate!r}")
    return _capped(model, [rate] * len(token_layers(model)[1]))


def _capped(model: nn.Module, wanted: Sequence[int]) -> list[int]:
    """Return `wanted` (one r per layer) with each r capped at half its layer's unprotected tokens, as ToMe caps."""
    model_type, layers = token_layers(model)
    tokens, protected = token_count(model), PROTECTED[model_type]
    schedule = []
    for layer, want in zip(layers, wanted, strict=True):
        r = min(want, (tokens - protected) // 2) if hasattr(layer, "attention") else 0
        schedule.append(r)
        tokens -= r
    return schedule


def resolve_schedule(model: nn.Module, schedule: Schedule) -> list[int]:
    """Return the per-layer schedule a rate or a list stands for, checked against the model.

    Raises:
        TokenScheduleError: See `schedule_from_rate` and `models.merged_tokens.check_schedule`.
    """
    if isinstance(schedule, Sequence):
        return check_schedule(model, schedule)
    return schedule_from_rate(model, schedule)


def apply_token_merging(model: nn.Module, schedule: Schedule) -> list[int]:
    """Make `model` merge tokens after each layer's attention, in place; return the per-layer schedule installed.

    The model stays an `nn.Module` with the same parameters (a saved artifact records the schedule and its loader
    installs it again); it exports to ONNX with only the batch axis dynamic. A schedule of zeros leaves the logits
    as they were. Installing again replaces the previous schedule.

    Args:
        model: A transformers ViTForImageClassification, DeiTForImageClassification or
            DeiTForImageClassificationWithTeacher (pruned or not).
        schedule: One r per layer, or one rate r for every layer (capped per layer).

    Returns:
        The installed schedule, one r per layer.

    Raises:
        TokenScheduleError: The model has no token axis (Swin, ResNet) or the schedule does not fit it.
    """
    values = resolve_schedule(model, schedule)
    install_token_merging(model, values)
    return values


def schedule_from_entry(model: nn.Module, entry: Mapping[str, Any]) -> list[int]:
    """Return the schedule a plan entry asks for: {"type": "tokens", "schedule": [...]} or {..., "rate": r}.

    Raises:
        TokenScheduleError: The entry is not a tokens entry, names neither or both, or does not fit the model.
    """
    if entry.get("type") != "tokens":
        raise TokenScheduleError(f"not a tokens entry: type {entry.get('type')!r}")
    has_schedule, has_rate = entry.get("schedule") is not None, entry.get("rate") is not None
    if has_schedule == has_rate:
        raise TokenScheduleError('a tokens entry needs exactly one of "schedule" (r per layer) and "rate" (one r)')
    if has_rate:
        return schedule_from_rate(model, entry["rate"])
    return check_schedule(model, entry["schedule"])


def tokens_per_layer(model: nn.Module, schedule: Schedule) -> list[int]:
    """Return how many tokens each layer's MLP sees under `schedule` (the first layer's attention sees them all)."""
    values = resolve_schedule(model, schedule)
    tokens, out = token_count(model), []
    for r in values:
        tokens -= r
        out.append(tokens)
    return out


def has_token_axis(model: nn.Module) -> str | None:
    """Return None when the model can merge tokens, else the one-line reason it cannot (Swin, CNNs)."""
    try:
        token_layers(model)
    except TokenScheduleError as err:
        return str(err)
    return None


def fit_schedule(model: nn.Module, schedule: Sequence[int]) -> list[int]:
    """Return `schedule` fitted to a model with fewer layers (its plan removed blocks).

    Its first r's in order, each capped at half the layer's unprotected tokens as ToMe caps a rate. A schedule no
    longer than the model's layers is returned as it is (`check_schedule` judges it).
    """
    layers = len(token_layers(model)[1])
    values = list(schedule)
    if len(values) <= layers or not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        return values
    return _capped(model, values[:layers])


def layer_count(model: nn.Module) -> int:
    """Return the model's transformer layers a schedule names (0 for a model without a token axis)."""
    return 0 if has_token_axis(model) is not None else len(token_layers(model)[1])


def merge_planned(
    model: nn.Module, entry: Mapping[str, Any] | Any | None, layers_before: int | None = None
) -> list[int] | None:
    """Install a plan's token entry on the (pruned) model, in place; return the schedule, or None without an entry.

    `entry` is a `state.TokenEntry` or its JSON. Prune first, then merge: the pruning engine traces the unmerged model.
    A schedule is written for the unpruned model's layers (the token axis measured it there): when the plan removed
    blocks (`layers_before`, the model's `layer_count` before pruning, is the schedule's length and more than the
    layers left) it keeps its first r's in order on the layers left, each capped as a rate is (`fit_schedule`), so a
    front-loaded schedule still merges in the first layers. Any other length is refused.

    Raises:
        TokenScheduleError: The model has no token axis, or the entry does not fit it (one line).
    """
    if entry is None:
        return None
    data = entry if isinstance(entry, Mapping) else entry.model_dump()
    written = data.get("schedule") if data.get("type") == "tokens" and data.get("rate") is None else None
    if isinstance(written, (list, tuple)) and layers_before and len(written) == layers_before > layer_count(model):
        data = {**data, "schedule": fit_schedule(model, written)}
    schedule = schedule_from_entry(model, data)
    install_token_merging(model, schedule)
    return schedule


@contextlib.contextmanager
def tokens_unmerged(model: nn.Module) -> Iterator[list[int] | None]:
    """Run the block with the model's token merging removed (every token kept), then install it again.

    For work that pairs the model's activations token by token with an unmerged model's (the least-squares refit of
    the pruned layers): merging has no parameters, so what is fitted unmerged holds merged. Yields the schedule.
    """
    schedule = token_schedule(model)
    if schedule is not None:
        remove_token_merging(model)
    try:
        yield schedule
    finally:
        if schedule is not None:
            install_token_merging(model, schedule)
