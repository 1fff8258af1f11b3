"""Contention a busy check cannot see: other processes' CPU use during a block, and a reference workload beside it.

Where the kernel's counters can be read (Linux), a block is contended when other processes used a quarter of a core
or more during it (`co_load`): the rule below is then recorded, not decisive. Elsewhere it decides.

A process on another core slows a one-thread measurement through the shared caches and memory bus without changing
its wall-to-CPU ratio (`latency.BUSY_FACTOR` misses it). So the same small single-thread workload (a 256x256 FP32
GEMM pair and a 16 MB copy: core and memory bandwidth) is timed CHECK_SAMPLES times before a timing block, once
at the start of every repeat inside it and CHECK_SAMPLES times after it, and those samples are compared with the
run's quiet calibration (CALIBRATION_SAMPLES samples at the run's first timing block, kept in the run folder as
`REFERENCE_FILE`) by a one-sided Mann-Whitney U test. A block is *contended* when the test rejects "no slower than
the calibration" at ALPHA and the block's median is more than MIN_EFFECT over the calibration's: on a quiet
machine, where both are draws of one distribution, at most ALPHA of blocks are contended.

The calibration is refreshed when the machine is quiet. A block whose models ran on their core (wall time at most
QUIET_WALL_CPU x CPU time) and whose reference samples were significantly *faster* than the calibration (the same
test, the other way) replaces it: the calibration had been taken on a busier machine. Across runs, this machine's
last quiet calibration is kept in the cache (`machine_file`, per CPU model and torch version): a run whose own
calibration is significantly slower than it started beside competitors (`started_busy`) and is judged against the
kept one; a run whose calibration was quiet (the reference's wall time at most QUIET_WALL_CPU x its thread CPU
time, and not significantly slower than the kept one) replaces it.
"""

from __future__ import annotations

import functools
import hashlib
import platform
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from profiling_agent.tools.evaluation import co_load
from profiling_agent.tools.evaluation.rank_test import p_greater
from profiling_agent.tools.io import read_json, write_json_atomic
from profiling_agent.tools.models.embedded_data import cache_dir

REFERENCE_FILE = "timing_reference.json"  # in the run folder
CALIBRATION_SAMPLES = 20  # samples of the quiet calibration (about 3 ms each)
CHECK_SAMPLES = 3  # samples before and after a block (and one more at the start of every repeat inside it)
ALPHA = 0.01  # the rank test's level: the rate of contended verdicts on blocks as quiet as the calibration
MIN_EFFECT = 0.05  # ... and the block's median must be over 5% above the calibration's (a slowdown worth a flag)
QUIET_WALL_CPU = 1.1  # a calibration or block is quiet when its wall time is at most this x its CPU time
GEMM_SIZE = 256
COPY_FLOATS = 4 * 1024 * 1024  # 16 MB: past a core's L2, so a neighbour's cache and memory traffic shows

RULE = (
    "contended when the reference workload (one thread: two {n}x{n} FP32 GEMMs and a 16 MB copy), timed {k} times "
    "before the block, once per repeat inside it and {k} times after, ran slower than its quiet calibration "
    "({n_cal} samples) by a one-sided Mann-Whitney U test at alpha {alpha:g}, with its median over {eff:.0%} above "
    "the calibration's"
)
CO_LOAD_RULE = (
    "contended when other processes used {limit:g} of a core or more on this machine's CPUs during the block "
    "(the kernel's busy time of all CPUs, steal included, minus this process's CPU time: /proc/stat); the "
    "reference workload's rank test is recorded beside it"
)

Timer = Callable[[int], list[float]]  # samples -> reference times, ms
Load = Callable[[], "co_load.CpuReading | None"]  # the CPU counters now (`co_load.read`)


@functools.cache
def _buffers() -> tuple[torch.Tensor, ...]:
    """Return the reference workload's tensors (built once per process: a probe inside a block stays cheap)."""
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(GEMM_SIZE, GEMM_SIZE, generator=gen)
    b = torch.randn(GEMM_SIZE, GEMM_SIZE, generator=gen)
    return a, b, torch.empty(a.shape), torch.randn(COPY_FLOATS, generator=gen), torch.empty(COPY_FLOATS)


def reference_samples(samples: int) -> list[float]:
    """Time the reference workload `samples` times on one thread, after one untimed pass; return each sample, ms.

    The untimed pass puts every sample in the same state whatever ran before (a model's calls evict the GEMM's
    operands), so a sample inside a block is comparable with the calibration's back-to-back ones.
    """
    a, b, out, src, dst = _buffers()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.mm(a, b, out=out)
        dst.copy_(src)
        times = []
        for _ in range(max(1, samples)):
            start = time.perf_counter()
            for _ in range(2):
                torch.mm(a, b, out=out)
            dst.copy_(src)
            times.append((time.perf_counter() - start) * 1e3)
        return times
    finally:
        torch.set_num_threads(threads)


@dataclass
class QuietReference:
    """The run's quiet calibration of the reference workload.

    Attributes:
        samples_ms: The calibration samples, ms (a block's samples are rank-tested against them).
        wall_over_cpu: The calibration's wall time over its thread CPU time (0: unknown).
        path: Where it is kept (None: in this process only).
        machine_median_ms: The median of this machine's kept calibration when the run compared with one (else None).
        started_busy: The run's own calibration was significantly slower than the machine's kept one (the run began
            beside competitors; `samples_ms` are the kept ones).
        refreshed: How many quiet blocks replaced the calibration (their reference ran significantly faster).
    """

    samples_ms: list[float]
    wall_over_cpu: float = 0.0
    path: str | None = None
    machine_median_ms: float | None = None
    started_busy: bool = False
    refreshed: int = 0

    @property
    def median_ms(self) -> float:
        """The calibration's median, ms."""
        return statistics.median(self.samples_ms)


def calibrate(timer: Timer = reference_samples, samples: int = CALIBRATION_SAMPLES) -> QuietReference:
    """Time the reference workload `samples` times; keep the samples and their wall over thread CPU time."""
    wall, cpu = time.perf_counter(), time.thread_time()
    times = timer(samples)
    wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
    return QuietReference(
        samples_ms=[round(t, 6) for t in times], wall_over_cpu=round(wall / cpu, 3) if cpu > 0 else 0.0
    )


def slower(samples: Sequence[float], quiet: Sequence[float]) -> tuple[bool, float, float]:
    """Return whether `samples` ran slower than `quiet` (the rank test at ALPHA and MIN_EFFECT), its p and effect.

    The effect is the ratio of the medians (samples over quiet).
    """
    p = p_greater(samples, quiet)
    effect = statistics.median(samples) / statistics.median(quiet) if samples and quiet else 1.0
    return p < ALPHA and effect > 1.0 + MIN_EFFECT, p, effect


def machine_file() -> Path:
    """Return where this machine's last quiet calibration of the reference workload is kept (per CPU and torch)."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            cpu = next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), cpu)
    except OSError:
        pass
    key = hashlib.sha256(f"{cpu}|{torch.__version__}|{GEMM_SIZE}|{COPY_FLOATS}".encode()).hexdigest()[:16]
    return cache_dir() / "latency" / f"timing-reference-v2-{key}.json"


def read_machine(path: Path) -> list[float] | None:
    """Return the machine's kept calibration samples in `path`, ms (None: none, or unreadable)."""
    try:
        samples = [float(t) for t in read_json(path)["samples_ms"]] if path.exists() else []
    except (OSError, KeyError, TypeError, ValueError):
        return None
    return samples if len(samples) >= CHECK_SAMPLES and min(samples) > 0 else None


def with_machine(run: QuietReference, path: Path) -> QuietReference:
    """Return the run's calibration judged against the machine's kept one; keep the run's when it was quiet.

    Significantly slower than the kept calibration: the run started busy and is judged against the kept samples.
    Otherwise the run's own calibration holds, and replaces the kept one when its wall/CPU was at most
    QUIET_WALL_CPU. A cache that cannot be read or written leaves the run's calibration as it is.
    """
    kept = read_machine(path)
    if kept is not None:
        run.machine_median_ms = round(statistics.median(kept), 6)
        if slower(run.samples_ms, kept)[0]:
            run.started_busy = True
            run.samples_ms = kept
            return run
    if 0 < run.wall_over_cpu <= QUIET_WALL_CPU:
        try:
            write_json_atomic(path, {"samples_ms": run.samples_ms, "wall_over_cpu": run.wall_over_cpu})
        except OSError:
            pass  # the cache is a convenience: the run's own calibration still holds
    return run


REAL_WORKLOAD: Timer = reference_samples  # bound at import: a stand-in patched over the name is never it


class ReferenceCheck:
    """The run's reference workload: calibrated once (or read back), timed through every block, refreshed when quiet."""

    def __init__(self, timer: Timer = reference_samples, folder: Path | None = None, load: Load | None = None) -> None:
        """`load` reads the CPU counters (`co_load.read`; the default with the real workload, none with a stand-in)."""
        self.timer = timer
        self.folder = folder
        self.quiet: QuietReference | None = None
        self.load = load if load is not None else (co_load.read if timer is REAL_WORKLOAD else None)

    def _path(self) -> Path | None:
        return self.folder / REFERENCE_FILE if self.folder is not None else None

    def reference(self) -> QuietReference:
        """Return the quiet reference: kept in the run folder, else calibrated now (and kept there)."""
        if self.quiet is not None:
            return self.quiet

        path = self._path()
        if path is not None and path.exists():
            try:
                data = read_json(path)
                samples = [float(t) for t in data["samples_ms"]]
                if len(samples) >= CHECK_SAMPLES:
                    fields = ("wall_over_cpu", "machine_median_ms", "started_busy", "refreshed")
                    self.quiet = QuietReference(samples, path=str(path), **{k: data[k] for k in fields if k in data})
                    return self.quiet
            except (KeyError, TypeError, ValueError):
                pass  # unreadable or an older format: calibrated again below and written over
        self.quiet = calibrate(self.timer)
        if self.timer is REAL_WORKLOAD:  # the real workload (not a test's stand-in): compared with the machine's
            self.quiet = with_machine(self.quiet, machine_file())
        self._keep()
        return self.quiet

    def _keep(self) -> None:
        path = self._path()
        if path is not None and self.quiet is not None:
            self.quiet.path = str(path)
            write_json_atomic(path, asdict(self.quiet))

    def block(self) -> Block:
        """Start a timing block: the reference is timed CHECK_SAMPLES times now (`Block.probe` inside, `finish`)."""
        quiet = self.reference()
        start = self.load() if self.load is not None else None
        return Block(self, quiet, list(self.timer(CHECK_SAMPLES)), start)

    def refresh(self, samples: Sequence[float], wall_over_cpu: float) -> bool:
        """Replace the calibration by a quiet block's samples when they ran significantly faster; return whether.

        Quiet: the block's wall time was at most QUIET_WALL_CPU x its CPU time. Faster: the rank test the other way
        (the calibration slower than the block) at ALPHA and MIN_EFFECT.
        """
        quiet = self.reference()
        if not 0 < wall_over_cpu <= QUIET_WALL_CPU or len(samples) < CHECK_SAMPLES:
            return False
        if not slower(quiet.samples_ms, samples)[0]:
            return False
        quiet.samples_ms = [round(t, 6) for t in samples]
        quiet.started_busy = False
        quiet.refreshed += 1
        self._keep()
        return True


@dataclass
class Block:
    """The reference samples of one timing block: before it, one per repeat inside it (`probe`), after it."""

    check: ReferenceCheck
    quiet: QuietReference
    samples_ms: list[float] = field(default_factory=list)
    start: co_load.CpuReading | None = None  # the CPU counters when the block began (None: not measured)

    def probe(self) -> None:
        """Time the reference workload once inside the block (at the start of a repeat)."""
        self.samples_ms.extend(self.check.timer(1))

    def finish(self) -> dict[str, Any]:
        """Time the reference CHECK_SAMPLES times after the block; return the block's contention facts (`judge`)."""
        self.samples_ms.extend(self.check.timer(CHECK_SAMPLES))
        others = None
        if self.start is not None and self.check.load is not None and (end := self.check.load()) is not None:
            others = co_load.others_cores(self.start, end)
        return judge(self.samples_ms, self.quiet, others)


def judge(samples: Sequence[float], quiet: QuietReference, others: float | None = None) -> dict[str, Any]:
    """Return the contention facts of one block from its reference samples against the quiet calibration.

    `others` is the cores other processes used during the block (`co_load.others_cores`): where it was measured it
    decides (`co_load.contended`) and the rank test is recorded beside it; where not, the rank test decides.

    Returns:
        {"samples_ms", "median_ms", "quiet_median_ms", "slowdown" (the medians' ratio), "p_value", "alpha",
        "min_effect", "contended", "machine_median_ms", "started_busy", "refreshed", "rule"}, and with `others`
        "others_cores", "others_limit" and "reference_slower" (the rank test's verdict).
    """
    slow, p, effect = slower(samples, quiet.samples_ms)
    contended = slow if others is None else co_load.contended(others)
    if others is None:
        rule = RULE.format(n=GEMM_SIZE, k=CHECK_SAMPLES, n_cal=len(quiet.samples_ms), alpha=ALPHA, eff=MIN_EFFECT)
        counted: dict[str, Any] = {}
    else:
        rule = CO_LOAD_RULE.format(limit=co_load.OTHERS_LIMIT)
        counted = {"others_cores": round(others, 3), "others_limit": co_load.OTHERS_LIMIT, "reference_slower": slow}
    return {
        "samples_ms": [round(t, 4) for t in samples],
        "median_ms": round(statistics.median(samples), 4),
        "quiet_median_ms": round(quiet.median_ms, 4),
        "slowdown": round(effect, 4),
        "p_value": float(f"{p:.3g}"),
        "alpha": ALPHA,
        "min_effect": MIN_EFFECT,
        "contended": contended,
        "machine_median_ms": quiet.machine_median_ms,
        "started_busy": quiet.started_busy,
        "refreshed": quiet.refreshed,
        "rule": rule,
        **counted,
    }


_CURRENT = ReferenceCheck()


def use_run(folder: Path | None, timer: Timer | None = None) -> ReferenceCheck:
    """Make the reference of the run in `folder` the one every timing block of this process is checked against.

    The same folder keeps its reference (calibrated once per run, read back on resume), as does None (a process
    that times without a run folder calibrates once); a new folder starts afresh. `timer` stands in for the
    reference workload (tests).
    """
    global _CURRENT
    same = (Path(folder) if folder is not None else None) == _CURRENT.folder
    if not same or timer is not None:
        _CURRENT = ReferenceCheck(timer or reference_samples, Path(folder) if folder is not None else None)
    return _CURRENT


def current() -> ReferenceCheck:
    """Return the reference check timing blocks use now (`use_run`)."""
    return _CURRENT


def flagged(timing: Mapping[str, Any] | None) -> bool:
    """Return whether a block's timing facts are flagged: a starved CPU (`busy`) or a contended reference."""
    return timing is not None and bool(timing.get("busy") or timing.get("contended"))


def contended_reason(ref: Mapping[str, Any]) -> str:
    """Say what contended with a block: other processes' CPU use, or how the reference workload ran (medians, p)."""
    if ref.get("others_cores") is not None:
        return (
            f"other processes used {ref.get('others_cores')} of a core on this machine's CPUs during the block "
            f"(limit {ref.get('others_limit')}; the kernel's counters), and a reference workload ran "
            f"{ref.get('slowdown')}x its quiet time"
        )
    if ref.get("p_value") is not None:
        return (
            f"a reference workload ran {ref.get('slowdown')}x its quiet time during the block (medians; one-sided "
            f"Mann-Whitney p={ref.get('p_value'):.2g} < {ref.get('alpha')}): another process competed for the "
            "core, caches or memory"
        )
    if ref.get("tolerance") is not None:  # a record of the earlier rule (fastest quiet sample and a tolerance)
        return (
            f"a reference workload ran {ref.get('slowdown')}x its quiet time (tolerance {ref.get('tolerance'):.0%}): "
            "another process competed for the core, caches or memory"
        )
    return "the reference workload ran slower than its quiet time"


def flag_reason(timing: Mapping[str, Any] | None) -> str:
    """Say why a block's timings are flagged ("" when they are not)."""
    if not timing:
        return ""
    parts = []
    if timing.get("contended"):
        parts.append(contended_reason(timing.get("reference") or {}))
    if timing.get("busy"):
        parts.append(
            f"the machine was busy (wall time {timing.get('wall_over_cpu')}x the process CPU time, "
            f"over {timing.get('factor')})"
        )
    return "; ".join(parts)
