"""How a node profile samples a form: enough calls per sample for the timer, medians across samples.

Runtimes' profilers report a node's time in whole microseconds (ONNX Runtime's `dur`, OpenVINO's `real_time`). A
0.05 ms ResNet's nodes take a few microseconds each, so one call's node time is a coarse step and a median of single
calls stays on that step: seven profiles of such a model spread 67% in a group's share. So a sample is the mean of
each node's time over `sample_calls` consecutive calls (calls enough for the sample to last `SAMPLE_S`; the middle
half of them, so a preempted call does not count: `interquartile_mean`), and a
node's figure is the median over the samples; a model slower than `SAMPLE_S` a call samples one call at a time, as
before. Where even `MAX_CALLS` calls do not fill `SAMPLE_S`, the samples are shorter, and the planning record says
so (`planning_latency.record_note`).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

SAMPLE_S = 0.01  # a sample lasts at least 10 ms: 200 calls of a 0.05 ms model, one call of a full-size ViT
MAX_CALLS = 200  # the most calls one sample averages


def sample_calls(run_s: float) -> int:
    """Return how many calls one sample of a form averages, given one call's time in seconds (1 to MAX_CALLS)."""
    if run_s <= 0:
        return MAX_CALLS
    return max(1, min(MAX_CALLS, math.ceil(SAMPLE_S / run_s)))


def warm_run_s(run: Callable[[], Any], warmup: int) -> float:
    """Make `warmup` untimed runs (at least one) and return the fastest one's wall time in seconds."""
    fastest = float("inf")
    for _ in range(max(1, warmup)):
        start = time.perf_counter()
        run()
        fastest = min(fastest, time.perf_counter() - start)
    return fastest


def node_medians(runs: Mapping[str, Sequence[float]], calls: int, samples: int) -> dict[str, float]:
    """Return each node's median over `samples` samples of its interquartile mean over `calls` consecutive runs.

    Args:
        runs: Each node's time in every profiled run, in run order (the last `calls * samples` are the timed ones).
        calls: Runs one sample averages.
        samples: Samples per node.
    """
    out = {}
    for node, times in runs.items():
        timed = list(times[-calls * samples :])
        means = [interquartile_mean(timed[i : i + calls]) for i in range(0, len(timed), calls)]
        out[node] = statistics.median(means)
    return out


def interquartile_mean(values: Sequence[float]) -> float:
    """Return the mean of the middle half of `values` (all of them when fewer than four).

    Averaging steps the timer's microseconds; dropping the outer quarters drops the calls a busy machine preempted.
    """
    ordered = sorted(values)
    cut = len(ordered) // 4
    return statistics.fmean(ordered[cut : len(ordered) - cut] if cut else ordered)
