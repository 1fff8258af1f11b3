"""Contention the busy check cannot see: a reference workload timed through every timing block flags a slowed one.

The decision rule (a one-sided Mann-Whitney U test at `contention.ALPHA` with a minimum effect) is tested on seeded
synthetic samples: drawn from one distribution it flags at most its stated rate, shifted by 20% it flags. One test
runs the real workload, at a lower priority, beside a CPU-bound process pinned to the same core, where the reference
gets about a quarter of it (a slowdown far past the minimum effect whatever else the machine runs).
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import threading

import pytest
import torch
from helpers.latency_stand_ins import steady_latency
from torch import nn

from profiling_agent.tools.evaluation import contention, latency
from profiling_agent.tools.evaluation.form_eval import timing_notice
from profiling_agent.tools.evaluation.rank_test import p_greater

BLOCK = 2 * contention.CHECK_SAMPLES + 10  # a block of 10 repeats: before, one per repeat, after


def _draw(rng: random.Random, n: int, scale: float = 1.0, spikes: float = 0.0) -> list[float]:
    """Reference-like times: 3 ms with 5% log-normal noise, times `scale`; a `spikes` share runs 1.5-3x longer."""
    return [
        3.0 * scale * rng.lognormvariate(0.0, 0.05) * (rng.uniform(1.5, 3.0) if rng.random() < spikes else 1.0)
        for _ in range(n)
    ]


@pytest.mark.parametrize("spikes", [0.0, 0.1])
def test_blocks_drawn_like_the_calibration_are_flagged_at_most_at_the_stated_rate(spikes):
    rng = random.Random(49)
    draws = 400
    rejected = flagged = 0
    for _ in range(draws):
        quiet = contention.QuietReference(_draw(rng, contention.CALIBRATION_SAMPLES, spikes=spikes))
        block = _draw(rng, BLOCK, spikes=spikes)
        rejected += p_greater(block, quiet.samples_ms) < contention.ALPHA
        flagged += contention.judge(block, quiet)["contended"]
    # the exact test's size is at most ALPHA (4 of 400 expected); 10 or more would happen with p < 0.003
    assert rejected < 10 and flagged <= rejected, (rejected, flagged)


def test_a_block_whose_reference_ran_20_percent_slower_is_flagged_with_its_p_value():
    rng = random.Random(7)
    hits = 0
    for _ in range(200):
        quiet = contention.QuietReference(_draw(rng, contention.CALIBRATION_SAMPLES))
        facts = contention.judge(_draw(rng, BLOCK, scale=1.2), quiet)
        hits += facts["contended"]
    assert hits == 200
    assert facts["p_value"] < contention.ALPHA and facts["slowdown"] == pytest.approx(1.2, abs=0.05)
    assert "Mann-Whitney" in facts["rule"] and facts["alpha"] == contention.ALPHA
    small = contention.judge([3.03 + i * 1e-4 for i in range(BLOCK)], contention.QuietReference([3.0] * 20))
    assert small["p_value"] < contention.ALPHA and not small["contended"]  # significant but under MIN_EFFECT


def test_the_rank_test_matches_scipy_exact_and_asymptotic():
    stats = pytest.importorskip("scipy.stats")
    rng = random.Random(3)
    x, y = _draw(rng, 14, scale=1.03), _draw(rng, 20)
    exact = stats.mannwhitneyu(x, y, alternative="greater", method="exact").pvalue
    assert p_greater(x, y) == pytest.approx(exact, rel=1e-9)
    x, y = [round(t, 1) for t in _draw(rng, 40)], [round(t, 1) for t in _draw(rng, 40)]  # ties: the approximation
    asymptotic = stats.mannwhitneyu(x, y, alternative="greater", method="asymptotic").pvalue
    assert p_greater(x, y) == pytest.approx(asymptotic, rel=1e-9)
    assert p_greater([], y) == 1.0 and p_greater([1.0] * 5, [1.0] * 5) == 1.0


class _Machine:
    """A stand-in reference timer: 3 ms samples with seeded noise, `scale` times slower while set."""

    def __init__(self) -> None:
        self.rng, self.scale, self.calls = random.Random(0), 1.0, []

    def __call__(self, n: int) -> list[float]:
        self.calls.append(n)
        return _draw(self.rng, n, self.scale)


def test_a_contended_block_is_measured_again_and_flagged_with_the_test(monkeypatch):
    monkeypatch.setattr(latency, "measure_latency", steady_latency)
    machine = _Machine()
    check = contention.ReferenceCheck(machine)
    check.reference()
    machine.scale = 1.4  # a neighbour competes from now on
    _, timing = latency.measure_latency_checked({"a": nn.Identity()}, torch.zeros(1, 3, 4, 4), reference=check)
    assert machine.calls == [contention.CALIBRATION_SAMPLES, *([contention.CHECK_SAMPLES, *[1] * 10, 3] * 2)]
    assert timing["busy"] is False and timing["wall_over_cpu"] == 1.0  # the wall/CPU check alone would pass it
    assert timing["contended"] and timing["remeasured"] and len(timing["reference"]["samples_ms"]) == BLOCK
    assert timing["p_value"] < contention.ALPHA and timing["slowdown"] == pytest.approx(1.4, abs=0.06)
    notice = timing_notice(timing)
    assert "TIMINGS FLAGGED" in notice and "Mann-Whitney p=" in notice and "its quiet time" in notice
    machine.scale = 1.0
    _, timing = latency.measure_latency_checked({"a": nn.Identity()}, torch.zeros(1, 3, 4, 4), reference=check)
    assert timing["contended"] is False and not timing["remeasured"] and not contention.flagged(timing)
    assert "FLAGGED" not in timing_notice(timing) and timing["calibration_refreshed"] is False


def test_a_quiet_block_faster_than_the_calibration_refreshes_it_a_busy_one_does_not(tmp_path):
    machine = _Machine()
    machine.scale = 1.3  # the run calibrated beside a competitor that has since stopped
    check = contention.ReferenceCheck(machine, tmp_path)
    slow_median = check.reference().median_ms
    machine.scale = 1.0
    block = check.block()
    facts = block.finish()
    assert not facts["contended"]
    assert check.refresh(facts["samples_ms"], wall_over_cpu=2.0) is False  # starved: not a quiet block
    assert check.refresh(facts["samples_ms"], wall_over_cpu=1.02) is True
    assert check.reference().median_ms < slow_median / 1.2 and check.reference().refreshed == 1
    resumed = contention.ReferenceCheck(machine, tmp_path).reference()  # kept in the run folder
    assert resumed.samples_ms == check.reference().samples_ms and resumed.refreshed == 1
    assert check.refresh(facts["samples_ms"], wall_over_cpu=1.02) is False  # not faster than itself


def test_timed_repeats_call_the_probe_once_each_and_paired_ratios_carry_an_interval():
    torch.manual_seed(0)
    models = {"a": nn.Linear(8, 8), "b": nn.Sequential(nn.Linear(8, 64), nn.Linear(64, 8))}
    probes = []
    lat = latency.measure_latency(
        models, torch.randn(4, 8).unsqueeze(1).unsqueeze(1), batch_size=4, repeats=6, probe=lambda: probes.append(1)
    )
    assert len(probes) == 6 and all(len(lat[n]["samples_ms"]) == 6 and None not in lat[n]["samples_ms"] for n in models)
    clear = latency.paired_ratio({"samples_ms": [2.0, 2.2, 1.9, 2.1, 2.0]}, {"samples_ms": [1.0, 1.1, 1.0, 1.0, 1.0]})
    assert clear is not None and clear["ratio"] == 2.0 and clear["ci"][0] > 1.0 and clear["repeats"] == 5
    assert latency.measurably_different(clear) is True
    even = latency.paired_ratio({"samples_ms": [1.0, 1.3, 0.8, 1.2, 0.9]}, {"samples_ms": [1.0] * 5})
    assert even is not None and even["ci"][0] <= 1.0 <= even["ci"][1]
    assert latency.measurably_different(even) is False
    assert latency.paired_ratio({"samples_ms": [1.0, None]}, {"samples_ms": [1.0, 1.0]}) is None  # too few pairs


def test_the_quiet_reference_is_kept_in_the_run_folder_and_read_back(tmp_path):
    first = contention.use_run(tmp_path, timer=lambda n: [3.0 + i / 100 for i in range(n)])
    assert first.reference().median_ms == pytest.approx(3.095) and (tmp_path / contention.REFERENCE_FILE).exists()
    assert contention.use_run(tmp_path) is first  # later rounds of the same run: the same reference
    resumed = contention.use_run(tmp_path, timer=lambda n: [9.0] * n)  # a resumed process reads it back
    assert resumed is not first and resumed.reference().samples_ms == first.reference().samples_ms
    contention.use_run(None)


def test_a_run_that_starts_busy_is_judged_against_the_machines_quiet_calibration(tmp_path):
    path, rng = tmp_path / "machine.json", random.Random(1)

    def calibration(scale: float, wall_over_cpu: float = 1.0) -> contention.QuietReference:
        return contention.QuietReference(_draw(rng, contention.CALIBRATION_SAMPLES, scale), wall_over_cpu)

    first = contention.with_machine(calibration(1.0), path)
    assert first.machine_median_ms is None and not first.started_busy and contention.read_machine(path)  # kept
    busy = contention.with_machine(calibration(1.5), path)
    assert busy.started_busy and busy.samples_ms == contention.read_machine(path) == first.samples_ms
    assert contention.judge(_draw(rng, BLOCK, 1.5), busy)["contended"]  # a block as slow as that calibration
    starved = contention.with_machine(calibration(1.0, wall_over_cpu=1.6), path)  # not quiet: not kept
    assert not starved.started_busy and contention.read_machine(path) == first.samples_ms
    again = contention.with_machine(calibration(1.02), path)  # quiet and not slower: the machine's new calibration
    assert not again.started_busy and contention.read_machine(path) == again.samples_ms


def _quiet_calibration(attempts: int = 3) -> contention.ReferenceCheck:
    """Return a reference check calibrated on its core (wall at most QUIET_WALL_CPU x thread CPU), else the fastest."""
    checks = []
    for _ in range(attempts):
        checks.append(contention.ReferenceCheck())
        if 0 < checks[-1].reference().wall_over_cpu <= contention.QUIET_WALL_CPU:
            break
    return min(checks, key=lambda check: check.reference().median_ms)


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs os.sched_setaffinity (Linux)")
def test_a_process_competing_for_the_same_core_slows_the_reference_and_flags_the_block(monkeypatch, tmp_path):
    """The block runs in a thread at nice +5 beside a competitor at nice 0, both pinned to one core.

    At equal weights a kernel's time slice can be as long as a reference sample (about 2-9 ms), so a sample may run
    whole between the competitor's turns and the block's median barely moves (seen once in CI: p 0.073). At nice +5
    the thread's weight is about a third of the competitor's, so every sample is slowed (about 2-4x).
    """
    monkeypatch.setenv("PROFILING_AGENT_CACHE", str(tmp_path))  # the machine's kept calibration: this test's own
    before_affinity = os.sched_getaffinity(0)
    core = min(before_affinity)
    os.sched_setaffinity(0, {core})
    competitor = None
    judged: dict = {}

    def timed_block(check: contention.ReferenceCheck) -> None:
        os.sched_setaffinity(0, {core})  # this thread's own: its niceness ends with it
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 5)
        block = check.block()
        for _ in range(24):
            block.probe()
        judged.update(block.finish())

    try:
        check = _quiet_calibration()  # before the competitor starts
        spin = f"import os; os.sched_setaffinity(0, {{{core}}}); print('ready', flush=True)\nwhile True: pass"
        competitor = subprocess.Popen([sys.executable, "-c", spin], stdout=subprocess.PIPE, text=True)
        assert competitor.stdout is not None and competitor.stdout.readline().strip() == "ready"
        worker = threading.Thread(target=timed_block, args=(check,))
        worker.start()
        worker.join()
    finally:
        if competitor is not None:
            competitor.kill()
            competitor.wait()
        os.sched_setaffinity(0, before_affinity)
    assert judged["contended"] is True and judged["p_value"] < contention.ALPHA, judged
    assert judged["slowdown"] > 1 + contention.MIN_EFFECT, judged
