"""Resumed distillation: the budget fixes the step count once, a finished run is not redone, a failed write stops."""

from __future__ import annotations

import copy
import errno

import pytest
import torch

from profiling_agent.tools import interrupt
from profiling_agent.tools.compression.pruning import prune_model
from profiling_agent.tools.recovery import distill as distill_module
from profiling_agent.tools.recovery.distill import PROBE_STEPS, DistillConfig, decide_total, distill


def _synthetic(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(step)
    return torch.randn(8, 1, 16, 16, generator=gen), torch.randint(0, 10, (8,), generator=gen)


class _Clock:
    """A perf_counter (and process_time) advancing `step_s` (`cpu_s`) per call: distill reads them around each step."""

    def __init__(self, step_s: float, cpu_s: float | None = None) -> None:
        self.now, self.cpu, self.step_s = 1000.0, 10.0, step_s
        self.cpu_s = step_s if cpu_s is None else cpu_s

    def perf_counter(self) -> float:
        self.now += self.step_s
        return self.now

    def process_time(self) -> float:
        self.cpu += self.cpu_s
        return self.cpu


class _Stop(Exception):
    pass


def _die_after(step: int):
    def progress(p):
        if p["step"] == step:
            raise _Stop

    return progress


@pytest.fixture
def pruned(tiny_vit):
    start = copy.deepcopy(tiny_vit)
    prune_model(start, [{"layer": "mlp", "type": "structured", "ratio": 0.5}], torch.zeros(1, 1, 16, 16))
    return tiny_vit, start


def _gap(a: torch.nn.Module, b: torch.nn.Module) -> float:
    return max(
        (x - y).abs().max().item() for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True)
    )


def test_the_budget_fixes_the_steps_once_and_a_slower_resume_ends_at_the_same_step(pruned, tmp_path, monkeypatch):
    teacher, start = pruned
    config = DistillConfig(steps=40, lr=1e-3, save_every=4, seed=1, minutes=0.5)  # 30 s budget
    monkeypatch.setattr(distill_module, "time", _Clock(1.0))  # 1 s per step: 5 timed, 25 more fit
    whole = copy.deepcopy(start)
    info = distill(whole, teacher, _synthetic, config, checkpoint_dir=tmp_path / "a")
    assert info["steps_done"] == 30 and info["capped"]

    monkeypatch.setattr(distill_module, "time", _Clock(1.0))
    with pytest.raises(_Stop):
        distill(
            copy.deepcopy(start), teacher, _synthetic, config, checkpoint_dir=tmp_path / "b", progress=_die_after(14)
        )
    monkeypatch.setattr(distill_module, "time", _Clock(20.0))  # the resumed attempt is 20x slower
    resumed = copy.deepcopy(start)
    info_b = distill(resumed, teacher, _synthetic, config, checkpoint_dir=tmp_path / "b")
    assert info_b["resumed_from"] == 12 and info_b["steps_done"] == 30  # the decided count, not what 30 s allow
    assert info_b["seconds"] == pytest.approx(12 * 1.0 + 18 * 20.0)  # every attempt's time is counted
    gap = _gap(whole, resumed)
    print(f"largest weight difference, resumed vs uninterrupted: {gap:.3g}")
    assert gap <= 1e-6


def test_time_spent_before_the_decision_counts_toward_the_budget(pruned, tmp_path, monkeypatch):
    teacher, start = pruned
    config = DistillConfig(steps=40, lr=1e-3, save_every=1, seed=1, minutes=0.5)
    monkeypatch.setattr(distill_module, "time", _Clock(1.0))
    with pytest.raises(_Stop):
        distill(copy.deepcopy(start), teacher, _synthetic, config, checkpoint_dir=tmp_path, progress=_die_after(3))
    monkeypatch.setattr(distill_module, "time", _Clock(2.0))
    info = distill(copy.deepcopy(start), teacher, _synthetic, config, checkpoint_dir=tmp_path)
    # 3 steps at 1 s, then 5 timed steps at 2 s: 13 s spent, 17 s left for 8 more steps
    assert info["steps_done"] == 3 + PROBE_STEPS + 8 == decide_total(40, 8, 13.0, 2.0, 30.0)


def test_a_monitored_run_trains_the_same_numbers_however_fast_its_steps_are(pruned, tmp_path, monkeypatch):
    """Automatic recovery (budget_stops): the schedule spans the cap; the budget only stops the run when it runs out.

    A schedule fitted to the timed steps made two runs of the same pruned weights on a machine busy to different
    degrees train different numbers, so their plateau stopped at 400 and 1,000 steps.
    """
    teacher, start = pruned
    fitted = DistillConfig(steps=40, lr=1e-3, save_every=4, seed=1, minutes=0.5)
    stops = DistillConfig(steps=40, lr=1e-3, save_every=4, seed=1, minutes=0.5, budget_stops=True)
    runs = {}
    # a busy machine: a step waits for a core (1.5 s of wall time) but takes the same 0.1 s of CPU
    cases = [("fitted", fitted, "quiet", 0.1), ("fitted", fitted, "busy", 1.5)]
    cases += [("stops", stops, "quiet", 0.1), ("stops", stops, "busy", 1.5)]
    for name, config, machine, step_s in cases:
        monkeypatch.setattr(distill_module, "time", _Clock(step_s, cpu_s=0.1))
        student = copy.deepcopy(start)
        with pytest.raises(_Stop):  # compare the first 12 steps (the busy budget stops the run at 20)
            distill(
                student, teacher, _synthetic, config, checkpoint_dir=tmp_path / name / machine, progress=_die_after(12)
            )
        runs[name, machine] = student
    # 1.5 s a step fits 20 in 30 s: the fitted schedule spans 40 steps on the quiet machine, 20 on the busy one
    assert _gap(runs["fitted", "quiet"], runs["fitted", "busy"]) > 0
    assert _gap(runs["stops", "quiet"], runs["stops", "busy"]) == 0  # the same 12 steps, the same numbers
    assert "budget_stops" in stops.fingerprint() and "budget_stops" not in fitted.fingerprint()


def test_a_monitored_run_stops_at_the_step_that_exhausts_its_budget(pruned, tmp_path, monkeypatch):
    teacher, start = pruned
    config = DistillConfig(steps=40, lr=1e-3, save_every=4, seed=1, minutes=0.1, budget_stops=True)  # 6 s
    monkeypatch.setattr(distill_module, "time", _Clock(5.0, cpu_s=1.0))  # waits 4 s a step for a core
    info = distill(copy.deepcopy(start), teacher, _synthetic, config, checkpoint_dir=tmp_path)
    assert info["steps_done"] == 6 and info["capped"] and not info["stopped"]  # 6 CPU-s, not 6 wall seconds
    again = distill(copy.deepcopy(start), teacher, _synthetic, config, checkpoint_dir=tmp_path)
    assert again["resumed_from"] == again["steps_done"] == 6  # the stop was saved: a resume does not train on


def test_a_finished_distillation_is_not_redone(pruned, tmp_path):
    teacher, start = pruned
    config = DistillConfig(steps=6, lr=1e-3, save_every=2, seed=2)
    done = copy.deepcopy(start)
    distill(done, teacher, _synthetic, config, checkpoint_dir=tmp_path)
    again = copy.deepcopy(start)
    info = distill(again, teacher, _synthetic, config, checkpoint_dir=tmp_path, progress=_die_after(1))
    assert info["resumed_from"] == info["steps_done"] == 6 and len(info["curve"]) == 6
    assert _gap(done, again) == 0


def test_step_times_and_threads_of_every_attempt_are_recorded(pruned, tmp_path):
    teacher, start = pruned
    config = DistillConfig(steps=6, lr=1e-3, save_every=1, seed=2)
    with pytest.raises(_Stop):
        distill(copy.deepcopy(start), teacher, _synthetic, config, checkpoint_dir=tmp_path, progress=_die_after(2))
    info = distill(copy.deepcopy(start), teacher, _synthetic, config, checkpoint_dir=tmp_path)
    assert [a["from"] for a in info["attempts"]] == [0, 2]
    assert all(a["threads"] == torch.get_num_threads() for a in info["attempts"])
    assert len(info["step_seconds"]) == 6 and all(s > 0 for s in info["step_seconds"])


def test_a_full_disk_stops_distillation_with_oserror_and_keeps_the_last_step(pruned, tmp_path, monkeypatch):
    from profiling_agent.tools import io

    teacher, start = pruned
    config = DistillConfig(steps=8, lr=1e-3, save_every=2, seed=3)
    real = io.write_atomic
    writes = {"n": 0}

    def full_disk(path, write, **kw):
        writes["n"] += 1
        if writes["n"] > 4:  # the first saved step (tensors, its JSON, latest.json) fits, then the disk is full
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real(path, write, **kw)

    monkeypatch.setattr(io, "write_atomic", full_disk)
    with pytest.raises(OSError) as caught:
        distill(copy.deepcopy(start), teacher, _synthetic, config, checkpoint_dir=tmp_path)
    assert caught.value.errno == errno.ENOSPC
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest.json", "step_000001"]  # no half-written step
    monkeypatch.setattr(io, "write_atomic", real)
    info = distill(copy.deepcopy(start), teacher, _synthetic, config, checkpoint_dir=tmp_path)
    assert info["resumed_from"] == 2 and info["steps_done"] == 8


def test_a_stop_request_ends_distillation_between_steps(pruned, tmp_path):
    teacher, start = pruned
    config = DistillConfig(steps=8, lr=1e-3, save_every=1, seed=2)  # steps after the stop: the resume trains on

    def stop_at_three(p):
        if p["step"] == 3:
            interrupt.request_stop("SIGINT")

    try:
        with pytest.raises(interrupt.Interrupted):
            distill(copy.deepcopy(start), teacher, _synthetic, config, checkpoint_dir=tmp_path, progress=stop_at_three)
    finally:
        interrupt.clear()
    info = distill(copy.deepcopy(start), teacher, _synthetic, config, checkpoint_dir=tmp_path, progress=None)
    assert info["resumed_from"] == 3 and info["steps_done"] == 8
