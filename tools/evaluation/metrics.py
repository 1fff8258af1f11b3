"""Accuracy, agreement and memory measurements of image classifiers."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from profiling_agent.tools.device import resolve_device
from profiling_agent.tools.models.forward import forward_logits


@dataclass
class EvalConfig:
    """How candidates are measured; the same settings apply to the baseline and every candidate."""

    batch_size: int = 32  # images in the "batch" latency measurement (batch 1 is always measured too)
    warmup: int = 3  # untimed forward passes per model and batch size before timing
    repeats: int = 10  # timed passes per model and batch size; the median is reported
    eval_batch_size: int = 64  # images per forward pass when predicting the accuracy subset
    device: str = "cpu"  # cpu | cuda | auto (dynamically quantized models run on CPU only)


# ---------------------------------------------------------------- accuracy


def predict(
    model: nn.Module,
    pixels: torch.Tensor,
    *,
    batch_size: int = 64,
    device: str = "cpu",
    allowed_ids: Sequence[int] | torch.Tensor | None = None,
) -> torch.Tensor:
    """Predict class ids for a pixel tensor (N, C, H, W), batch by batch.

    Args:
        model: Classifier (HF or plain); put in eval mode and moved to `device` in place.
        pixels: Preprocessed images.
        batch_size: Images per forward pass.
        device: cpu | cuda | auto.
        allowed_ids: Model label ids the argmax may choose from (the dataset's labels when they are a subset
            of the model's); None allows every logit.

    Returns:
        A CPU int64 tensor of N predicted model label ids.
    """
    if batch_size < 1:
        raise ValueError("batch_size must be at least 1")
    dev = resolve_device(device)
    model.eval().to(dev)
    allowed = None if allowed_ids is None else torch.as_tensor(allowed_ids, dtype=torch.long).flatten().cpu()
    if allowed is not None and allowed.numel() == 0:
        raise ValueError("allowed_ids is empty")
    preds = []
    with torch.inference_mode():
        for start in range(0, len(pixels), batch_size):
            logits = forward_logits(model, pixels[start : start + batch_size].to(dev)).float().cpu()
            preds.append(_argmax(logits, allowed))
    return torch.cat(preds) if preds else torch.empty(0, dtype=torch.long)


def _argmax(logits: torch.Tensor, allowed: torch.Tensor | None) -> torch.Tensor:
    if allowed is None:
        return logits.argmax(dim=1)
    if int(allowed.max()) >= logits.shape[1] or int(allowed.min()) < 0:
        raise ValueError(f"allowed_ids must lie in [0, {logits.shape[1]}), got {allowed.tolist()}")
    return allowed[logits[:, allowed].argmax(dim=1)]


def _percent_equal(a: torch.Tensor, b: torch.Tensor, what: str) -> float:
    a, b = torch.as_tensor(a).flatten().cpu(), torch.as_tensor(b).flatten().cpu()
    if a.shape != b.shape:
        raise ValueError(f"{what}: {a.numel()} predictions vs {b.numel()} references")
    if a.numel() == 0:
        raise ValueError(f"{what}: no samples")
    return 100.0 * (a == b).double().mean().item()


def top1(preds: torch.Tensor, labels: torch.Tensor) -> float:
    """Return top-1 accuracy in percent."""
    return _percent_equal(preds, labels, "top1")


def agreement(preds: torch.Tensor, reference: torch.Tensor) -> float:
    """Return the percent of predictions equal to the reference model's predictions."""
    return _percent_equal(preds, reference, "agreement")


# ---------------------------------------------------------------- memory


def file_size_mb(path: str | os.PathLike) -> float:
    """Return the size in MB (10^6 bytes) of a file, or of all files under a folder."""
    path = Path(path)
    if path.is_dir():
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / 1e6
    return path.stat().st_size / 1e6
