"""Accuracy, side-by-side latency and memory measurements of image classifiers."""

from __future__ import annotations

import logging
import os
import random
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from profiling_agent.tools.device import resolve_device
from profiling_agent.tools.profiling import count_params, forward_logits, packed_linear_tensors, timed_forward_ms

logger = logging.getLogger(__name__)

__all__ = [
    "EvalConfig",
    "agreement",
    "count_params",
    "file_size_mb",
    "latency_inputs",
    "measure_latency",
    "predict",
    "state_bytes",
    "top1",
]


@dataclass
class EvalConfig:
    """How candidates are measured; the same settings apply to the baseline and every candidate."""

    batch_size: int = 32  # images in the "batch" latency measurement (batch 1 is always measured too)
    warmup: int = 3  # untimed forward passes per model and batch size before timing
    repeats: int = 10  # timed passes per model and batch size; the median is reported
    eval_batch_size: int = 64  # images per forward pass when predicting the accuracy subset
    device: str = "cpu"  # cpu | cuda | auto (dynamically quantized models run on CPU only)


# ---------------------------------------------------------------- accuracy


def predict(model: nn.Module, pixels: torch.Tensor, *, batch_size: int = 64, device: str = "cpu",
            allowed_ids: Sequence[int] | torch.Tensor | None = None) -> torch.Tensor:
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
            logits = forward_logits(model, pixels[start:start + batch_size].to(dev)).float().cpu()
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


_BYTES_PER_ELEMENT = {torch.qint8: 1, torch.quint8: 1, torch.float16: 2, torch.bfloat16: 2}


def _packed_bytes(module: nn.Module) -> int:
    """Bytes of a quantized Linear's packed weight (in its storage dtype), bias and per-channel qparams."""
    packed = packed_linear_tensors(module)
    if packed is None:
        return 0
    weight, bias, dtype = packed
    # fp16 packing hands the weight back as fp32; count the fp16 storage it really uses.
    total = weight.numel() * _BYTES_PER_ELEMENT.get(dtype, weight.element_size())
    if bias is not None:
        total += bias.numel() * bias.element_size()
    if weight.is_quantized and weight.qscheme() in (torch.per_channel_affine, torch.per_channel_symmetric):
        scales, zeros = weight.q_per_channel_scales(), weight.q_per_channel_zero_points()
        total += scales.numel() * scales.element_size() + zeros.numel() * zeros.element_size()
    return total


def state_bytes(model: nn.Module) -> int:
    """Return bytes of parameters and buffers, plus packed weights of quantized Linear modules.

    Shared tensors count once. Dynamically quantized Linear weights are not parameters; they are read from
    their packed params and counted in their storage dtype (1 byte for qint8, 2 for float16).
    """
    seen: set[int] = set()
    total = 0
    for tensor in [*model.parameters(), *model.buffers()]:
        if id(tensor) not in seen:
            seen.add(id(tensor))
            total += tensor.numel() * tensor.element_size()
    return total + sum(_packed_bytes(module) for module in model.modules())


def file_size_mb(path: str | os.PathLike) -> float:
    """Return the size in MB (10^6 bytes) of a file, or of all files under a folder."""
    path = Path(path)
    if path.is_dir():
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / 1e6
    return path.stat().st_size / 1e6


# ---------------------------------------------------------------- latency


def latency_inputs(sample: torch.Tensor, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Build the batch-1 and batch-`batch_size` inputs from one image (C, H, W) or a batch (N, C, H, W).

    A batch is sliced; when it has fewer than `batch_size` images it is repeated cyclically.
    """
    if batch_size < 1:
        raise ValueError("batch_size must be at least 1")
    if sample.dim() == 3:
        sample = sample.unsqueeze(0)
    if sample.dim() != 4 or len(sample) == 0:
        raise ValueError(f"sample must be (C, H, W) or a non-empty (N, C, H, W) batch, got {tuple(sample.shape)}")
    index = torch.arange(batch_size) % len(sample)
    return sample[:1].contiguous(), sample[index].contiguous()


def measure_latency(models: Mapping[str, nn.Module], sample: torch.Tensor, *, batch_size: int = 32, warmup: int = 3,
                    repeats: int = 10, device: str = "cpu") -> dict[str, dict[str, Any]]:
    """Measure batch-1 and batch-`batch_size` forward latency of several models side by side.

    Each repeat times every model once at batch 1, then every model once at the larger batch, in a seeded random
    order that changes with every repeat, so machine noise and any cost of switching between models (cold caches,
    another runtime's kernels) hit all models alike instead of always the same neighbour. Models are put in eval
    mode and moved to `device` in place; the thread count is whatever torch uses now.

    Returns:
        {name: {"latency_ms", "latency_batch_ms", "batch_size", "threads", "repeats"}}, medians in ms.
    """
    dev = resolve_device(device)
    single, batch = (t.to(dev) for t in latency_inputs(sample, batch_size))
    names = list(models)
    for name in names:
        models[name].eval().to(dev)
    times: dict[str, dict[str, list[float]]] = {name: {"single": [], "batch": []} for name in names}
    with torch.inference_mode():
        for _ in range(warmup):
            for name in names:
                forward_logits(models[name], single)
                forward_logits(models[name], batch)
        shuffler = random.Random(0)
        for _ in range(max(repeats, 1)):
            order = shuffler.sample(names, len(names))
            for name in order:
                times[name]["single"].append(timed_forward_ms(models[name], single))
            for name in order:
                times[name]["batch"].append(timed_forward_ms(models[name], batch))
    threads = torch.get_num_threads()
    return {
        name: {
            "latency_ms": statistics.median(times[name]["single"]),
            "latency_batch_ms": statistics.median(times[name]["batch"]),
            "batch_size": batch_size,
            "threads": threads,
            "repeats": max(repeats, 1),
        }
        for name in names
    }
