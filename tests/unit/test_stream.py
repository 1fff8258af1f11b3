"""Streamed evaluation images (tools/data/stream.py): same pixels as the old float path, same order, no float file."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from profiling_agent.tools.data.labels import map_labels
from profiling_agent.tools.data.prepare import SubsetSpec, load_prepared, prepare_images, preprocess_images
from profiling_agent.tools.data.sources import DataError
from profiling_agent.tools.data.stream import ImageStream, open_prepared
from profiling_agent.tools.evaluation.metrics import predict, predict_many

SHAPE = {"channels": 1, "height": 16, "width": 16}  # `digits` and `processor` come from conftest.py


def _mapping(ds):
    names = ds.features["label"].names
    return map_labels(names, dict(enumerate(names)))


def _old_float_path(ds, rows, processor):
    """What prepare_images stored before streaming: the subset preprocessed 64 images at a time into one tensor."""
    images = ds.select_columns(["image"]).select(rows.tolist())
    chunks = [preprocess_images(images[s : s + 64]["image"], processor, SHAPE) for s in range(0, len(images), 64)]
    return torch.cat(chunks)


def test_streamed_batches_equal_the_old_preprocessing_and_predictions(digits, processor, tiny_vit, tmp_path):
    info = prepare_images(
        digits, processor, SHAPE, _mapping(digits), out_path=tmp_path / "d.safetensors", spec=SubsetSpec(subset=150)
    )
    data = open_prepared(info["path"], {"eval": digits, "calib": digits}, processor, with_indices=True)
    stream = data["eval_pixels"]
    old = _old_float_path(digits, data["eval_index"].numpy(), processor)
    new = torch.cat(list(stream.batches(7)))  # another batch size than the old 64: per-image preprocessing
    assert new.dtype == torch.float32 and new.shape == old.shape == (150, 1, 16, 16)
    assert (new - old).abs().max().item() <= 1e-6
    # accuracy numbers are those of the float path
    assert torch.equal(predict(tiny_vit, stream, batch_size=32), predict(tiny_vit, old, batch_size=32))


def test_same_images_in_the_same_order_every_pass_threads_or_workers(digits, processor, tmp_path):
    info = prepare_images(
        digits, processor, SHAPE, _mapping(digits), out_path=tmp_path / "d.safetensors", spec=SubsetSpec(subset=40)
    )
    stream = open_prepared(info["path"], {"eval": digits, "calib": digits}, processor)["eval_pixels"]
    first, second = torch.cat(list(stream.batches(16))), torch.cat(list(stream.batches(16)))
    assert torch.equal(first, second)
    stream.workers = 1  # a torch DataLoader with one worker process decodes ahead
    assert torch.equal(torch.cat(list(stream.batches(16))), first)
    assert torch.equal(stream[8:24], first[8:24])  # slices are the same images
    part = stream.between(8, 24)  # a shard of the rows: the same images and labels, and no cache of its own
    assert torch.equal(torch.cat(list(part.batches(5))), first[8:24]) and torch.equal(part.labels, stream.labels[8:24])
    assert part.cache is None and stream.cache is not None and part.workers == 1
    # the same seed draws the same rows: a second preparation streams exactly these pixels
    again = prepare_images(
        digits, processor, SHAPE, _mapping(digits), out_path=tmp_path / "e.safetensors", spec=SubsetSpec(subset=40)
    )
    other = open_prepared(again["path"], {"eval": digits, "calib": digits}, processor)["eval_pixels"]
    assert torch.equal(torch.cat(list(other.batches(40))), first)


def test_the_prepared_file_holds_no_float_copy_of_the_images(digits, processor, tmp_path):
    from safetensors import safe_open

    info = prepare_images(
        digits,
        processor,
        SHAPE,
        _mapping(digits),
        out_path=tmp_path / "d.safetensors",
        spec=SubsetSpec(subset=200, test_subset=100),
    )
    with safe_open(info["path"], framework="pt") as handle:
        dtypes = {key: handle.get_slice(key).get_dtype() for key in handle.keys()}
    assert set(dtypes) == {f"{p}_{k}" for p in ("eval", "test", "calib") for k in ("labels", "index")}
    assert set(dtypes.values()) == {"I64"}
    # row numbers and labels only: 16 bytes per image plus the header, never 4 * C * H * W bytes per image
    assert (tmp_path / "d.safetensors").stat().st_size < 16 * 364 + 4096
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.safetensors"]


def test_subset_all_is_the_split_minus_test_and_calibration_rows(digits, processor, tmp_path):
    info = prepare_images(
        digits,
        processor,
        SHAPE,
        _mapping(digits),
        out_path=tmp_path / "d.safetensors",
        spec=SubsetSpec(subset=0, test_subset=100, calibration=32),
    )
    parts = ("eval", "test", "calib")
    rows = {p: set(load_prepared(info["path"], with_indices=True, parts=parts)[f"{p}_index"].tolist()) for p in parts}
    assert (info["n_eval"], info["n_test"], info["n_calib"]) == (len(digits) - 132, 100, 32)
    assert rows["eval"] | rows["test"] | rows["calib"] == set(range(len(digits)))
    assert not (rows["eval"] & rows["test"]) and not (rows["eval"] & rows["calib"]) and not info["note"]


def test_cli_subset_all_and_bad_counts():
    from profiling_agent.graph.cli.args import BadInput, build_parser, input_from_args

    parse = build_parser().parse_args
    assert input_from_args(parse(["run", "--subset", "all"]))["dataset"]["subset"] == 0
    assert input_from_args(parse(["run", "--subset", "64"]))["dataset"]["subset"] == 64
    for bad in ("0", "3"):
        with pytest.raises(BadInput, match="invalid --subset"):
            input_from_args(parse(["run", "--subset", bad]))


def test_a_changed_dataset_is_refused(digits, processor, tmp_path):
    info = prepare_images(
        digits, processor, SHAPE, _mapping(digits), out_path=tmp_path / "d.safetensors", spec=SubsetSpec(subset=40)
    )
    with pytest.raises(DataError, match="the dataset changed"):
        open_prepared(info["path"], {"eval": digits.select(range(300)), "calib": digits}, processor)
    shuffled = digits.select(np.random.default_rng(1).permutation(len(digits)).tolist())
    with pytest.raises(DataError, match="the dataset changed"):
        open_prepared(info["path"], {"eval": shuffled, "calib": digits}, processor)


def test_predict_many_one_pass_parallel_equals_one_model_at_a_time(digits, processor, tiny_vit, tmp_path):
    import copy

    other = copy.deepcopy(tiny_vit)
    with torch.no_grad():
        other.classifier.weight.mul_(-1)
    info = prepare_images(
        digits, processor, SHAPE, _mapping(digits), out_path=tmp_path / "d.safetensors", spec=SubsetSpec(subset=64)
    )
    stream = open_prepared(info["path"], {"eval": digits, "calib": digits}, processor)["eval_pixels"]
    models = {"a": tiny_vit, "b": other}
    alone = {name: predict(m, stream, batch_size=16) for name, m in models.items()}
    for parallel in (1, 2):
        together = predict_many(models, stream, batch_size=16, parallel=parallel)
        assert all(torch.equal(together[n], alone[n]) for n in models)
    assert not torch.equal(alone["a"], alone["b"])


def test_an_unusable_image_fails_at_preparation(processor, tmp_path):
    from datasets import ClassLabel, Dataset, Features, Value

    ds = Dataset.from_dict(
        {"image": ["not an image"] * 12, "label": [0, 1] * 6},
        features=Features({"image": Value("string"), "label": ClassLabel(names=["a", "b"])}),
    )
    with pytest.raises(DataError, match="unsupported image value"):
        prepare_images(
            ds,
            processor,
            SHAPE,
            _mapping(ds),
            out_path=tmp_path / "d.safetensors",
            spec=SubsetSpec(subset=8, image_column="image"),
        )


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
def test_gpu_accuracy_pass_matches_the_cpu(digits, processor, tiny_vit, tmp_path):  # pragma: no cover - GPU only
    info = prepare_images(
        digits, processor, SHAPE, _mapping(digits), out_path=tmp_path / "d.safetensors", spec=SubsetSpec(subset=128)
    )
    stream = open_prepared(info["path"], {"eval": digits, "calib": digits}, processor)["eval_pixels"]
    cpu = predict(tiny_vit, stream, batch_size=64, device="cpu")
    gpu = predict(tiny_vit, stream, batch_size=128, device="cuda")
    assert (cpu == gpu).float().mean() > 0.98
    amp = predict(tiny_vit, stream, batch_size=128, device="cuda", autocast=torch.bfloat16)
    assert (cpu == amp).float().mean() > 0.9


def test_stream_rejects_mismatched_rows(digits, processor):
    with pytest.raises(ValueError, match="rows but"):
        ImageStream(digits, [0, 1, 2], torch.zeros(2), image_column="image", processor=processor, shape=SHAPE)
