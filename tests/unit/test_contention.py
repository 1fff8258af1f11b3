"""Contention the busy check cannot see: a reference workload timed around every timing block flags a slowed one.

The rule is tested on synthetic reference times (an injected timer); one test runs the real workload beside a
CPU-bound process pinned to the same core, where the reference gets about half of it (a slowdown near 2x, far
past the tolerance whatever else the machine runs: the quiet reference is the fastest of 15 samples).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from torch import nn

from profiling_agent.tools.evaluation import contention, latency
from profiling_agent.tools.evaluation.form_eval import timing_notice


def _timer(values):
    """A reference timer that answers from `values` (one list per call, cycled through in order)."""
    calls = iter(values)
    return lambda n: list(next(calls))


def test_a_block_is_flagged_only_when_its_reference_ran_slower_than_the_quiet_noise():
    quiet = contention.calibrate(lambda n: [2.0, 2.02, 2.04, 2.01, 2.03])
    assert quiet.quiet_ms == 2.0 and quiet.spread == pytest.approx(0.01)
    assert quiet.tolerance == contention.MIN_TOLERANCE  # 3 x 1% noise is under the 10% floor
    calm = contention.judge(2.05, 2.1, quiet)
    assert calm["contended"] is False and calm["slowdown"] == pytest.approx(1.05)
    slowed = contention.judge(2.05, 2.5, quiet)  # a neighbour slowed the block's end by 25%
    assert slowed["contended"] is True and slowed["slowdown"] == pytest.approx(1.25)
    assert slowed["before_ms"] == 2.05 and slowed["after_ms"] == 2.5 and "quiet calibration" in slowed["rule"]
    noisy = contention.calibrate(lambda n: [2.0, 2.2, 2.4, 2.3, 2.6])  # the reference's own noise is 15%
    assert noisy.tolerance == contention.MAX_TOLERANCE  # 3 x 15% capped at 25%
    assert contention.judge(2.4, 2.4, noisy)["contended"] is False
    assert contention.judge(2.6, 2.4, noisy)["contended"] is True


def test_a_contended_block_is_measured_again_and_flagged_with_the_reason(monkeypatch):
    def fake(models, sample, **kwargs):  # wall equals CPU time: the busy check sees nothing
        return {n: {"latency_ms": 1.0, "latency_batch_ms": 2.0, "wall_s": 1.0, "cpu_s": 1.0} for n in models}

    monkeypatch.setattr(latency, "measure_latency", fake)
    calibration = [2.0] * contention.CALIBRATION_SAMPLES
    slowed = contention.ReferenceCheck(_timer([calibration, [2.0] * 5, [3.0] * 5, [2.1] * 5, [2.9] * 5]))
    _, timing = latency.measure_latency_checked({"a": nn.Identity()}, torch.zeros(1, 3, 4, 4), reference=slowed)
    assert timing["busy"] is False and timing["wall_over_cpu"] == 1.0  # the old check alone would pass it
    assert timing["contended"] is True and timing["remeasured"] and timing["slowdowns"] == [1.5, 1.45]
    assert timing["slowdown"] == 1.45 and timing["reference"]["after_ms"] == 2.9  # the less contended attempt
    assert contention.flagged(timing) and "TIMINGS FLAGGED" in timing_notice(timing)
    assert "1.45x its quiet time" in timing_notice(timing)
    calm = contention.ReferenceCheck(_timer([calibration, [2.0] * 5, [2.1] * 5]))
    _, timing = latency.measure_latency_checked({"a": nn.Identity()}, torch.zeros(1, 3, 4, 4), reference=calm)
    assert timing["contended"] is False and not timing["remeasured"] and not contention.flagged(timing)
    assert "FLAGGED" not in timing_notice(timing)


def test_the_quiet_reference_is_kept_in_the_run_folder_and_read_back(tmp_path):
    first = contention.use_run(tmp_path, timer=lambda n: [3.0] * n)
    assert first.reference().quiet_ms == 3.0 and (tmp_path / contention.REFERENCE_FILE).exists()
    assert contention.use_run(tmp_path) is first  # later rounds of the same run: the same reference
    resumed = contention.use_run(tmp_path, timer=lambda n: [9.0] * n)  # a resumed process reads it back
    assert resumed is not first and resumed.reference().quiet_ms == 3.0
    contention.use_run(None)


def test_timed_repeats_are_interleaved_and_paired_ratios_carry_an_interval():
    torch.manual_seed(0)
    models = {"a": nn.Linear(8, 8), "b": nn.Sequential(nn.Linear(8, 64), nn.Linear(64, 8))}
    lat = latency.measure_latency(models, torch.randn(4, 8).unsqueeze(1).unsqueeze(1), batch_size=4, repeats=6)
    assert all(len(lat[n]["samples_ms"]) == 6 and None not in lat[n]["samples_ms"] for n in models)
    clear = latency.paired_ratio({"samples_ms": [2.0, 2.2, 1.9, 2.1, 2.0]}, {"samples_ms": [1.0, 1.1, 1.0, 1.0, 1.0]})
    assert clear is not None and clear["ratio"] == 2.0 and clear["ci"][0] > 1.0 and clear["repeats"] == 5
    assert latency.measurably_different(clear) is True
    even = latency.paired_ratio({"samples_ms": [1.0, 1.3, 0.8, 1.2, 0.9]}, {"samples_ms": [1.0] * 5})
    assert even is not None and even["ci"][0] <= 1.0 <= even["ci"][1]
    assert latency.measurably_different(even) is False
    assert latency.paired_ratio({"samples_ms": [1.0, None]}, {"samples_ms": [1.0, 1.0]}) is None  # too few pairs


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs os.sched_setaffinity (Linux)")
def test_a_process_competing_for_the_same_core_slows_the_reference_and_flags_the_block():
    before_affinity = os.sched_getaffinity(0)
    core = min(before_affinity)
    os.sched_setaffinity(0, {core})
    competitor = None
    try:
        check = contention.ReferenceCheck()
        quiet = check.reference()  # the fastest of 15 samples, before the competitor starts
        spin = f"import os; os.sched_setaffinity(0, {{{core}}}); print('ready', flush=True)\nwhile True: pass"
        competitor = subprocess.Popen([sys.executable, "-c", spin], stdout=subprocess.PIPE, text=True)
        assert competitor.stdout is not None and competitor.stdout.readline().strip() == "ready"
        judged = contention.judge(check.sample(), check.sample(), quiet)
    finally:
        if competitor is not None:
            competitor.kill()
            competitor.wait()
        os.sched_setaffinity(0, before_affinity)
    assert judged["slowdown"] > 1.0 + contention.MAX_TOLERANCE and judged["contended"] is True, judged


def test_a_run_that_starts_busy_is_judged_against_the_machines_floor(tmp_path):
    """A calibration taken beside competitors is compared with the fastest one this machine ever took."""
    floor_file = tmp_path / "floor.json"
    quiet = contention.with_machine_floor(contention.calibrate(lambda n: [2.0] * n), floor_file)
    assert quiet.machine_floor_ms is None and not quiet.started_busy  # first run: it becomes the floor
    busy = contention.with_machine_floor(contention.calibrate(lambda n: [3.0] * n), floor_file)
    assert busy.started_busy and busy.quiet_ms == 2.0 and busy.machine_floor_ms == 2.0
    facts = contention.judge(3.0, 3.0, busy)  # a block as slow as the busy calibration is contended
    assert facts["contended"] and facts["started_busy"] and facts["slowdown"] == 1.5
    close = contention.with_machine_floor(contention.calibrate(lambda n: [2.1] * n), floor_file)
    assert not close.started_busy and close.quiet_ms == 2.1  # within the tolerance: the run's own calibration
    faster = contention.with_machine_floor(contention.calibrate(lambda n: [1.5] * n), floor_file)
    assert faster.quiet_ms == 1.5 and contention.read_floor(floor_file) == 1.5  # the floor only moves down
