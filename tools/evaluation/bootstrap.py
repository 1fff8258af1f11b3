"""Paired bootstrap confidence intervals for an accuracy change measured on the same images."""

from __future__ import annotations

import math

import numpy as np
import torch

DEFAULT_RESAMPLES = 2000  # enough for stable 2.5% / 97.5% percentiles at the sizes we evaluate


def correct(preds: torch.Tensor, labels: torch.Tensor) -> np.ndarray:
    """Return a boolean array: which predictions equal their labels."""
    if preds.shape != labels.shape:
        raise ValueError(f"predictions {tuple(preds.shape)} and labels {tuple(labels.shape)} differ in shape")
    return (preds.cpu() == labels.cpu()).numpy()


def paired_delta_ci(
    candidate: np.ndarray,
    baseline: np.ndarray,
    *,
    level: float = 0.95,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
) -> tuple[float, float]:
    """Return the percentile interval of the accuracy change candidate - baseline, in percentage points.

    Both arrays say, per image, whether the model was right on the same images; each resample draws images
    with replacement and keeps the pairs together, so the interval reflects how much the change itself
    varies, not the spread of either accuracy alone. The interval always holds the observed change (the mean
    of the same per-image differences): a percentile interval could miss it only by a resample's granularity.

    Args:
        candidate: Per-image correctness of the candidate (bool).
        baseline: Per-image correctness of the baseline on the same images, in the same order.
        level: Coverage of the interval (0.95: the 2.5th and 97.5th percentiles).
        resamples: Bootstrap resamples.
        seed: Seed of the resampling.
    """
    cand, base = np.asarray(candidate, dtype=np.float64), np.asarray(baseline, dtype=np.float64)
    if cand.shape != base.shape or cand.ndim != 1:
        raise ValueError("candidate and baseline need one correctness value per image, same images")
    if not 0.0 < level < 1.0:
        raise ValueError("level must lie in (0, 1)")
    n = len(cand)
    if n == 0:
        raise ValueError("no images")
    diff = cand - base
    rng = np.random.default_rng(seed)
    means = np.empty(resamples)
    for start in range(0, resamples, 256):  # chunks keep memory flat for large subsets
        stop = min(start + 256, resamples)
        idx = rng.integers(0, n, size=(stop - start, n))
        means[start:stop] = diff[idx].mean(axis=1)
    tail = (1.0 - level) / 2.0
    low, high = np.quantile(means, [tail, 1.0 - tail])
    point = float(diff.mean()) * 100.0  # the change a report states beside this interval, held inside it
    low, high = min(float(low) * 100.0, point), max(float(high) * 100.0, point)
    return math.floor(low * 1e4) / 1e4, math.ceil(high * 1e4) / 1e4  # rounded outwards: still holds the point
