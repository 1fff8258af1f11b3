"""Side-by-side latency of several models: same inputs, interleaved seeded order, median of repeats."""

from __future__ import annotations

import random
import statistics
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from profiling_agent.tools.device import resolve_device
from profiling_agent.tools.models.forward import forward_logits, timed_forward_ms

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


def measure_latency(
    models: Mapping[str, nn.Module],
    sample: torch.Tensor,
    *,
    batch_size: int = 32,
    warmup: int = 3,
    repeats: int = 10,
    device: str = "cpu",
) -> dict[str, dict[str, Any]]:
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
