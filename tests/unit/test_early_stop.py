"""Recovery sized to the damage: distillation stops on a trial-slice plateau, and a hopeless candidate is rejected."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch

from profiling_agent.tools.recovery.distill import DistillConfig, Team, distill
from profiling_agent.tools.recovery.early_stop import PlateauMonitor, check_every, plateau_monitor, stop_reason
from profiling_agent.tools.recovery.policy import DEPTH_MAX_STEPS, MAX_STEPS, auto_cap_steps, auto_steps


def _synthetic(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(step)
    return torch.randn(8, 1, 16, 16, generator=gen), torch.randint(0, 10, (8,), generator=gen)


def _scripted(scores: list[float], seen: list[bool]):
    it = iter(scores)

    def score(model: torch.nn.Module) -> float:
        seen.append(model.training)
        model.eval()  # as predict does: distill must put it back in training mode
        return next(it)

    return score


def test_distillation_stops_on_a_plateau_and_records_why(tiny_vit, tmp_path):
    seen: list[bool] = []
    # checks at steps 5, 10, ...: best 62 at step 15, then three checks without a one-image gain
    monitor = PlateauMonitor(
        _scripted([50, 60, 62, 62.5, 62, 61, 99], seen), every=5, min_gain=1.0, min_steps=10, baseline=70.0
    )
    student = copy.deepcopy(tiny_vit)
    info = distill(
        student, tiny_vit, _synthetic, DistillConfig(steps=100), checkpoint_dir=tmp_path, team=Team(monitor=monitor)
    )
    assert info["steps_done"] == 30 and info["stopped"] == "plateau" and not info["capped"]
    assert stop_reason(info, auto=True) == "plateau" and monitor.stopped_at == 30
    assert [p[0] for p in monitor.curve] == [5, 10, 15, 20, 25, 30]
    assert monitor.curve[2] == [15, 62.0, 8.0]  # [step, trial top-1 %, loss vs the baseline pp]
    assert all(seen) and not student.training  # trained in training mode between checks, left in eval
    # a resume of the stopped run does nothing more: the stop was saved with its step
    again = copy.deepcopy(tiny_vit)
    info2 = distill(again, tiny_vit, _synthetic, DistillConfig(steps=100), checkpoint_dir=tmp_path)
    assert info2["steps_done"] == 30 and info2["stopped"] == "plateau"


def test_a_rising_curve_runs_to_the_cap_and_an_explicit_count_runs_in_full(tiny_vit):
    rising = PlateauMonitor(lambda m: float(len(rising.curve)) * 5.0, every=2, min_gain=1.0, min_steps=0)
    info = distill(copy.deepcopy(tiny_vit), tiny_vit, _synthetic, DistillConfig(steps=12), team=Team(monitor=rising))
    assert info["steps_done"] == 12 and info["stopped"] == "" and stop_reason(info, auto=True) == "cap"
    assert len(rising.curve) == 6
    plain = distill(copy.deepcopy(tiny_vit), tiny_vit, _synthetic, DistillConfig(steps=4))
    assert stop_reason(plain, auto=False) == "steps"
    assert stop_reason({"capped": True, "stopped": ""}, auto=True) == "time"


def test_every_plan_kind_gets_the_cap_and_checks_scale_with_it():
    # a width plan used to get EPOCHS passes (125 steps here); it now gets the depth cap, early stopping ends it
    assert auto_steps(2000, 32, 1_000_000) == 125
    assert auto_cap_steps(2000, 32, 1_000_000) == DEPTH_MAX_STEPS == auto_steps(2000, 32, 1_000_000, 1)
    assert auto_cap_steps(2000, 32, 50_000_000) == MAX_STEPS // 2  # a big model's steps cost minutes each
    assert check_every(3000) == 100 and check_every(200) == 25 and check_every(1000) == 50
    monitor = plateau_monitor(lambda m: 0.0, 128, 90.0, 3000)
    assert monitor.every == 100 and monitor.min_gain == pytest.approx(100 / 128) and monitor.baseline == 90.0


def test_a_recovered_trial_beyond_the_budget_is_rejected_before_the_full_evaluation():
    from profiling_agent.graph.routing import after_quantize
    from profiling_agent.nodes.recover import TrialSlice
    from profiling_agent.state import Candidate, CompressionPlan, PlannerMeta, RecoveryRecord
    from profiling_agent.tools.planning.history import planner_history

    labels = torch.arange(64) % 4
    trial = TrialSlice.__new__(TrialSlice)  # the slice without a run folder: its images, labels and baseline
    trial.pixels, trial.labels, trial.ids, trial.base, trial.baseline = torch.zeros(64, 1), labels, None, labels, 100.0
    broken = torch.cat([(labels[:16] + 1) % 4, labels[16:]])  # 16 of 64 wrong: 25 pp lost
    trial.predict = lambda model: model  # type: ignore[method-assign]
    record = RecoveryRecord(requested="auto", steps=300, trial_curve=[[100, 80.0, 20.0]])
    reason = trial.judge(broken, record, budget=2.0)
    assert "wholly beyond the 2 pp budget" in reason and "25.00 pp" in reason
    assert record.trial_curve == [[100, 80.0, 20.0], [300, 75.0, 25.0]] and "trial slice after recovery" in record.note
    fine = RecoveryRecord(requested="auto")
    assert trial.judge(labels, fine, budget=2.0) == "" and fine.trial_curve == [[0, 100.0, 0.0]]
    # the recover step marks it rejected: quantize hands it to iterate, never to evaluate
    cand = Candidate(iteration=1, status="rejected", error=reason, recovery=record)
    assert after_quantize(SimpleNamespace(current=cand)) == "iterate"  # type: ignore[arg-type]
    # the planner counts it as a miss at the trial slice's loss, not as a reviewer's no
    meta = PlannerMeta(goal=0.4, gamma=1.0, predicted_drop=3.0)
    cand = cand.model_copy(update={"plan": CompressionPlan(), "planner_meta": meta})
    from helpers.eval_records import evaluation

    from profiling_agent.state import Objective

    rounds = planner_history([cand], evaluation(accuracy=90.0), Objective(max_acc_drop=2.0))
    assert rounds[0].rejected is False and rounds[0].passed is False and rounds[0].drop == 25.0


def _snapshots(scores: list[float], taken: list[dict[str, torch.Tensor]]):
    """A scripted score that also keeps the weights it was shown (the student at each check)."""
    it = iter(scores)

    def score(model: torch.nn.Module) -> float:
        taken.append({k: v.detach().clone() for k, v in model.state_dict().items()})
        model.eval()
        return next(it)

    return score


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return all(torch.equal(a[k], b[k]) for k in a)


def test_the_best_checked_student_is_kept_when_the_last_step_is_worse_and_a_resume_keeps_it(tiny_vit, tmp_path):
    taken: list[dict[str, torch.Tensor]] = []
    # before distillation 70; checks at 5, 10, ...: 72 at step 10 is the best, then three checks without a gain
    monitor = PlateauMonitor(
        _snapshots([70, 60, 72, 65, 64, 63], taken), every=5, min_gain=1.0, min_steps=10, folder=tmp_path
    )
    student = copy.deepcopy(tiny_vit)
    monitor.start(student)
    info = distill(
        student, tiny_vit, _synthetic, DistillConfig(steps=100), checkpoint_dir=tmp_path, team=Team(monitor=monitor)
    )
    assert info["steps_done"] == 25 and monitor.best_step == 10
    killed_here = copy.deepcopy(student)  # a run killed before it kept the best: the last step's weights
    assert monitor.finish(student, 25) == (10, 72.0, 63.0)
    assert _same(student.state_dict(), taken[2]) and not _same(student.state_dict(), taken[5])
    # a resumed run: distill has nothing left to do; the best kept on disk is restored all the same
    resumed = PlateauMonitor(_snapshots([70, 63], []), every=5, min_gain=1.0, min_steps=10, folder=tmp_path)
    again = copy.deepcopy(tiny_vit)
    resumed.start(again)
    distill(again, tiny_vit, _synthetic, DistillConfig(steps=100), checkpoint_dir=tmp_path, team=Team(monitor=resumed))
    assert _same(again.state_dict(), killed_here.state_dict())  # distill restored the last saved step
    assert resumed.finish(again, 25) == (10, 72.0, 63.0) and _same(again.state_dict(), taken[2])


def test_a_distillation_that_only_hurts_keeps_the_student_it_started_from(tiny_vit):
    taken: list[dict[str, torch.Tensor]] = []
    monitor = PlateauMonitor(_snapshots([80, 70, 71, 72], taken), every=5, min_gain=1.0, min_steps=10)
    student = copy.deepcopy(tiny_vit)
    monitor.start(student)
    info = distill(student, tiny_vit, _synthetic, DistillConfig(steps=100), team=Team(monitor=monitor))
    assert info["steps_done"] == 15 and info["stopped"] == "plateau"  # the start counts as the best to beat
    assert monitor.finish(student, 15) == (0, 80.0, 72.0) and _same(student.state_dict(), taken[0])
    # a last step as good as the best (within one image) stays: the more trained student is kept
    level = PlateauMonitor(_snapshots([80, 79.5, 79.5, 79.5], []), every=5, min_gain=1.0, min_steps=10)
    other = copy.deepcopy(tiny_vit)
    level.start(other)
    distill(other, tiny_vit, _synthetic, DistillConfig(steps=100), team=Team(monitor=level))
    assert level.finish(other, 15) is None
