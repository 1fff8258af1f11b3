"""Accuracy, agreement and memory measurements of image classifiers."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from profiling_agent.tools.data.stream import iter_batches
from profiling_agent.tools.device import resolve_device
from profiling_agent.tools.runtimes.forward import forward_logits


@dataclass
class EvalConfig:
    """How candidates are measured; the same settings apply to the baseline and every candidate."""

    batch_size: int = 32  # images in the "batch" latency measurement (batch 1 is always measured too)
    warmup: int = 3  # untimed forward passes per model and batch size before timing
    repeats: int = 10  # timed passes per model and batch size; the median is reported
    eval_batch_size: int = 64  # images per forward pass when predicting the accuracy subset
    device: str = "cpu"  # cpu | cuda | auto (dynamically quantized models run on CPU only)


GPU_EVAL_BATCH = 256  # fewest images per accuracy forward pass on a GPU


# ---------------------------------------------------------------- accuracy


def accuracy_batch(eval_batch: int, device: str | torch.device) -> int:
    """Return the accuracy batch size: the context's, and at least GPU_EVAL_BATCH images on a GPU."""
    return max(eval_batch, GPU_EVAL_BATCH) if str(device).startswith("cuda") else eval_batch


def concurrent_models(device: str | torch.device, threads: int, models: int) -> int:
    """Return how many models may predict at once: CPU cores / torch threads on the CPU (1 on a GPU: one stream).

    More would only make the models' intra-op threads fight for the same cores.
    """
    if str(device).startswith("cuda"):
        return 1
    return max(1, min(models, (os.cpu_count() or 1) // max(1, threads)))


def predict(
    model: nn.Module,
    pixels: Any,
    *,
    batch_size: int = 64,
    device: str = "cpu",
    allowed_ids: Sequence[int] | torch.Tensor | None = None,
    autocast: torch.dtype | None = None,
) -> torch.Tensor:
    """Predict class ids for a pixel tensor (N, C, H, W) or an ImageStream, batch by batch.

    Args:
        model: Classifier (HF or plain); put in eval mode and moved to `device` in place.
        pixels: Preprocessed images, or an ImageStream that preprocesses them per batch.
        batch_size: Images per forward pass.
        device: cpu | cuda | auto.
        allowed_ids: Model label ids the argmax may choose from (the dataset's labels when they are a subset
            of the model's); None allows every logit.
        autocast: Run the forward passes under torch.autocast with this dtype on CUDA (None: full precision).

    Returns:
        A CPU int64 tensor of N predicted model label ids.
    """
    return predict_many(
        {"model": model}, pixels, batch_size=batch_size, device=device, allowed_ids=allowed_ids, autocast=autocast
    )["model"]


def predict_many(
    models: Mapping[str, nn.Module],
    pixels: Any,
    *,
    batch_size: int = 64,
    device: str = "cpu",
    allowed_ids: Sequence[int] | torch.Tensor | None = None,
    parallel: int = 1,
    autocast: torch.dtype | None = None,
) -> dict[str, torch.Tensor]:
    """Predict with several models in one pass over the images: each batch is decoded once and fed to every model.

    Args:
        models: Name -> classifier (each put in eval mode and moved to `device` in place).
        pixels: A pixel tensor or an ImageStream (read in order, one batch decoded ahead).
        batch_size: Images per forward pass.
        device: cpu | cuda | auto.
        allowed_ids: Model label ids the argmax may choose from.
        parallel: Models run concurrently on each batch (a thread pool; 1: one after the other). Predictions do not
            depend on it; never use it while timing.
        autocast: torch.autocast dtype for the forward passes on CUDA (None: full precision).

    Returns:
        {name: CPU int64 tensor of predicted model label ids}.
    """
    if batch_size < 1:
        raise ValueError("batch_size must be at least 1")
    dev = resolve_device(device)
    for model in models.values():
        model.eval().to(dev)
    allowed = None if allowed_ids is None else torch.as_tensor(allowed_ids, dtype=torch.long).flatten().cpu()
    if allowed is not None and allowed.numel() == 0:
        raise ValueError("allowed_ids is empty")
    cast = autocast is not None and dev.type == "cuda"

    def run(model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode(), torch.autocast(dev.type, dtype=autocast, enabled=cast):
            return _argmax(forward_logits(model, batch).float().cpu(), allowed)

    preds: dict[str, list[torch.Tensor]] = {name: [] for name in models}
    pool = ThreadPoolExecutor(max_workers=parallel) if parallel > 1 and len(models) > 1 else None
    try:
        for batch in iter_batches(pixels, batch_size, pin_memory=dev.type == "cuda"):
            batch = batch.to(dev, non_blocking=True)
            if pool is None:
                outs = [run(model, batch) for model in models.values()]
            else:
                outs = list(pool.map(lambda m: run(m, batch), models.values()))  # noqa: B023 - used at once
            for name, out in zip(models, outs, strict=True):
                preds[name].append(out)
    finally:
        if pool is not None:
            pool.shutdown()
    return {name: torch.cat(p) if p else torch.empty(0, dtype=torch.long) for name, p in preds.items()}


def class_ids(logits: torch.Tensor, allowed_ids: Sequence[int] | torch.Tensor | None = None) -> torch.Tensor:
    """Return the class ids `predict` gives for these logits: the argmax over the `allowed_ids` columns (None: all)."""
    allowed = None if allowed_ids is None else torch.as_tensor(allowed_ids, dtype=torch.long).flatten().cpu()
    return _argmax(logits.float().cpu(), allowed)


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


def mean_kl(reference: torch.Tensor, logits: torch.Tensor, allowed_ids: Sequence[int] | None = None) -> float:
    """Return the mean KL(softmax(reference) || softmax(logits)) over the rows, on the `allowed_ids` columns only."""
    if allowed_ids is not None:
        columns = torch.as_tensor(list(allowed_ids), dtype=torch.long)
        reference, logits = reference[:, columns], logits[:, columns]
    ref, got = torch.log_softmax(reference.float(), -1), torch.log_softmax(logits.float(), -1)
    return float(torch.nn.functional.kl_div(got, ref, log_target=True, reduction="batchmean"))


def top1(preds: torch.Tensor, labels: torch.Tensor) -> float:
    """Return top-1 accuracy in percent."""
    return _percent_equal(preds, labels, "top1")


def agreement(preds: torch.Tensor, reference: torch.Tensor) -> float:
    """Return the percent of predictions equal to the reference model's predictions."""
    return _percent_equal(preds, reference, "agreement")


def agreement_probe(
    reference_model: nn.Module,
    pixels: Any,
    *,
    allowed_ids: Sequence[int] | None = None,
    device: str = "cpu",
    reference: torch.Tensor | None = None,
) -> Callable[[nn.Module, str], float]:
    """Predict `pixels` with the reference model once; return agree(model, device): another model's agreement.

    `reference`: the reference model's predictions on `pixels` when already known (it is then not run).
    """
    if reference is None:
        reference = predict(reference_model, pixels, allowed_ids=allowed_ids, device=device)

    def agree(model: nn.Module, on: str) -> float:
        return agreement(predict(model, pixels, allowed_ids=allowed_ids, device=on), reference)

    return agree


# ---------------------------------------------------------------- memory


def file_size_mb(path: str | os.PathLike) -> float:
    """Return the size in MB (10^6 bytes) of a file, or of all files under a folder."""
    path = Path(path)
    if path.is_dir():
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / 1e6
    return path.stat().st_size / 1e6
