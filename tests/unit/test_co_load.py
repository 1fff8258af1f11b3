"""Other processes' CPU use during a timing block, from the kernel's counters: measured, and what it decides."""

from __future__ import annotations

import subprocess
import sys
import time

import torch
from helpers.latency_stand_ins import steady_latency
from torch import nn

from profiling_agent.tools.evaluation import co_load, contention, latency
from profiling_agent.tools.evaluation.form_eval import timing_notice

STAT = "cpu  {user} 0 {system} 5000 7 0 0 {steal} 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\nintr 1\n"


def test_the_counters_are_read_from_proc_stat_and_a_foreign_file_reads_as_none(tmp_path):
    stat = tmp_path / "stat"
    stat.write_text(STAT.format(user=100, system=50, steal=10))
    reading = co_load.read(stat)
    assert reading is not None and abs(reading.busy_s - 160 * co_load.tick_s()) < 1e-9
    assert reading.own_s > 0  # this process has run
    for text in ("", "intr 1 2 3\n", "cpu  a b c d e f g h\n", "cpu  1 2\n"):
        stat.write_text(text)
        assert co_load.read(stat) is None, text
    assert co_load.read(tmp_path / "missing") is None


def test_others_cores_is_the_machines_busy_time_less_this_processs_over_the_wall_time():
    tick = co_load.tick_s()
    slack = co_load.SLACK_TICKS * tick
    start = co_load.CpuReading(wall_s=10.0, busy_s=100.0, own_s=5.0)
    neighbour = co_load.CpuReading(wall_s=12.0, busy_s=104.0 + slack, own_s=7.0)  # 2 s of ours, 2 s of another's
    assert abs(co_load.others_cores(start, neighbour) - 1.0) < 1e-9 and co_load.contended(1.0)
    alone = co_load.CpuReading(wall_s=12.0, busy_s=102.0 + slack / 2, own_s=7.0)  # rounding only
    assert co_load.others_cores(start, alone) == 0.0 and not co_load.contended(0.0)
    assert co_load.others_cores(start, start) == 0.0  # no wall time


def _readings(*others_cores: float):
    """A stand-in for `co_load.read`: one second per block, other processes using the given cores in turn."""
    state = {"wall": 0.0, "busy": 0.0, "i": 0}

    def read():
        state["wall"] += 0.5
        state["busy"] += 0.5 * others_cores[min(state["i"] // 2, len(others_cores) - 1)]
        state["i"] += 1
        return co_load.CpuReading(state["wall"], state["busy"] + co_load.SLACK_TICKS * co_load.tick_s(), 0.0)

    return read


def test_where_counted_other_processes_decide_and_the_rank_test_is_recorded_beside(monkeypatch):
    monkeypatch.setattr(latency, "measure_latency", steady_latency)
    check = contention.ReferenceCheck(lambda n: [2.0] * n, load=_readings(0.9, 0.0))  # reference at its quiet time
    _, timing = latency.measure_latency_checked({"a": nn.Identity()}, torch.zeros(1, 3, 4, 4), reference=check)
    first, kept = timing["slowdowns"], timing["reference"]
    assert timing["remeasured"] and first == [1.0, 1.0]  # the neighbour's block was taken again, quiet the 2nd time
    assert kept["others_cores"] == 0.0 and kept["reference_slower"] is False and not timing["contended"]
    check = contention.ReferenceCheck(lambda n: [2.0] * n, load=_readings(0.9))  # a neighbour throughout
    _, timing = latency.measure_latency_checked({"a": nn.Identity()}, torch.zeros(1, 3, 4, 4), reference=check)
    assert timing["contended"] and timing["reference"]["others_cores"] >= co_load.OTHERS_LIMIT
    # the neighbour was still running after the block: a second attempt would have been contended too
    still = 0.9 - co_load.SLACK_TICKS * co_load.tick_s() / 0.5  # each stand-in reading is half a second apart
    assert not timing["remeasured"] and f"still used {still:.2f} of a core" in timing["not_remeasured"]
    assert "measured once: other processes still used" in timing_notice(timing)
    reason = contention.flag_reason(timing)
    assert "other processes used" in reason and "of a core" in reason and "1.0x its quiet time" in reason
    assert "/proc/stat" in timing["reference"]["rule"]
    stand_in = contention.ReferenceCheck(lambda n: [2.0] * n)  # a stand-in workload reads no counters
    assert stand_in.load is None and contention.ReferenceCheck().load is co_load.read


def test_a_cpu_bound_process_beside_the_block_is_counted():
    start = co_load.read()
    if start is None:  # not Linux: nothing is measured there, and the rank test decides (tested elsewhere)
        assert sys.platform != "linux"
        return
    busy = subprocess.Popen([sys.executable, "-c", "import time\nt = time.time()\nwhile time.time() - t < 1.5: pass"])
    try:
        start = co_load.read()
        time.sleep(1.0)
        end = co_load.read()
    finally:
        busy.wait()
    assert start is not None and end is not None
    assert co_load.contended(co_load.others_cores(start, end))
