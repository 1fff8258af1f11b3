"""The uint8 image cache (tools/data/image_cache.py, ImageStream): decoded once, same pixels, safe to lose."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from profiling_agent.tools.data import image_cache
from profiling_agent.tools.data.labels import map_labels
from profiling_agent.tools.data.prepare import SubsetSpec, prepare_images
from profiling_agent.tools.data.preprocess import Preprocessing, preprocess_images
from profiling_agent.tools.data.stream import StreamOptions, cache_folder, open_prepared

SHAPE = {"channels": 1, "height": 16, "width": 16}  # `digits` and `processor` come from conftest.py


@pytest.fixture
def small_shards(monkeypatch):
    """Ten 16x16 gray images per shard, so a 64-image pass spans several shards."""
    monkeypatch.setattr(image_cache, "SHARD_BYTES", 10 * 16 * 16)


@pytest.fixture
def count_decoded(monkeypatch):
    """Count the images the two-step path decodes and resizes (Preprocessing.geometry calls)."""
    seen = {"images": 0}
    real = Preprocessing.geometry

    def counted(self, images):
        seen["images"] += len(images)
        return real(self, images)

    monkeypatch.setattr(Preprocessing, "geometry", counted)
    return seen


def _open(digits, processor, path, **kw):
    return open_prepared(path, {"eval": digits, "calib": digits}, processor, **kw)["eval_pixels"]


def _prepared(digits, processor, tmp_path, subset=64):
    names = digits.features["label"].names
    mapping = map_labels(names, dict(enumerate(names)))
    return prepare_images(
        digits, processor, SHAPE, mapping, out_path=tmp_path / "d.safetensors", spec=SubsetSpec(subset=subset)
    )["path"]


def test_a_second_pass_reads_shards_and_sees_the_same_pixels(digits, processor, tmp_path, small_shards, count_decoded):
    path = _prepared(digits, processor, tmp_path)
    uncached = torch.cat(list(_open(digits, processor, path, options=StreamOptions()).batches(16)))
    assert not (tmp_path / "image_cache").exists()

    stream = _open(digits, processor, path)
    count_decoded["images"] = 0
    cold = torch.cat(list(stream.batches(16)))
    assert count_decoded["images"] == 4 + 64  # the first images to check the two-step path, then each image once
    shards = sorted((tmp_path / "image_cache").glob("validation-*/*.npy"))
    assert len(shards) == 7 and stream.cache is not None and stream.cache.per_shard == 10
    assert all(np.load(s).dtype == np.uint8 for s in shards)

    again = _open(digits, processor, path)  # what the next node of the run opens
    count_decoded["images"] = 0
    warm = torch.cat(list(again.batches(24)))
    assert count_decoded["images"] == 4  # only the first images, to check the two-step path once
    assert torch.equal(cold, uncached) and torch.equal(warm, cold)
    assert torch.equal(again[13:37], cold[13:37])
    # and these are the processor's own pixels, to float rounding
    rows = np.sort(np.asarray(again.rows))
    whole = preprocess_images(digits.select(rows.tolist())["image"], processor, SHAPE)
    assert (warm - whole).abs().max() <= 1e-5


def test_a_damaged_or_missing_shard_is_decoded_again(digits, processor, tmp_path, small_shards, caplog):
    path = _prepared(digits, processor, tmp_path)
    first = torch.cat(list(_open(digits, processor, path).batches(16)))
    shards = sorted((tmp_path / "image_cache").glob("validation-*/*.npy"))
    shards[1].write_bytes(shards[1].read_bytes()[:50])  # cut short
    shards[2].unlink()
    np.save(shards[3], np.zeros((3, 1, 16, 16), np.uint8))  # wrong image count
    again = torch.cat(list(_open(digits, processor, path).batches(16)))
    assert torch.equal(again, first)
    assert "decoding it again" in caplog.text
    assert all(np.load(s).shape == (10, 1, 16, 16) for s in shards[1:4])  # rewritten whole


def test_no_cache_past_the_budget_or_when_the_processor_cannot_be_split(digits, processor, tmp_path, monkeypatch):
    path = _prepared(digits, processor, tmp_path)
    monkeypatch.setenv(image_cache.BUDGET_ENV, "0")
    stream = _open(digits, processor, path)
    budgetless = torch.cat(list(stream.batches(16)))
    assert stream.cache is None and not (tmp_path / "image_cache").exists()
    monkeypatch.delenv(image_cache.BUDGET_ENV)

    class Blurring(type(processor)):  # rescales in its geometry: the uint8 split would not be the processor
        def __call__(self, images, **kw):
            out = super().__call__(images, **kw)
            out["pixel_values"] = out["pixel_values"] * 0.999 if not kw.get("do_rescale", True) else out["pixel_values"]
            return out

    odd = Blurring(size={"height": 16, "width": 16}, image_mean=[0.5], image_std=[0.5])
    stream = _open(digits, odd, path)
    whole = torch.cat(list(stream.batches(16)))
    assert stream.cache is None and "fractional" in (stream.split_note or "")
    assert not (tmp_path / "image_cache").exists()
    assert (whole - budgetless).abs().max() <= 1e-5  # the processor's own output, called whole


def test_other_processor_settings_replace_the_old_shards(digits, processor, tmp_path):
    from transformers.models.vit.image_processing_pil_vit import ViTImageProcessorPil

    path = _prepared(digits, processor, tmp_path)
    list(_open(digits, processor, path).batches(64))
    (before,) = (tmp_path / "image_cache").glob("validation-*")
    darker = ViTImageProcessorPil(size={"height": 16, "width": 16}, image_mean=[0.6], image_std=[0.5])
    pixels = torch.cat(list(_open(digits, darker, path).batches(64)))
    (after,) = (tmp_path / "image_cache").glob("validation-*")
    assert after.name != before.name and after.name.startswith("validation-")
    expected = torch.cat(list(_open(digits, darker, path, options=StreamOptions()).batches(64)))
    assert torch.equal(pixels, expected)


def test_dataloader_workers_share_the_cache(digits, processor, tmp_path, small_shards):
    path = _prepared(digits, processor, tmp_path, subset=40)
    workers = StreamOptions(workers=2, cache_dir=cache_folder(path))  # cached where open_prepared caches by default
    stream = _open(digits, processor, path, options=workers)
    first = torch.cat(list(stream.batches(8)))
    assert len(list((tmp_path / "image_cache").glob("validation-*/*.npy"))) == 4
    second = torch.cat(list(_open(digits, processor, path, options=workers).batches(8)))
    assert torch.equal(first, second)
    uncached = _open(digits, processor, path, options=StreamOptions(workers=0))
    assert torch.equal(first, torch.cat(list(uncached.batches(40))))
