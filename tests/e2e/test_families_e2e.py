"""Acceptance: `profiling-agent run` then `evaluate` on a trained ResNet, distilled DeiT and Swin (digits)."""

from __future__ import annotations

import json

import pytest
import torch
from helpers.quick_assets import cache_env
from helpers.tiny import deit_config, digit_labels, resnet_config, swin_config

from profiling_agent.graph.cli.main import main

pytestmark = pytest.mark.slow

# Small settings shared by every run: the digits test split has 360 images.
SUBSET = "128"
# ONNX Runtime delivers (its export of each family is under test); OpenVINO's forms per family: test_openvino_forms
RUN_FLAGS = [
    "--recover-steps",  # each family's distillation runs, briefly: the artifact round trip is under test,
    "8",
    "--max-acc-drop",  # so a pruned candidate is delivered after so short a recovery
    "10",
    "--subset",
    SUBSET,
    "--test-subset",  # the held-out check runs; its figures are not what is compared
    "64",
    "--calibration",
    "16",
    "--repeats",
    "2",
    "--threads",
    "1",
    "--device",
    "cpu",
    "--backend",
    "onnxruntime",
]


def _resnet():
    from transformers import ResNetForImageClassification

    config = resnet_config(
        embedding_size=16, hidden_sizes=[32, 64], depths=[1, 1], downsample_in_first_stage=False, **digit_labels()
    )
    return ResNetForImageClassification(config)


# the transformers train without dropout
NO_DROPOUT = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}


def _deit():
    from transformers import DeiTForImageClassificationWithTeacher

    sizes = {"image_size": 32, "patch_size": 8, "num_channels": 1, "hidden_size": 64, "intermediate_size": 128}
    config = deit_config(**sizes, **NO_DROPOUT, **digit_labels())
    return DeiTForImageClassificationWithTeacher(config)


def _swin():
    from transformers import SwinForImageClassification

    # 4x4 patches, 2x2 windows: stage 0 has shifted windows (attention mask), stage 1 is one window
    config = swin_config(
        image_size=32,
        patch_size=8,
        num_channels=1,
        embed_dim=32,
        depths=[2, 2],
        window_size=2,
        drop_path_rate=0.0,
        **NO_DROPOUT,
        **digit_labels(),
    )
    return SwinForImageClassification(config)


# name -> (builder, class, expected adapter, epochs, lr); a few seconds of training each on one core (TRAIN_IMAGES)
MODELS = {
    "resnet": (_resnet, "ResNetForImageClassification", "resnet", 4, 3e-3),
    "deit": (_deit, "DeiTForImageClassificationWithTeacher", "deit", 8, 2e-3),
    "swin": (_swin, "SwinForImageClassification", "swin", 5, 3e-3),
}


TRAIN_IMAGES = 800  # of the digits' 1,437 training images: enough to leave chance well behind


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """The digits dataset and the three models, briefly trained and saved with save_pretrained + processor."""
    from profiling_agent.tools.models import embedded

    root = tmp_path_factory.mktemp("families")
    folders = {}
    with cache_env(root / "cache"):
        dataset = embedded.ensure_dataset()
        for name, (build, _, _, epochs, lr) in MODELS.items():
            torch.manual_seed(0)
            config = embedded.TrainConfig(epochs=epochs, lr=lr, max_train=TRAIN_IMAGES, threads=1)
            record = embedded.train_model(build(), root / name, config, name=name)
            assert record["test_accuracy"] > 30.0, record  # trained: well above chance (10%)
            folders[name] = root / name
    return dataset, folders


@pytest.mark.parametrize("name", sorted(MODELS))
def test_run_then_evaluate_reproduces_accuracy(name, trained, tmp_path, capsys):
    from transformers import AutoConfig

    dataset, folders = trained
    model_dir = folders[name]
    _, architecture, family, _, _ = MODELS[name]
    assert AutoConfig.from_pretrained(model_dir).architectures == [architecture]
    code = main(
        [
            "run",
            "--model",
            str(model_dir),
            "--dataset",
            str(dataset),
            "--iterations",
            "1",
            "--planner",
            "deterministic",
            "--run-dir",
            str(tmp_path),
            "--thread-id",
            name,
            *RUN_FLAGS,
        ]
    )
    assert code == 0, capsys.readouterr().err
    run = tmp_path / name
    result = json.loads((run / "result.json").read_text())
    assert result["status"] == "done" and result["family"] == family  # its own adapter, not generic
    assert result["planner"]["used"] == ["deterministic"]
    best, baseline = result["best"], result["baseline"]
    assert best["iteration"] == 1 and best["params"] < baseline["params"]
    recipe = json.loads((run / "best" / "recipe.json").read_text())  # the delivered form: torch or ONNX Runtime
    assert recipe["architecture"] == architecture
    onnx = best["delivered"].startswith("ort_")
    assert recipe["format"] == ("profiling-agent-onnx" if onnx else "profiling-agent-artifact")
    assert (recipe["extra"]["params"] if onnx else recipe["params"]) == best["params"]
    settings = json.loads((run / "run.json").read_text())  # what `resume` would continue with
    assert settings["input"]["dataset"]["subset"] == int(SUBSET)

    out = tmp_path / "eval.json"
    code = main(
        [
            "evaluate",
            "--model",
            str(run / "best"),
            "--dataset",
            str(dataset),
            "--subset",
            SUBSET,
            "--device",
            "cpu",
            "--json",
            str(out),
        ]
    )
    assert code == 0, capsys.readouterr().err
    metrics = json.loads(out.read_text())
    assert metrics["n_samples"] == int(SUBSET)
    assert metrics["accuracy"] == pytest.approx(best["accuracy"], abs=1e-9)
    assert metrics["params"] == best["params"]
