"""Side-by-side latency of several models: same inputs, interleaved seeded order, median of repeats."""

from __future__ import annotations

import math
import random
import statistics
import time
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from profiling_agent.tools.device import resolve_device
from profiling_agent.tools.evaluation import co_load, contention
from profiling_agent.tools.runtimes.forward import native_call, timed_calls_ms

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


# A run's timing budget per model: once a model has MIN_REPEATS repeats and its timed calls took more than this many
# seconds, it sits out the remaining repeats (a full-size ViT-B/16 in torch FP32 takes about 7 s per repeat at batch
# 16; the fast forms, whose medians need the repeats, keep all of them)
RUN_BUDGET_S = 30.0
MIN_REPEATS = 5
# ... and, under a budget, a model whose first warm-up pass (batch 1 and the larger batch) took longer than this is
# warm after it: the remaining warm-ups (up to 2 x 7 s for that ViT-B/16) would only repeat a steady call
WARM_AFTER_S = 1.0
# ... and a model out of the race sits out too: past MIN_REPEATS and OUT_OF_RACE_S seconds of timed calls, its
# medians so far are more than OUT_OF_RACE times the fastest model's at both batch sizes (it cannot be the fastest
# form, and five medians of calls that long already give its ratio; the close contenders keep every repeat)
OUT_OF_RACE = 1.5
OUT_OF_RACE_S = 5.0
# ... and for a slow model (its repeats, batch 1 and the larger batch, took over SLOW_REPEAT_S each) those rules
# apply from MIN_SLOW_REPEATS repeats: the median of three calls of seconds each is as steady as that of five
SLOW_REPEAT_S = 2.0
MIN_SLOW_REPEATS = 3
# A sample of a fast model times this long a run of consecutive calls (their mean is the sample), at most MAX_CALLS:
# one call of a 0.15 ms model is at the mercy of the caches the model timed before it left cold and of the OS; the
# zoo ViT pruned to two layers read 0.197 ms in its round and 0.149 ms at the end of the same run, one call a sample
MIN_SAMPLE_S = 0.005
MAX_CALLS = 64


def calls_per_sample(call_s: float) -> int:
    """Return how many consecutive calls one timed sample of a model whose call takes `call_s` seconds makes."""
    if call_s <= 0:
        return MAX_CALLS
    return max(1, min(MAX_CALLS, math.ceil(MIN_SAMPLE_S / call_s)))


def measure_latency(
    models: Mapping[str, nn.Module],
    sample: torch.Tensor,
    *,
    batch_size: int = 32,
    warmup: int = 3,
    repeats: int = 10,
    device: str = "cpu",
    budget_s: float | None = None,
    probe: Callable[[], Any] | None = None,
) -> dict[str, dict[str, Any]]:
    """Measure batch-1 and batch-`batch_size` forward latency of several models side by side.

    Each repeat times every model once at batch 1, then every model once at the larger batch, in a seeded random
    order that changes with every repeat, so machine noise and any cost of switching between models (cold caches,
    another runtime's kernels) hit all models alike instead of always the same neighbour. Models are put in eval
    mode and moved to `device` in place; the thread count is whatever torch uses now. An ONNX Runtime or OpenVINO
    form is timed through its runtime's own call on an input converted once (`forward.native_call`), as the runtimes'
    own benchmark tools do; a torch model through its forward. A sample of a fast model is the mean of a run of
    consecutive calls lasting about MIN_SAMPLE_S, timed in one clock span (`calls_per_sample`, from the last warm-up
    call; at least one warm-up pass runs).

    Args:
        models: Name -> model, timed side by side.
        sample: One image (C, H, W) or a batch the inputs are cut from (`latency_inputs`).
        batch_size: The larger batch.
        warmup: Untimed passes of every model at both sizes (at least 1).
        repeats: Timed repeats (the median is reported).
        device: Where the models run.
        budget_s: When set, a model that has MIN_REPEATS repeats (MIN_SLOW_REPEATS for a slow one) and whose
            timed calls took more than this many seconds of wall time sits out the remaining repeats (its
            `repeats` says how many it got), as does one out of the race (`out_of_race`), and a model whose first
            warm-up pass took over WARM_AFTER_S gets no further warm-ups.
        probe: Called at the start of every repeat, outside the models' clocks (the run's reference workload,
            timed inside the block it guards: `contention.Block.probe`).

    Returns:
        {name: {"latency_ms", "latency_batch_ms", "batch_size", "threads", "repeats"}}, medians in ms.
    """
    dev = resolve_device(device)
    single, batch = (t.to(dev) for t in latency_inputs(sample, batch_size))
    names = list(models)
    for name in names:
        models[name].eval().to(dev)
    clock = _Clock(names)
    with torch.inference_mode():
        bound = {name: {"single": native_call(m, single), "batch": native_call(m, batch)} for name, m in models.items()}
        last = warm_up(bound, warmup, dev, budget_s)
        calls = {name: {kind: calls_per_sample(last[name][kind]) for kind in last[name]} for name in names}
        shuffler = random.Random(0)
        for repeat in range(max(repeats, 1)):
            if probe is not None:
                probe()
            order = shuffler.sample(names, len(names))
            if budget_s is not None:
                order = [name for name in order if not sits_out(clock.times, clock.wall, name, repeat, budget_s)]
            for kind in ("single", "batch"):
                for name in order:
                    clock.sample(name, kind, bound[name][kind], calls[name][kind], dev, repeat)
    threads = torch.get_num_threads()
    return {
        name: {
            "latency_ms": statistics.median(clock.times[name]["single"]),
            "latency_batch_ms": statistics.median(clock.times[name]["batch"]),
            "batch_size": batch_size,
            "threads": threads,
            "repeats": len(clock.times[name]["single"]),
            "calls": calls[name]["single"],  # consecutive calls per batch-1 sample (`calls_per_sample`)
            "wall_s": round(clock.wall[name], 6),
            "cpu_s": round(clock.cpu[name], 6),
            # each repeat's sample, ms (None: the model sat that repeat out): paired ratios between models
            "samples_ms": clock.by_repeat(name, "single", repeats),
            "samples_batch_ms": clock.by_repeat(name, "batch", repeats),
        }
        for name in names
    }


def warm_up(
    bound: Mapping[str, Mapping[str, Callable[[], Any]]], warmup: int, dev: torch.device, budget_s: float | None
) -> dict[str, dict[str, float]]:
    """Run every model's untimed passes at both sizes (at least one); return each one's last call, seconds.

    Under a budget, a model whose passes so far took over WARM_AFTER_S gets no further warm-ups.
    """
    names = list(bound)
    warm_s: dict[str, float] = {name: 0.0 for name in names}
    last: dict[str, dict[str, float]] = {name: {} for name in names}  # the last warm-up call of each size, seconds
    for _ in range(max(warmup, 1)):
        for name in names:
            if budget_s is not None and warm_s[name] > WARM_AFTER_S:
                continue
            for kind in ("single", "batch"):
                last[name][kind] = timed_calls_ms(bound[name][kind], 1, dev) / 1e3
                warm_s[name] += last[name][kind]
    return last


class _Clock:
    """The timed samples of every model at both sizes, with the wall and process CPU seconds they took."""

    def __init__(self, names: list[str]) -> None:
        self.times: dict[str, dict[str, list[float]]] = {name: {"single": [], "batch": []} for name in names}
        self.cpu: dict[str, float] = {name: 0.0 for name in names}  # process CPU seconds of this model's timed calls
        self.wall: dict[str, float] = {name: 0.0 for name in names}
        self.repeat_of: dict[tuple[str, str], dict[int, float]] = {}  # (name, kind) -> {repeat: sample ms}

    def sample(self, name: str, kind: str, call: Callable[[], Any], n: int, dev: torch.device, repeat: int) -> None:
        """Time `n` consecutive calls in one clock span; record their mean (ms) and the seconds they took."""
        c0 = time.process_time()
        ms = timed_calls_ms(call, n, dev)
        self.cpu[name] += time.process_time() - c0
        self.wall[name] += ms / 1e3
        self.times[name][kind].append(ms / n)
        self.repeat_of.setdefault((name, kind), {})[repeat] = ms / n

    def by_repeat(self, name: str, kind: str, repeats: int) -> list[float | None]:
        """Return `name`'s sample of every repeat at `kind` (None where it sat the repeat out), ms."""
        got = self.repeat_of.get((name, kind), {})
        return [round(got[r], 6) if r in got else None for r in range(max(repeats, 1))]


def sits_out(
    times: Mapping[str, Mapping[str, list[float]]], wall: Mapping[str, float], name: str, done: int, budget_s: float
) -> bool:
    """Return whether `name`, timed `done` times, sits out the remaining repeats under the run's budget."""
    slow = done > 0 and wall[name] / done > SLOW_REPEAT_S
    if done < (MIN_SLOW_REPEATS if slow else MIN_REPEATS):
        return False
    return wall[name] > budget_s or out_of_race(times, wall, name)


def out_of_race(times: Mapping[str, Mapping[str, list[float]]], wall: Mapping[str, float], name: str) -> bool:
    """Return whether `name` is out of the race (see OUT_OF_RACE): it cannot be the fastest model.

    True when its timed calls took over OUT_OF_RACE_S seconds and, at both batch sizes, its median so far is
    more than OUT_OF_RACE times the fastest model's median.
    """
    if wall[name] <= OUT_OF_RACE_S:
        return False
    for kind in ("single", "batch"):
        fastest = min(statistics.median(t[kind]) for t in times.values() if t[kind])
        if statistics.median(times[name][kind]) <= OUT_OF_RACE * fastest:
            return False
    return True


# ---------------------------------------------------------------- busy machine
# (and a contended one: `contention`)

# A timed call is "busy" when its wall time exceeds the process CPU time it used by more than this factor: the
# process then ran on less than 1/1.5 = 67% of one core while it was being timed (other processes had the rest).
# With the default 1 thread that is exactly "wall > 1.5 x CPU time per thread"; with more threads a call that
# keeps several cores busy uses more CPU than wall time, so the rule only flags the clearly starved ones.
BUSY_FACTOR = 1.5
REMEASURES = 1  # a busy measurement is taken again this many times; the least busy one is kept


def wall_over_cpu(lat: Mapping[str, Mapping[str, Any]]) -> float:
    """Return total wall time over total process CPU time of a `measure_latency` result (0 when unknown)."""
    wall = sum(float(r.get("wall_s") or 0.0) for r in lat.values())
    cpu = sum(float(r.get("cpu_s") or 0.0) for r in lat.values())
    return round(wall / cpu, 3) if cpu > 0 else 0.0


def neighbours_stay(check: contention.ReferenceCheck | None, judged: Mapping[str, Any] | None) -> float | None:
    """Return the cores other processes still use when they contended with a block (None: time it again).

    Only a block flagged by the kernel's counters is watched again (`co_load.busy_now`): when its neighbours are
    still running, a second attempt would be contended too, and is not taken.
    """
    if check is None or check.load is None or not judged or judged.get("others_cores") is None:
        return None
    if not judged.get("contended"):
        return None
    now = co_load.busy_now(check.load)
    return now if now is not None and co_load.contended(now) else None


def measure_latency_checked(
    models: Mapping[str, nn.Module],
    sample: torch.Tensor,
    *,
    reference: contention.ReferenceCheck | None = None,
    **kwargs: Any,
) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """Run `measure_latency`, and again (up to REMEASURES times) while its timings look unsafe; keep the safest.

    Two checks judge a CPU measurement (a GPU forward waits for the device, so its wall time exceeds CPU time by
    nature, and neither applies): wall time over process CPU time (`busy`: the process was starved of its core),
    and the run's reference workload timed before, inside (once per repeat) and after the block, rank-tested
    against its quiet calibration (`contended`: another process slowed it through the core, caches or memory
    without starving it; `contention.judge`). The calibration is taken at the run's first timing block, and a
    quiet block whose reference ran significantly faster replaces it (`contention.ReferenceCheck.refresh`).

    Args:
        models: Name -> model, timed side by side (`measure_latency`).
        sample: The images the inputs are cut from.
        reference: The reference check (None: the run's, `contention.current()`).
        **kwargs: `measure_latency`'s settings.

    Returns:
        The latency result and the timing facts: {"wall_over_cpu", "busy", "remeasured", "factor", "threads",
        "attempts", "contended", "slowdown", "p_value", "reference"}; "busy" or "contended" True means the kept
        measurement was still taken on a busy machine and its numbers are flagged.
    """
    cpu_run = not str(kwargs.get("device", "cpu")).startswith("cuda")
    check = (reference or contention.current()) if cpu_run else None
    attempts = []
    still: float | None = None
    for attempt in range(REMEASURES + 1):
        block = check.block() if check is not None else None  # calibrated before the run's first block
        lat = measure_latency(models, sample, probe=block.probe if block is not None else None, **kwargs)
        judged = block.finish() if block is not None else None
        ratio = wall_over_cpu(lat)
        unsafe = cpu_run and (ratio > BUSY_FACTOR or bool(judged and judged["contended"]))
        attempts.append((unsafe, ratio, attempt, lat, judged))
        if not unsafe or attempt == REMEASURES or (still := neighbours_stay(check, judged)) is not None:
            break
    _, ratio, _, lat, judged = min(attempts, key=lambda a: (a[0], a[1], (a[4] or {}).get("slowdown", 1.0), a[2]))
    timing: dict[str, Any] = {
        "wall_over_cpu": ratio,
        "busy": cpu_run and ratio > BUSY_FACTOR,
        "remeasured": len(attempts) > 1,
        "attempts": [a[1] for a in attempts],
        "factor": BUSY_FACTOR,
        "threads": torch.get_num_threads(),
    }
    if still is not None:
        timing["not_remeasured"] = f"other processes still used {still:.2f} of a core: a second attempt would be too"
    if check is not None and judged is not None:
        timing.update(contended=bool(judged["contended"]), slowdown=judged["slowdown"], p_value=judged["p_value"])
        timing["slowdowns"] = [(a[4] or {}).get("slowdown") for a in attempts]
        timing["calibration_refreshed"] = check.refresh(judged["samples_ms"], ratio)
        timing["reference"] = judged
    return lat, timing


# ---------------------------------------------------------------- paired speed ratios

RATIO_RESAMPLES = 2000  # bootstrap resamples of a paired ratio's median
RATIO_LEVEL = 0.95


def paired_ratio(
    numerator: Mapping[str, Any],
    denominator: Mapping[str, Any],
    key: str = "samples_ms",
    seed: int = 0,
    level: float = RATIO_LEVEL,
) -> dict[str, Any] | None:
    """Return how many times faster `denominator` ran than `numerator`, from their interleaved repeats.

    Both were timed in the same `measure_latency` call, one sample each per repeat: each repeat where both ran
    gives one ratio (numerator's sample over denominator's), so noise that hit the repeat hits both. The median
    of those ratios is the estimate, and it is THE figure a report states for this comparison (not the ratio of
    the two models' medians, which can lie outside this interval: a full-size ViT-B/16 read 10.44x by its medians
    beside a paired interval of 9.37-10.40). A seeded percentile bootstrap of the same median gives its 95%
    interval, widened where needed to hold the estimate (a percentile interval of a median of few repeats can
    miss its own estimate by a resample's granularity), so the point lies inside its interval by construction.

    Args:
        numerator: The slower-reference model's latency record (with `key`), e.g. the quantization-only form.
        denominator: The measured model's record, e.g. the delivered form.
        key: "samples_ms" (batch 1) or "samples_batch_ms".
        seed: Seed of the bootstrap.
        level: Coverage of the interval.

    Returns:
        {"ratio", "ci": [low, high], "repeats", "level"}, or None with fewer than 3 paired repeats.
    """
    pairs = [
        a / b
        for a, b in zip(numerator.get(key) or [], denominator.get(key) or [], strict=False)
        if a is not None and b is not None and a > 0 and b > 0
    ]
    if len(pairs) < 3:
        return None
    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(pairs, k=len(pairs))) for _ in range(RATIO_RESAMPLES))
    tail = (1.0 - level) / 2
    point = statistics.median(pairs)
    low = min(point, medians[int(tail * RATIO_RESAMPLES)])
    high = max(point, medians[int((1.0 - tail) * RATIO_RESAMPLES) - 1])
    return {
        "ratio": round(point, 4),
        "ci": [round(low, 4), round(high, 4)],  # rounding is monotone: the rounded point stays inside
        "repeats": len(pairs),
        "level": level,
    }


def paired_reduction(ratio: Mapping[str, Any]) -> tuple[float, list[float]]:
    """Return the latency reduction 1 - 1/r of a `paired_ratio` and its interval, both from the same repeats.

    The transform is increasing, so the reduction lies inside its interval exactly as the ratio lies inside its own.
    """
    low, high = (float(x) for x in ratio["ci"])
    return round(1.0 - 1.0 / float(ratio["ratio"]), 4), [round(1.0 - 1.0 / low, 4), round(1.0 - 1.0 / high, 4)]


def measurably_different(ratio: Mapping[str, Any] | None) -> bool | None:
    """Return False when a paired ratio's interval holds 1.0 (no measurable difference), None when unknown."""
    if not ratio or not ratio.get("ci"):
        return None
    low, high = ratio["ci"]
    return not (float(low) <= 1.0 <= float(high))
