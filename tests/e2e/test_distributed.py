"""Distillation as a torch.distributed job: 2 gloo processes equal 1, a killed job resumes, shards add up.

The jobs whose launcher's part is under test (a rank killed, a stop request) run under torchrun; the others (the
uninterrupted run, the resume after the kill, the budget) fork their ranks from one interpreter that has imported
the libraries (helpers.forked_ranks): the same ranks, gloo group and job files, without each rank's seconds of
imports.
"""

from __future__ import annotations

import copy
import os
import signal
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers.forked_ranks import launcher

from profiling_agent.tools.data.train_stream import TrainBatches, TrainSource
from profiling_agent.tools.recovery import distill_state
from profiling_agent.tools.recovery.distill import DistillConfig, distill
from profiling_agent.tools.recovery.distributed import (
    JobData,
    JobFiles,
    JobLaunch,
    ShardBatches,
    distill_in_job,
    shard_bounds,
)
from profiling_agent.tools.recovery.distributed_launch import DistributedJobError, launcher_command

# 2 processes vs 1 (docs/distributed.md, "Equivalence"): DDP averages two half-batch gradients, so they differ from
# the whole batch's by float rounding (~1e-10). AdamW divides by |g| + 1e-8: an element whose gradient is ~1e-8
# moves by a visibly different fraction of the learning rate. Measured at lr 1e-3, 12 steps: one element of a shortcut
# convolution differs by 1.57e-5 (from step 1 on), every other tensor by at most 2.4e-7.
WEIGHT_TOLERANCE = 5e-5  # largest |w_2 - w_1| allowed: 5% of one AdamW step at lr 1e-3
CLOSE = 1e-6  # elements further apart than this must be rare (at most 0.1% of them)
MAPPING = {"dataset_to_model": {str(i): i for i in range(10)}}
SHAPE = {"channels": 1, "height": 16, "width": 16}
LAUNCHER = "torchrun --standalone --nproc-per-node {procs} --monitor-interval 0.2"
FORKED = launcher()  # ranks forked from one interpreter with the libraries imported (helpers.forked_ranks)
CONFIG = DistillConfig(steps=12, lr=1e-3, save_every=2, seed=1)  # the runs the kill, stop and equivalence tests share


@pytest.fixture(scope="module")
def models(digits):
    """A tiny ResNet teacher (the `tiny_resnet` fixture's), its pruned student and the digits images as training rows.

    Built once for the module: tests copy the student before they train it.
    """
    from helpers.tiny import resnet_config, seeded
    from transformers import ResNetForImageClassification

    from profiling_agent.tools.compression.pruning import prune_model

    teacher = seeded(ResNetForImageClassification, resnet_config())
    student = copy.deepcopy(teacher)
    prune_model(student, [{"layer": "conv", "type": "structured", "ratio": 0.5}], torch.zeros(1, 1, 16, 16))
    source = TrainSource(digits, "test", np.arange(200), "image", "label")
    return teacher, student, source


@pytest.fixture
def job_setup(models, processor, tmp_path):
    """The teacher saved as an artifact in TMP_PATH/teacher, a fresh copy of the pruned student, the training rows."""
    from profiling_agent.tools.models.artifacts import save_artifact

    teacher, student, source = models
    save_artifact(teacher, tmp_path / "teacher", processor=processor)
    return teacher, copy.deepcopy(student), source, tmp_path


@pytest.fixture(scope="module")
def uninterrupted(models, tmp_path_factory):
    """The 12 steps of CONFIG run once without a stop, on one process and as a 2-process gloo job.

    What the equivalence, kill and stop tests compare with: `single` and `double` (the trained students), `info`
    (the job's result), `seen` (its progress items) and `steps` (its step checkpoints).
    """
    from types import SimpleNamespace

    from helpers.tiny import digits_processor

    from profiling_agent.tools.models.artifacts import save_artifact

    teacher, start, source = models
    processor = digits_processor()  # the `processor` fixture's, built here for the module's scope
    tmp = tmp_path_factory.mktemp("uninterrupted")
    save_artifact(teacher, tmp / "teacher", processor=processor)
    single = copy.deepcopy(start)
    distill(single, teacher, _batches(source, processor), CONFIG)
    seen = []
    double = copy.deepcopy(start)
    info = _job(double, tmp, _batches(source, processor), CONFIG, progress=seen.append, launcher=FORKED)
    return SimpleNamespace(single=single, double=double, info=info, seen=seen, steps=tmp / "steps")


def _batches(source, processor, **kw):
    return TrainBatches(source, processor, SHAPE, MAPPING, batch=16, seed=3, **kw)


def _diffs(a: torch.nn.Module, b: torch.nn.Module) -> torch.Tensor:
    pairs = zip(a.state_dict().values(), b.state_dict().values(), strict=True)
    return torch.cat([(x.float() - y.float()).abs().flatten() for x, y in pairs])


def _max_diff(a: torch.nn.Module, b: torch.nn.Module) -> float:
    return _diffs(a, b).max().item()


def _assert_equivalent(a: torch.nn.Module, b: torch.nn.Module, digits, processor) -> None:
    """Weights within the stated tolerance, and the same predictions on images neither trained on."""
    from profiling_agent.tools.data.preprocess import preprocess_images
    from profiling_agent.tools.evaluation.metrics import predict

    diffs = _diffs(a, b)
    assert diffs.max().item() <= WEIGHT_TOLERANCE, diffs.max().item()
    assert (diffs > CLOSE).float().mean().item() <= 1e-3, int((diffs > CLOSE).sum())
    held = digits.select(range(200, len(digits)))
    pixels = preprocess_images(held["image"], processor, SHAPE)
    assert torch.equal(predict(a, pixels), predict(b, pixels))


def _job(student, setup_dir, batches, config, procs=2, progress=None, ckpt="steps", launcher=LAUNCHER):
    return distill_in_job(
        student,
        setup_dir / "teacher",
        batches,
        config,
        data=JobData("embedded:digits", MAPPING),
        files=JobFiles(setup_dir / "job", setup_dir / ckpt, {"pruned": "x", "batch": 16}),
        launch=JobLaunch(procs, launcher),
        progress=progress,
    )


def test_rank_slices_put_together_are_the_single_process_batch(digits, processor):
    source = TrainSource(digits, "test", np.arange(100), "image", "label")
    whole = _batches(source, processor)
    for world in (2, 3):
        for step in (0, 7):
            parts = [
                ShardBatches(source, processor, SHAPE, MAPPING, batch=16, seed=3, rank=r, world=world)(step)
                for r in range(world)
            ]
            pixels, labels = whole(step)
            assert torch.equal(torch.cat([p for p, _ in parts]), pixels)
            assert torch.equal(torch.cat([lab for _, lab in parts]), labels)
    assert [shard_bounds(10, r, 3) for r in range(3)] == [(0, 3), (3, 6), (6, 10)]


def test_augmenting_a_slice_draws_what_the_whole_batch_draws():
    from profiling_agent.tools.data.train_stream import augment

    pixels = torch.randn(11, 3, 20, 24, generator=torch.Generator().manual_seed(0))
    whole = augment(pixels, torch.Generator().manual_seed(5), True, (0.6, 1.0))
    for lo, hi in ((0, 4), (4, 11), (3, 3), (10, 11)):
        part = augment(pixels[lo:hi], torch.Generator().manual_seed(5), True, (0.6, 1.0), lo, 11)
        assert torch.equal(part, whole[lo:hi]), (lo, hi)


def test_launcher_template_gets_the_process_count_and_the_module():
    cmd = launcher_command("srun -n {procs} python", 4, "m.n", ["spec.json"])
    assert cmd == ["srun", "-n", "4", "python", "-m", "m.n", "spec.json"]
    assert launcher_command("torchrun --nproc-per-node {procs}", 2, "m", [])[-3:] == ["2", "-m", "m"]
    with pytest.raises(ValueError):
        launcher_command("", 2, "m", [])


@pytest.mark.slow
def test_two_gloo_processes_end_with_the_single_process_weights(models, uninterrupted, processor, digits):
    start = models[1]
    single, double, info = uninterrupted.single, uninterrupted.double, uninterrupted.info
    gap = _max_diff(single, double)
    print(f"largest weight difference, 2 gloo processes vs 1 process, 12 steps: {gap:.3g}")
    assert info["procs"] == 2 and info["steps_done"] == 12 and info["resumed_from"] == 0
    assert [p["step"] for p in uninterrupted.seen] == list(range(1, 13))
    _assert_equivalent(single, double, digits, processor)
    assert _max_diff(start, double) > 1e-3  # it did train
    assert distill_state.peek(uninterrupted.steps)["step"] == 11


@pytest.mark.slow
def test_a_rank_killed_mid_job_leaves_steps_that_either_kind_of_run_resumes(
    job_setup, uninterrupted, processor, digits
):
    teacher, start, source, tmp = job_setup

    def kill_rank_1(item):
        if item["step"] == 7:
            pid = int((tmp / "job" / "rank1.pid").read_text().split()[0])
            os.kill(pid, signal.SIGKILL)

    with pytest.raises(DistributedJobError) as failed:
        _job(copy.deepcopy(start), tmp, _batches(source, processor), CONFIG, progress=kill_rank_1)
    message = str(failed.value)
    print(message)
    assert "\n" not in message and "killed by SIGKILL" in message and "resume continues" in message, message
    saved = distill_state.peek(tmp / "steps")
    assert saved is not None and 5 <= saved["step"] < 11, saved
    import shutil

    shutil.copytree(tmp / "steps", tmp / "steps_single")
    resumed = copy.deepcopy(start)  # the distributed job continues its own steps...
    info = _job(resumed, tmp, _batches(source, processor), CONFIG, launcher=FORKED)
    assert info["resumed_from"] == saved["step"] + 1 and info["steps_done"] == 12
    assert [c[0] for c in info["curve"]] == list(range(12))  # every step once
    gap = _max_diff(uninterrupted.double, resumed)
    print(f"largest weight difference, 2 processes killed and resumed vs uninterrupted: {gap:.3g}")
    assert gap == 0.0, gap  # same world size: the same sums in the same order
    single = copy.deepcopy(start)  # ...and so does a single-process run
    info_single = distill(
        single,
        teacher,
        _batches(source, processor),
        CONFIG,
        checkpoint_dir=tmp / "steps_single",
        fingerprint={"pruned": "x", "batch": 16},
    )
    assert info_single["resumed_from"] == saved["step"] + 1 and info_single["steps_done"] == 12
    _assert_equivalent(uninterrupted.single, single, digits, processor)


@pytest.mark.slow
def test_a_stop_request_ends_the_job_and_its_ranks_and_a_single_process_resumes_it(
    job_setup, uninterrupted, processor, digits
):
    import time

    from profiling_agent.tools import interrupt

    teacher, start, source, tmp = job_setup

    def stop_at_five(item):
        if item["step"] == 5:
            interrupt.request_stop("SIGINT")  # what Ctrl-C does in the parent

    try:
        with pytest.raises(interrupt.Interrupted):
            _job(copy.deepcopy(start), tmp, _batches(source, processor), CONFIG, progress=stop_at_five)
    finally:
        interrupt.clear()
    pids = [int(p.read_text().split()[0]) for p in (tmp / "job").glob("rank*.pid")]
    assert len(pids) == 2
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(pid) for pid in pids)
    saved = distill_state.peek(tmp / "steps")
    assert saved is not None and 3 <= saved["step"] < 11, saved
    assert saved["attempts"] == [{"from": 0, "threads": 1, "procs": 2}]
    single = copy.deepcopy(start)
    info = distill(
        single, teacher, _batches(source, processor), CONFIG, checkpoint_dir=tmp / "steps",
        fingerprint={"pruned": "x", "batch": 16},
    )  # fmt: skip
    assert info["resumed_from"] == saved["step"] + 1 and [c[0] for c in info["curve"]] == list(range(12))
    assert [a["from"] for a in info["attempts"]] == [0, saved["step"] + 1]
    _assert_equivalent(uninterrupted.single, single, digits, processor)


@pytest.mark.slow
def test_rank_0_decides_the_budget_for_every_rank_and_a_single_process_keeps_the_decision(job_setup, processor):
    teacher, start, source, tmp = job_setup
    config = DistillConfig(steps=40, lr=1e-3, seed=1, minutes=1e-6)  # the budget is spent by the 5 timed steps
    info = _job(copy.deepcopy(start), tmp, _batches(source, processor), config, launcher=FORKED)
    assert info["steps_done"] == 5 and info["capped"] and len(info["curve"]) == 5  # both ranks stopped there
    saved = distill_state.peek(tmp / "steps")
    assert saved["step"] == 4 and saved["decided"] and saved["total"] == 5 and saved["probe_seconds"] > 0
    again = distill(
        copy.deepcopy(start), teacher, _batches(source, processor), config, checkpoint_dir=tmp / "steps",
        fingerprint={"pruned": "x", "batch": 16},
    )  # fmt: skip
    assert again["resumed_from"] == 5 and again["steps_done"] == 5 and len(again["attempts"]) == 1


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return not Path(f"/proc/{pid}/stat").read_text().split(") ")[-1].startswith("Z")  # a zombie has ended
    except (ProcessLookupError, FileNotFoundError):
        return False


def test_process_count_and_launcher_flags_reach_the_context_and_bad_values_are_refused():
    from profiling_agent.graph.cli.args import BadInput, build_parser, context_from_args

    args = build_parser().parse_args(["run", "--recover-procs", "4", "--launcher", "srun -n {procs} python"])
    ctx = context_from_args(args)
    assert ctx["recover_procs"] == 4 and ctx["launcher"] == "srun -n {procs} python"
    for bad in (["--recover-procs", "0"], ["--launcher", "  "]):
        with pytest.raises(BadInput):
            context_from_args(build_parser().parse_args(["run", *bad]))


def test_more_processes_than_gpus_on_one_node_is_refused_before_the_run(monkeypatch):
    from profiling_agent.graph.cli.args import BadInput, build_parser, context_from_args

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(BadInput, match="has 1; use --recover-procs 1, --device cpu"):
        context_from_args(build_parser().parse_args(["run", "--recover-procs", "2"]))
    for fine in (["--recover-procs", "1"], ["--recover-procs", "2", "--device", "cpu"],
                 ["--recover-procs", "2", "--launcher", "srun -n {procs} python"]):  # fmt: skip
        context_from_args(build_parser().parse_args(["run", *fine]))


def test_a_stop_request_stops_the_job_and_its_ranks(tmp_path):
    from profiling_agent.tools.recovery.distributed_launch import run_job

    script = (
        "import time\nfor i in range(600):\n    print('@@profiling-agent-progress {}', flush=True)\n    time.sleep(0.1)"
    )
    asked = []
    with pytest.raises(KeyboardInterrupt):
        run_job([sys.executable, "-c", script], tmp_path, progress=asked.append, should_stop=lambda: len(asked) >= 3)
    assert len(asked) == 3


def test_a_job_that_cannot_start_is_one_line(job_setup, processor):
    _teacher, start, source, tmp = job_setup
    with pytest.raises(DistributedJobError) as failed:
        distill_in_job(
            start,
            tmp / "teacher",
            _batches(source, processor),
            DistillConfig(steps=2),
            data=JobData("embedded:digits", MAPPING),
            files=JobFiles(tmp / "job", tmp / "s", {}),
            launch=JobLaunch(2, "/nonexistent/torchrun --nproc-per-node {procs}"),
        )
    assert "cannot start" in str(failed.value) and "\n" not in str(failed.value)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: the NCCL path needs GPUs")
def test_nccl_job_on_the_gpus(job_setup, processor):
    teacher, start, source, tmp = job_setup
    procs = min(2, torch.cuda.device_count())
    config = DistillConfig(steps=4, lr=1e-3, seed=1)
    student = copy.deepcopy(start)
    info = distill_in_job(
        student,
        tmp / "teacher",
        _batches(source, processor),
        config,
        data=JobData("embedded:digits", MAPPING),
        files=JobFiles(tmp / "job", tmp / "s", {}),
        launch=JobLaunch(procs, LAUNCHER, device="cuda"),
    )
    assert info["procs"] == procs and info["steps_done"] == 4
    assert Path(tmp / "job" / "result.json").is_file()
