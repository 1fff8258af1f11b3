"""Stand-ins for `latency.measure_latency` in the timing-trust tests."""

from __future__ import annotations


def steady_latency(models, sample, probe=None, repeats=10, **kwargs):
    """A measure_latency stand-in whose wall time equals its CPU time (the busy check sees nothing).

    It calls `probe` at the start of each of its `repeats`, as `measure_latency` does (the reference workload).
    """
    for _ in range(repeats):
        if probe is not None:
            probe()
    return {n: {"latency_ms": 1.0, "latency_batch_ms": 2.0, "wall_s": 1.0, "cpu_s": 1.0} for n in models}
