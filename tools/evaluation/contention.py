"""Contention a busy check cannot see: a fixed reference workload timed around every timing block.

A process on another core slows a one-thread measurement through the shared caches and memory bus without changing
its wall-to-CPU ratio (`latency.BUSY_FACTOR` misses it). So before and after each timing block the same small
single-thread workload (a 256x256 FP32 GEMM and a 16 MB copy: core and memory bandwidth) is timed, and compared
with its quiet calibration: the fastest of CALIBRATION_SAMPLES samples taken once per run, at its first timing
block, kept in the run folder (`REFERENCE_FILE`) so a resumed run and every later round compare with the same
reference. A block whose reference ran slower than that by more than its noise (`tolerance`) is *contended*.

A run that starts beside its competitors would calibrate on an already slowed machine, so the real workload's
calibration is also compared with this machine's floor: the fastest calibration any run on it has taken
(`machine_floor`, kept in the cache per CPU model and torch version). The run's quiet reference is the faster of
the two, and a calibration already past the floor's tolerance is said (`started_busy`).
"""

from __future__ import annotations

import hashlib
import platform
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

REFERENCE_FILE = "timing_reference.json"  # in the run folder
CALIBRATION_SAMPLES = 15  # samples of the quiet calibration (its fastest is the reference)
CHECK_SAMPLES = 5  # samples before and after a block (their median is compared)
MIN_TOLERANCE = 0.10  # a block is contended when its reference ran over 10% slower than the quiet reference...
NOISE_FACTOR = 3.0  # ... or NOISE_FACTOR times the calibration's own spread, whichever is larger...
MAX_TOLERANCE = 0.25  # ... but never over 25%: a calibration that noisy was itself taken on a busy machine
GEMM_SIZE = 256
COPY_FLOATS = 4 * 1024 * 1024  # 16 MB: past a core's L2, so a neighbour's cache and memory traffic shows

RULE = (
    "contended when the reference workload (one thread: a {n}x{n} FP32 GEMM and a 16 MB copy) timed before or "
    "after the block ran more than max({tol:.0%}, {k:g} x its quiet spread, at most {cap:.0%}) slower than its "
    "quiet calibration (the fastest of {n_cal} samples at the run's first timing block, or this machine's fastest "
    "calibration when the run's own was already past that tolerance over it)"
)

Timer = Callable[[int], list[float]]  # samples -> reference times, ms


def reference_samples(samples: int) -> list[float]:
    """Time the reference workload `samples` times on one thread; return each sample's wall time in ms."""
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(GEMM_SIZE, GEMM_SIZE, generator=gen)
    b = torch.randn(GEMM_SIZE, GEMM_SIZE, generator=gen)
    src, dst, out = torch.randn(COPY_FLOATS, generator=gen), torch.empty(COPY_FLOATS), torch.empty(a.shape)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.mm(a, b, out=out)  # warm: allocations and the kernel's first call
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
        quiet_ms: The fastest calibration sample, ms (the reference a block's samples are compared with).
        spread: The calibration's relative noise: (median - fastest) / fastest.
        samples_ms: The calibration samples.
        path: Where it is kept (None: in this process only).
        machine_floor_ms: This machine's fastest calibration before this run's (None: none kept, or a test timer).
        started_busy: The run's own calibration ran past the tolerance over the machine's floor (the run began on a
            busy machine; its quiet reference is the floor).
    """

    quiet_ms: float
    spread: float
    samples_ms: list[float] = field(default_factory=list)
    path: str | None = None
    machine_floor_ms: float | None = None
    started_busy: bool = False

    @property
    def tolerance(self) -> float:
        """How much slower than `quiet_ms` a block's reference may run before the block is contended."""
        return round(min(MAX_TOLERANCE, max(MIN_TOLERANCE, NOISE_FACTOR * self.spread)), 4)


def calibrate(timer: Timer = reference_samples, samples: int = CALIBRATION_SAMPLES) -> QuietReference:
    """Time the reference workload `samples` times; keep the fastest as the quiet reference, and the noise."""
    times = timer(samples)
    fastest = min(times)
    return QuietReference(
        quiet_ms=round(fastest, 6),
        spread=round((statistics.median(times) - fastest) / fastest, 6) if fastest > 0 else 0.0,
        samples_ms=[round(t, 6) for t in times],
    )


def machine_floor_path() -> Path:
    """Return where this machine's fastest calibration of the reference workload is kept (per CPU and torch)."""
    from profiling_agent.tools.models.embedded_data import cache_dir

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            cpu = next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), cpu)
    except OSError:
        pass
    key = hashlib.sha256(f"{cpu}|{torch.__version__}|{GEMM_SIZE}|{COPY_FLOATS}".encode()).hexdigest()[:16]
    return cache_dir() / "latency" / f"timing-reference-{key}.json"


def read_floor(floor_file: Path) -> float | None:
    """Return the machine's floor kept in `floor_file`, ms (None: none, or unreadable)."""
    from profiling_agent.tools.io import read_json

    try:
        return float(read_json(floor_file)["quiet_ms"]) if floor_file.exists() else None
    except (OSError, KeyError, TypeError, ValueError):
        return None


def with_machine_floor(run: QuietReference, floor_file: Path) -> QuietReference:
    """Return the run's calibration against this machine's floor (the faster is the quiet reference); keep the floor.

    The floor only moves down: a faster calibration replaces it. A cache that cannot be read or written leaves the
    run's own calibration as it is.
    """
    from profiling_agent.tools.io import write_json_atomic

    floor = read_floor(floor_file)
    if floor is None or run.quiet_ms < floor:
        try:
            write_json_atomic(floor_file, {"quiet_ms": run.quiet_ms, "spread": run.spread})
        except OSError:
            pass  # the cache is a convenience: the run's own calibration still holds
    if floor is None or floor <= 0:
        return run
    run.machine_floor_ms = round(floor, 6)
    if run.quiet_ms > floor * (1 + run.tolerance):
        run.started_busy = True
        run.quiet_ms = round(floor, 6)
    return run


REAL_WORKLOAD: Timer = reference_samples  # bound at import: a stand-in patched over the name is never it


class ReferenceCheck:
    """The run's reference workload: calibrated once (or read back), then timed around every block."""

    def __init__(self, timer: Timer = reference_samples, folder: Path | None = None) -> None:
        self.timer = timer
        self.folder = folder
        self.quiet: QuietReference | None = None

    def reference(self) -> QuietReference:
        """Return the quiet reference: kept in the run folder, else calibrated now (and kept there)."""
        if self.quiet is not None:
            return self.quiet
        from profiling_agent.tools.io import read_json, write_json_atomic

        path = self.folder / REFERENCE_FILE if self.folder is not None else None
        if path is not None and path.exists():
            try:
                data = read_json(path)
                self.quiet = QuietReference(
                    float(data["quiet_ms"]),
                    float(data["spread"]),
                    list(data.get("samples_ms") or []),
                    str(path),
                    data.get("machine_floor_ms"),
                    bool(data.get("started_busy")),
                )
                return self.quiet
            except (KeyError, TypeError, ValueError):
                pass  # unreadable: calibrated again below and written over
        self.quiet = calibrate(self.timer)
        if self.timer is REAL_WORKLOAD:  # the real workload (not a test's stand-in): compared with the floor
            self.quiet = with_machine_floor(self.quiet, machine_floor_path())
        if path is not None:
            self.quiet.path = str(path)
            write_json_atomic(path, asdict(self.quiet))
        return self.quiet

    def sample(self) -> float:
        """Return the median of CHECK_SAMPLES timings of the reference workload, ms."""
        return round(statistics.median(self.timer(CHECK_SAMPLES)), 6)


def judge(before_ms: float, after_ms: float, quiet: QuietReference) -> dict[str, Any]:
    """Return the contention facts of one block from its reference times before and after it.

    Returns:
        {"before_ms", "after_ms", "quiet_ms", "spread", "slowdown", "tolerance", "contended", "machine_floor_ms",
        "started_busy", "rule"}; `slowdown` is the slower of the two over the quiet reference.
    """
    slowdown = max(before_ms, after_ms) / quiet.quiet_ms if quiet.quiet_ms > 0 else 1.0
    tol = quiet.tolerance
    return {
        "before_ms": round(before_ms, 4),
        "after_ms": round(after_ms, 4),
        "quiet_ms": round(quiet.quiet_ms, 4),
        "spread": round(quiet.spread, 4),
        "slowdown": round(slowdown, 4),
        "tolerance": tol,
        "contended": slowdown > 1.0 + tol,
        "machine_floor_ms": quiet.machine_floor_ms,
        "started_busy": quiet.started_busy,
        "rule": RULE.format(
            n=GEMM_SIZE, tol=MIN_TOLERANCE, k=NOISE_FACTOR, cap=MAX_TOLERANCE, n_cal=CALIBRATION_SAMPLES
        ),
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


def flag_reason(timing: Mapping[str, Any] | None) -> str:
    """Say why a block's timings are flagged ("" when they are not)."""
    if not timing:
        return ""
    parts = []
    if timing.get("contended"):
        ref = timing.get("reference") or {}
        parts.append(
            f"a reference workload ran {ref.get('slowdown')}x its quiet time (tolerance {ref.get('tolerance'):.0%}): "
            "another process competed for the core, caches or memory"
            if ref.get("tolerance") is not None
            else "the reference workload ran slower than its quiet time"
        )
    if timing.get("busy"):
        parts.append(
            f"the machine was busy (wall time {timing.get('wall_over_cpu')}x the process CPU time, "
            f"over {timing.get('factor')})"
        )
    return "; ".join(parts)
