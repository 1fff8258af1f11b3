"""Numerical checks of a pruned model: equivalence with masking and a sane forward pass."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import nn

from profiling_agent.tools.compression.families.base import PrunableGroup
from profiling_agent.tools.compression.units import PruneCheckError, PrunedGroup, PruneError, PruneReport, channels_of
from profiling_agent.tools.runtimes.forward import forward_logits

# ---------------------------------------------------------------- forward helpers


def batch_size_of(inputs: Any) -> int:
    """Return the batch size of example inputs (a tensor or a mapping holding pixel_values)."""
    if isinstance(inputs, Mapping):
        inputs = inputs.get("pixel_values", next(iter(inputs.values())))
    return int(inputs.shape[0])


def clone_inputs(inputs: Any) -> Any:
    """Copy inputs into normal (non-inference) tensors so autograd can trace them."""
    if isinstance(inputs, Mapping):
        return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
    return inputs.clone()


VERIFY_TOLERANCE = 1e-3  # largest |pruned - masked| logit gap accepted, relative to 1 + max |masked logit|


def mask_removed_units(model: nn.Module, applied: Iterable[PrunedGroup], groups: Mapping[str, PrunableGroup]) -> None:
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
            if not row.removed:
                continue
            group = groups[row.group]
            channels = channels_of(group, row.removed)
            width = group.units * group.unit_size
            for name in group.members:
                module = model.get_submodule(name)
                weight = getattr(module, "weight", None)
                if not isinstance(weight, torch.Tensor):
                    continue
                consumer = weight.ndim >= 2 and weight.shape[1] == width
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


def verify_against_masking(
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
    mask_removed_units(reference, [row for row in report.applied if row.kind != "block"], groups)
    inputs = _verification_inputs(example_inputs, seed)
    where = f"{report.family} adapter on {type(model).__name__}"
    with torch.inference_mode():
        expected = forward_logits(reference.eval(), inputs).float()
        try:
            got = forward_logits(model, inputs).float()
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
            logits = forward_logits(model, example_inputs)
        except Exception as exc:  # noqa: BLE001 - any failure of the forward pass is the finding
            raise PruneCheckError(f"forward pass failed: {type(exc).__name__}: {exc}".splitlines()[0]) from exc
    expected = (batch_size_of(example_inputs), num_labels)
    if tuple(logits.shape) != expected:
        raise PruneCheckError(f"logits shape {tuple(logits.shape)} != expected {expected}")
    if not torch.isfinite(logits).all():
        raise PruneCheckError("logits contain NaN or Inf")
