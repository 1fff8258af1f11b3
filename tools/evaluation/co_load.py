"""What else ran on the machine's CPUs during a timing block, read from the kernel's own counters.

A process on the other core slows a one-thread timing through the shared caches and memory without changing its
wall-to-CPU ratio, and the slowdown it causes can be as small as the noise of any reference workload (a CPU-bound
neighbour on a 2-core machine: a median 1.01x on the reference, `bench/contention.py`). The kernel counts it
directly: /proc/stat's busy time of all CPUs (user, nice, system, irq, softirq and steal: time a hypervisor gave
this machine's CPUs to another) minus this process's own CPU time is what other processes used during the block.
A block during which they used OTHERS_LIMIT of a core or more, past the counters' resolution, was contended.
Where /proc/stat cannot be read (not Linux) nothing is measured and the reference workload's rank test decides.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

PROC_STAT = Path("/proc/stat")
OTHERS_LIMIT = 0.25  # cores: other processes using a quarter of a core or more during a block contend with it
SLACK_TICKS = 4  # the counters' resolution: both readings are in clock ticks, each rounded down
WINDOW_S = 0.25  # how long `busy_now` watches the counters before a contended block is timed again


@dataclass(frozen=True)
class CpuReading:
    """The machine's busy CPU seconds (all CPUs) and this process's CPU seconds (all threads), at a wall time."""

    wall_s: float
    busy_s: float
    own_s: float


def tick_s() -> float:
    """Return the length of the kernel's clock tick, in seconds (the counters' unit)."""
    try:
        return 1.0 / os.sysconf("SC_CLK_TCK")
    except (AttributeError, ValueError, OSError):
        return 0.01


def read(stat: Path = PROC_STAT) -> CpuReading | None:
    """Read the counters now; None where /proc/stat is missing or not in the format Linux writes."""
    try:
        fields = stat.read_text().split("\n", 1)[0].split()
        user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in fields[1:9])
    except (OSError, ValueError, IndexError):
        return None
    if fields[0] != "cpu":
        return None
    own = os.times()
    busy = (user + nice + system + irq + softirq + steal) * tick_s()
    return CpuReading(wall_s=time.perf_counter(), busy_s=busy, own_s=own.user + own.system)


def others_cores(start: CpuReading, end: CpuReading) -> float:
    """Return the cores other processes used on average between two readings (0 when no wall time passed).

    The counters' resolution (SLACK_TICKS clock ticks) is taken off first, so a short block is not charged for
    rounding.
    """
    wall = end.wall_s - start.wall_s
    if wall <= 0:
        return 0.0
    others = (end.busy_s - start.busy_s) - (end.own_s - start.own_s) - SLACK_TICKS * tick_s()
    return max(0.0, others) / wall


def contended(cores: float) -> bool:
    """Return whether other processes' use of the CPUs during a block (`others_cores`) contended with it."""
    return cores >= OTHERS_LIMIT


def busy_now(read_counters=read, window_s: float = WINDOW_S) -> float | None:
    """Return the cores other processes use now, over `window_s` of wall time (None when not read).

    Before a contended block is timed again: a neighbour still running would contend with the second attempt too.
    """
    start = read_counters()
    time.sleep(window_s)
    end = read_counters()
    return others_cores(start, end) if start is not None and end is not None else None
