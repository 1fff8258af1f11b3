"""Sharded accuracy passes: 2 gloo processes predict exactly what 1 process predicts, so every figure is equal.

The jobs fork their ranks from one interpreter that has imported the libraries (helpers.forked_ranks): the same
ranks, gloo group and job files as under torchrun, without each rank's seconds of imports. The sharded passes of a
whole run under torchrun are test_distributed_cli's.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from helpers.forked_ranks import launcher

from profiling_agent.tools.evaluation.metrics import predict_many
from profiling_agent.tools.evaluation.sharded import (
    ShardedJob,
    batch_shard,
    predict_sharded,
    sharded_predictions,
    summarize,
)

MAPPING = {"dataset_to_model": {str(i): i for i in range(10)}}
SHAPE = {"channels": 1, "height": 32, "width": 32}  # the quickly trained digits ResNet's input
LAUNCHER = launcher()  # ranks forked from one interpreter with the libraries imported (helpers.forked_ranks)


def make_run(
    root: Path, ref: str, model: torch.nn.Module, processor, subset: int = 200, test_subset: int = 100
) -> Path:
    """Write what prepare_data writes (rows, labels, subsets.json) and the baseline artifact into `root`."""
    from profiling_agent.tools.data.prepare import SubsetSpec, load_prepared, prepare_images
    from profiling_agent.tools.data.sources import load_split
    from profiling_agent.tools.io import write_json_atomic
    from profiling_agent.tools.models.artifacts import save_artifact

    root.mkdir(parents=True, exist_ok=True)
    ds = load_split(ref, "test")
    prepare_images(
        ds,
        processor,
        SHAPE,
        MAPPING,
        out_path=root / "data.safetensors",
        spec=SubsetSpec(subset=subset, test_subset=test_subset, calibration=16, seed=0),
    )
    rows = load_prepared(root / "data.safetensors", with_indices=True, parts=("eval", "test", "calib"))
    roles = {"validation": "eval", "test": "test", "calibration": "calib"}
    subsets = {role: {"split": "test", "indices": rows[f"{part}_index"].tolist()} for role, part in roles.items()}
    write_json_atomic(root / "subsets.json", {"dataset": ref, "seed": 0, **subsets})
    save_artifact(model, root / "baseline", processor=processor)
    return root


@pytest.fixture(scope="module")
def two_models(quick_resnet, tmp_path_factory):
    """A run folder over the digits test split: the trained digits ResNet as baseline, and a pruned copy.

    Built once for the module; tests read it (the baselines' forms test adds the forms' folder, last).
    """
    from transformers import AutoImageProcessor, AutoModelForImageClassification

    from profiling_agent.tools.compression.pruning import prune_model
    from profiling_agent.tools.models.artifacts import save_artifact

    model_dir, dataset, _ = quick_resnet
    teacher = AutoModelForImageClassification.from_pretrained(model_dir).eval()
    processor = AutoImageProcessor.from_pretrained(model_dir)
    tmp_path = tmp_path_factory.mktemp("two_models")
    run = make_run(tmp_path / "run", str(dataset), teacher, processor)
    student = copy.deepcopy(teacher)
    prune_model(student, [{"layer": "conv", "type": "structured", "ratio": 0.6}], torch.zeros(1, 1, 32, 32))
    save_artifact(student, tmp_path / "pruned", processor=processor)
    return run, {"baseline": run / "baseline", "pruned": tmp_path / "pruned"}


def test_shards_are_whole_batches_that_cover_every_image_once():
    for n, batch, world in ((200, 64, 2), (10, 4, 3), (5, 64, 2), (129, 64, 4)):
        bounds = [batch_shard(n, batch, r, world) for r in range(world)]
        assert bounds[0][0] == 0 and bounds[-1][1] == n
        assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:], strict=False))
        assert all(lo % batch == 0 for lo, _ in bounds)


def test_one_process_sharded_pass_is_the_plain_pass(two_models):
    from profiling_agent.tools.data.stream import open_run_data
    from profiling_agent.tools.models.artifact_load import load_artifact

    run, paths = two_models
    stream = open_run_data(run, parts=("eval",), materialize=())["eval_pixels"]
    models = {k: load_artifact(p).model for k, p in paths.items()}
    plain = predict_many(models, stream, batch_size=64)
    one = predict_sharded(models, stream, 0, 1, batch_size=64)
    assert all(torch.equal(plain[k], one[k]) for k in models)


@pytest.mark.slow
@pytest.mark.parametrize("part", ["eval", "test"])
def test_two_gloo_processes_give_the_single_process_predictions_and_figures(two_models, tmp_path, part):
    from profiling_agent.tools.data.stream import open_run_data
    from profiling_agent.tools.models.artifact_load import load_artifact

    run, paths = two_models
    data = open_run_data(run, parts=(part,), materialize=())
    models = {k: load_artifact(p).model for k, p in paths.items()}
    single = predict_many(models, data[f"{part}_pixels"], batch_size=32)
    sharded = sharded_predictions(
        run, part, paths, ShardedJob(procs=2, job_dir=tmp_path / "job", batch_size=32, launcher=LAUNCHER, threads=1)
    )
    for name in models:
        assert torch.equal(single[name], sharded[name]), name
    labels = data[f"{part}_labels"]
    assert summarize(sharded, labels, "baseline") == summarize(single, labels, "baseline")
    assert len(sharded["pruned"]) == len(labels) and (single["pruned"] != single["baseline"]).any()


@pytest.mark.slow
def test_recover_procs_splits_the_baselines_validation_pass_and_every_form_scores_the_same(two_models):
    """`--recover-procs 2` runs measure_baseline's validation pass as a 2-process job: every form's figures equal.

    Under a size target every form is scored in the first pass (no scoring rule leaves a slow one out), so the
    split pass is one job whose predictions cover every form, and which forms are scored does not hang on timings.
    """
    from profiling_agent.state import ArtifactRef, Context, Objective
    from profiling_agent.tools.data.stream import open_run_data
    from profiling_agent.tools.evaluation.baseline_eval import measure_unpruned

    run, _ = two_models
    baseline = ArtifactRef(path="baseline", sha256="", size_bytes=1, params=1)
    tensors = open_run_data(run, parts=("eval", "calib"))
    figures = {}
    for procs in (1, 2):
        ctx = Context(backend="onnxruntime", recover_procs=procs, launcher=LAUNCHER, latency_repeats=3,
                      latency_warmup=1, latency_batch=4)  # fmt: skip
        record, message = measure_unpruned(
            baseline, Objective(target="size"), ctx, root=run, tensors=tensors, macs=None
        )
        figures[procs] = {v.name: (v.status, v.accuracy, v.agreement) for v in record.variants}
        assert (record.timing or {}).get("accuracy_procs") == (2 if procs == 2 else None)
        assert ("validation pass on 2 processes" in message) == (procs == 2), message
    assert figures[2] == figures[1]
    assert sum(status == "ok" for status, _, _ in figures[1].values()) >= 3, figures[1]
    assert not (run / "baseline_forms" / "eval_job" / "error_rank1.txt").exists()
