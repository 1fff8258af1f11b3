"""Tests of the embedded digits dataset and models (tools/models/embedded.py)."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from datasets import load_from_disk
from helpers.quick_assets import cache_env, read_json

from profiling_agent.tools.data.sources import load_split
from profiling_agent.tools.models import embedded
from profiling_agent.tools.models.loading import load_model


@pytest.fixture(scope="module")
def digits_cache(tmp_path_factory):
    """A private cache with the digits dataset built once for this module."""
    root = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PROFILING_AGENT_CACHE", str(root))
        embedded.ensure_dataset()
        yield root


@pytest.fixture
def cache(digits_cache, monkeypatch):
    monkeypatch.setenv("PROFILING_AGENT_CACHE", str(digits_cache))
    return digits_cache


def test_cache_dir_env_and_default(monkeypatch, tmp_path):
    monkeypatch.setenv("PROFILING_AGENT_CACHE", str(tmp_path))
    assert embedded.cache_dir() == tmp_path
    monkeypatch.delenv("PROFILING_AGENT_CACHE")
    assert embedded.cache_dir() == Path.home() / ".cache" / "profiling-agent"


def test_dataset_splits_labels_and_images(cache):
    from sklearn.datasets import load_digits

    path = embedded.ensure_dataset()
    assert path == cache / "datasets" / "digits"
    splits = load_from_disk(str(path))
    assert set(splits) == {"train", "test"}
    assert (len(splits["train"]), len(splits["test"])) == (1437, 360)
    assert splits["train"].features["label"].names == [str(i) for i in range(10)]
    image = splits["test"][0]["image"]
    assert image.mode == "L" and image.size == (32, 32)

    digits = load_digits()
    counts = np.bincount(digits.target, minlength=10)
    test_counts = np.bincount(np.array(splits["test"]["label"]), minlength=10)
    train_counts = np.bincount(np.array(splits["train"]["label"]), minlength=10)
    np.testing.assert_array_equal(train_counts + test_counts, counts)
    assert np.all(np.abs(test_counts - 0.2 * counts) <= 1)  # stratified


def test_dataset_images_are_the_digits(cache):
    """Every stored 32x32 image, pooled back to 8x8, matches exactly one original digit of its label."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    originals = digits.images.reshape(len(digits.images), -1) * (255.0 / 16.0)
    test = load_from_disk(str(embedded.ensure_dataset()))["test"]
    for row in (0, 57, 359):
        pixels = np.asarray(test[row]["image"], dtype=np.float64)
        pooled = pixels.reshape(8, 4, 8, 4).mean(axis=(1, 3)).ravel()
        distances = np.abs(originals - pooled).mean(axis=1)
        best = int(distances.argmin())
        assert np.corrcoef(originals[best], pooled)[0, 1] > 0.9  # bilinear up + box down ~ the original
        assert distances[best] < 0.5 * np.median(distances)
        assert digits.target[best] == test[row]["label"]


def test_dataset_is_cached_and_rebuilt_on_force(cache):
    path = embedded.ensure_dataset()
    marker = path / "dataset_dict.json"
    before = marker.stat().st_mtime_ns
    assert embedded.ensure_dataset() == path
    assert marker.stat().st_mtime_ns == before
    embedded.ensure_dataset(force=True)
    assert load_from_disk(str(path))["test"].num_rows == 360
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".")]  # no temp folders left


def test_dataset_concurrent_builds(monkeypatch, tmp_path):
    monkeypatch.setenv("PROFILING_AGENT_CACHE", str(tmp_path))
    results, errors = [], []

    def build():
        try:
            results.append(embedded.ensure_dataset())
        except Exception as err:  # pragma: no cover - reported below
            errors.append(err)

    threads = [threading.Thread(target=build) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    assert results[0] == results[1]
    assert load_from_disk(str(results[0]))["train"].num_rows == 1437


def test_load_split_embedded(cache):
    test = load_split("embedded:digits", "test")
    assert test.num_rows == 360


def _accuracy_on_test(loaded) -> float:
    """Accuracy computed here, independently of the builder: processor -> model -> argmax."""
    test = load_from_disk(str(embedded.ensure_dataset()))["test"]
    pixels = loaded.processor(images=[im.convert("L") for im in test["image"]], return_tensors="pt")["pixel_values"]
    with torch.inference_mode():
        preds = loaded.model(pixel_values=pixels).logits.argmax(-1)
    return 100.0 * float((preds == torch.tensor(test["label"])).float().mean())


# The session's two quick builds (tests/conftest.py): build_model on a shortened schedule, each model trained once for
# every test that reads it; the epochs, training images and seed each build asked for
SHORT_BUILDS = {
    "vit-digits": ("digits_vit", {"epochs": 12, "train_samples": 1437, "seed": 0}),
    "resnet-digits": ("quick_resnet", {"epochs": 4, "train_samples": 800, "seed": 0}),
}


def _short_build(request, name: str) -> tuple[Path, dict]:
    """(model folder, the record build_model returned) of the session's quick build of `name`."""
    built = request.getfixturevalue(SHORT_BUILDS[name][0])
    if name == "vit-digits":
        return built.model, built.record
    model, _, cache = built
    return model, read_json(cache / "record.json")


@pytest.mark.parametrize("name", embedded.MODEL_NAMES)
def test_build_model_short_schedule_loads_and_beats_chance(request, name):
    """A model build_model trained on a short schedule records it, loads as a local model and beats chance.

    The models are the session's quick builds (SHORT_BUILDS), which every whole-run test reads as well: training a
    two more copies here would run the same build_model path again.
    """
    path, record = _short_build(request, name)
    assert {key: record[key] for key in ("epochs", "train_samples", "seed")} == SHORT_BUILDS[name][1]
    assert set(record["versions"]) >= {"torch", "transformers", "datasets", "scikit-learn"}
    assert embedded.training_record(path) == record

    loaded = load_model(str(path))
    assert loaded.source == "local" and not loaded.model.training
    assert loaded.model.config.id2label == {i: str(i) for i in range(10)}
    assert loaded.model.config.num_channels == 1
    with cache_env(path.parent.parent):  # the digits test split of the build's own cache
        acc = _accuracy_on_test(loaded)
    assert acc == pytest.approx(record["test_accuracy"], abs=0.01)
    assert acc > 25.0  # chance is 10% (+-1.6% on 360 images); measured ~76% (ViT) and ~99% (ResNet)


@pytest.mark.parametrize("shift", [2, 0])
def test_build_model_is_seeded(cache, tmp_path, shift):
    """Two builds with one seed give the same weights, with augmentation or without (shift 0); the record keeps the
    seed and the schedule asked for."""
    cfg = embedded.TrainConfig(epochs=1, max_train=128, seed=3, shift=shift)
    record = embedded.build_model("resnet-digits", tmp_path / "a", cfg)
    assert (record["epochs"], record["train_samples"], record["seed"]) == (1, 128, 3)
    assert record["config"]["shift"] == shift
    embedded.build_model("resnet-digits", tmp_path / "b", cfg)
    from safetensors.torch import load_file

    a, b = load_file(str(tmp_path / "a" / "model.safetensors")), load_file(str(tmp_path / "b" / "model.safetensors"))
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_unknown_names(cache, tmp_path):
    with pytest.raises(ValueError, match="unknown embedded model"):
        embedded.ensure_model("bert-digits")
    with pytest.raises(ValueError, match="unknown embedded model"):
        embedded.build_model("bert-digits", tmp_path / "x")
    with pytest.raises(SystemExit):
        embedded.main(["bert-digits"])


def test_architectures_are_small_and_prunable():
    vit, resnet = embedded.build_architecture("vit-digits"), embedded.build_architecture("resnet-digits")
    assert sum(p.numel() for p in vit.parameters()) < 400_000
    assert sum(p.numel() for p in resnet.parameters()) < 400_000
    assert vit.config.num_attention_heads == 4
    assert vit.config.intermediate_size == 4 * vit.config.hidden_size
    assert resnet.config.layer_type == "bottleneck"


@pytest.mark.slow
def test_real_default_models_reach_90_percent(cache):
    """Trains the real defaults (the schedules `make run` trains on first use) and checks their test accuracy.

    They train into this module's private cache, which holds no model: the check is on what the shipped schedules
    train to today, not on a copy an earlier version left in the user's cache. The session's digits ViT cannot stand
    in for the ViT: it trains 12 epochs (tests/conftest.py), the default schedule 30.
    """
    for name in embedded.MODEL_NAMES:
        path = embedded.ensure_model(name)
        record = embedded.training_record(path)
        loaded = load_model(f"embedded:{name}")
        assert loaded.source == "embedded" and Path(loaded.path) == path
        acc = _accuracy_on_test(loaded)
        assert acc == pytest.approx(record["test_accuracy"], abs=0.01)
        assert acc >= 90.0, f"{name}: {acc:.1f}%"
        assert record["seconds"] > 0  # how long it took is for `make run` to show, not for a test to bound
