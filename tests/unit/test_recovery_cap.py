"""Issue 46 item 3: automatic distillation's step cap scales with the share of the model the plan removed."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from profiling_agent.state import Context, RecoveryRecord
from profiling_agent.tools.recovery import candidate
from profiling_agent.tools.recovery.early_stop import plateau_monitor
from profiling_agent.tools.recovery.policy import (
    cap_share,
    cap_steps_note,
    removed_share,
    scaled_cap_steps,
)


def test_the_removed_share_is_the_larger_of_parameters_and_macs():
    assert removed_share(1000, 950, 2000, 1800) == pytest.approx(0.10)  # MACs fell more than parameters
    assert removed_share(1000, 1000, 2000, 1000) == pytest.approx(0.50)  # token merging: MACs only
    assert removed_share(1000, 700, None, None) == pytest.approx(0.30)  # MACs unknown: parameters alone
    assert removed_share(None, None, 0, 5) is None  # neither known
    assert removed_share(1000, 1200, 2000, 2000) == 0.0  # never negative


def test_the_cap_is_proportional_to_the_smaller_damage_within_two_passes_and_the_whole_cap():
    assert scaled_cap_steps(3000, 90, 0.05) == 300  # a plan that removes 5% gets a tenth of the cap
    assert scaled_cap_steps(3000, 90, 0.25) == 1500
    assert scaled_cap_steps(3000, 90, 0.50) == 3000 == scaled_cap_steps(3000, 90, 0.9)  # half or more: all of it
    assert scaled_cap_steps(3000, 90, 0.42, 2.0) == 600  # removed 42% but lost 2 pp after the refit: a fifth
    assert scaled_cap_steps(3000, 90, 0.05, 30.0) == 300  # removed little: the smaller share rules
    assert scaled_cap_steps(3000, 90, None, 5.0) == 1500  # the loss alone when the share is unknown
    assert scaled_cap_steps(3000, 90, 0.01) == 90  # never fewer than the two passes a width plan used to get
    assert scaled_cap_steps(3000, 90, 0.4, -1.0) == 90  # a student better than the baseline: two passes
    assert scaled_cap_steps(3000, 90, 0.05, 0.1, removed_blocks=1) == 3000  # removed blocks: the whole cap
    assert scaled_cap_steps(3000, 90, None) == 3000 and cap_share(None, None) == 1.0  # nothing known: all of it
    assert scaled_cap_steps(150, 300, 0.05) == 150  # a big model's cap stays below its floor


def test_the_note_says_the_cap_and_what_the_plan_removed_and_lost():
    assert cap_steps_note(300, 3000, 0.05) == (
        "distillation capped at 300 steps: the plan removed 5.0% (3000 for 50% or 10 pp)"
    )
    assert cap_steps_note(600, 3000, 0.421, 2.0) == (
        "distillation capped at 600 steps: the plan removed 42.1% and lost 2.00 pp on the trial slice before "
        "distillation (3000 for 50% or 10 pp)"
    )
    assert cap_steps_note(3000, 3000, 0.7) == "" and cap_steps_note(3000, 3000, None) == ""


def _setup(monkeypatch, tiny_vit, ctx: Context, removed: float | None, removed_blocks: int = 0, before: float = 88.0):
    monkeypatch.setattr(candidate, "TrainBatches", lambda *a, **k: SimpleNamespace(batch=k["batch"]))
    scores = iter([before])
    job = SimpleNamespace(
        source=SimpleNamespace(rows=list(range(1437))),
        processor=None,
        shape={},
        labels={},
        seed=0,
        macs=None,
        removed=removed,
        removed_blocks=removed_blocks,
        # the trial slice: 100 images, the baseline at 90%; the student scores `before` before distillation
        monitor=lambda cap: plateau_monitor(lambda m: next(scores), 100, 90.0, cap),
        pruned=None,
    )
    record = RecoveryRecord(requested="auto", note="distilled on 1437 images")
    return candidate.distill_setup(tiny_vit, job, ctx, record), record  # type: ignore[arg-type]


def test_distill_setup_scales_auto_steps_by_the_measured_loss_and_an_explicit_count_wins(monkeypatch, tiny_vit):
    # the digits' 1,437 training images at batch 32: a cap of 3,000 steps, two passes = 90 steps
    setup, record = _setup(monkeypatch, tiny_vit, Context(), removed=0.1)  # 2 pp lost before distillation
    assert setup.config.steps == 600 and setup.monitor.every == 30  # the monitor checks at the scaled cap's pace
    assert setup.monitor.curve == [[0, 88.0, 2.0]] and setup.monitor.best_step == 0  # started: step 0 is a point
    assert "; distillation capped at 600 steps: the plan removed 10.0% and lost 2.00 pp" in record.note
    wide, _ = _setup(monkeypatch, tiny_vit, Context(), removed=0.3, before=60.0)  # 30 pp lost: the share rules
    assert wide.config.steps == 1800 and wide.monitor.every == 90
    whole, record = _setup(monkeypatch, tiny_vit, Context(), removed=0.1, removed_blocks=1)
    assert whole.config.steps == 2156 and "capped at" not in record.note  # 96 passes at the depth batch, 64
    asked, record = _setup(monkeypatch, tiny_vit, Context(recover_steps=40), removed=0.1)
    assert asked.config.steps == 40 and asked.monitor is None and "capped at" not in record.note
    many, _ = _setup(monkeypatch, tiny_vit, Context(recover_procs=2), removed=0.1)  # a job: no monitor runs
    assert many.config.steps == 600 and many.monitor.curve == []  # the removed share alone
