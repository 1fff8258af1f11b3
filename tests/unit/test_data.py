"""Tests of dataset loading, column detection, label mapping and data preparation (tools/data/sources.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from datasets import ClassLabel, Dataset, DatasetDict, Features, Image, Value
from PIL import Image as PILImage

from profiling_agent.tools.data.labels import map_labels, mapping_table, wnids_from_config
from profiling_agent.tools.data.prepare import SubsetSpec, load_prepared, prepare_images, preprocess_images
from profiling_agent.tools.data.sources import DataError, detect_columns, label_names, load_split
from profiling_agent.tools.data.stream import ImageStream, open_prepared

# ---------------------------------------------------------------- fixtures


def _gray(value: int, size: int = 12) -> PILImage.Image:
    return PILImage.fromarray(np.full((size, size), value, dtype=np.uint8), mode="L")


def _dataset(n: int = 40, names=("cat", "dog", "bird"), seed: int = 0) -> Dataset:
    """Images whose constant gray value encodes the row number (value = 5 * row), labels cycle."""
    images = [_gray((5 * i) % 256) for i in range(n)]
    labels = [i % len(names) for i in range(n)]
    features = Features({"image": Image(), "label": ClassLabel(names=list(names))})
    return Dataset.from_dict({"image": images, "label": labels}, features=features)


SHAPE = {"channels": 1, "height": 8, "width": 8}


def _identity_mapping(names):
    return map_labels(list(names), dict(enumerate(names)))


# ---------------------------------------------------------------- load_split


def test_save_to_disk_dataset_and_dict(tmp_path):
    ds = _dataset(10)
    ds.save_to_disk(str(tmp_path / "single"))
    assert load_split(str(tmp_path / "single"), "test").num_rows == 10  # no splits: split ignored

    DatasetDict({"train": _dataset(10), "validation": _dataset(6)}).save_to_disk(str(tmp_path / "dict"))
    assert load_split(str(tmp_path / "dict"), "validation").num_rows == 6
    with pytest.raises(DataError) as err:
        load_split(str(tmp_path / "dict"), "test")
    assert str(err.value) == f"split 'test' not found in {tmp_path / 'dict'}; available: train, validation"
    with pytest.raises(DataError, match="choose one of: train, validation"):
        load_split(str(tmp_path / "dict"), None)


def _write_folder(root, layout):
    for rel, value in layout:
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        _gray(value).save(path)


def test_imagefolder_class_layout(tmp_path):
    _write_folder(tmp_path, [("dog/a.png", 10), ("dog/b.png", 20), ("cat/c.png", 30)])
    (tmp_path / "cat" / "notes.txt").write_text("not an image")
    ds = load_split(str(tmp_path), "test")
    assert ds.features["label"].names == ["cat", "dog"]
    assert ds.num_rows == 3
    rows = sorted((ds[i]["label"], int(np.asarray(ds[i]["image"]).mean())) for i in range(3))
    assert rows == [(0, 30), (1, 10), (1, 20)]


def test_imagefolder_split_layout(tmp_path):
    _write_folder(
        tmp_path, [("train/cat/a.png", 1), ("train/dog/b.png", 2), ("val/dog/c.png", 3), ("val/emu/d.png", 4)]
    )
    val = load_split(str(tmp_path), "val")
    assert val.features["label"].names == ["cat", "dog", "emu"]  # same ids in every split
    assert sorted(val["label"]) == [1, 2]
    with pytest.raises(DataError) as err:
        load_split(str(tmp_path), "test")
    assert "available: train, val" in str(err.value)


def test_load_split_errors(tmp_path, monkeypatch):
    with pytest.raises(DataError, match="dataset path not found"):
        load_split(str(tmp_path / "missing"), "test")
    (tmp_path / "file.csv").write_text("a,b")
    with pytest.raises(DataError, match="is a file"):
        load_split(str(tmp_path / "file.csv"), "test")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="not a dataset folder"):
        load_split(str(tmp_path / "empty"), "test")
    with pytest.raises(DataError, match="unknown embedded dataset"):
        load_split("embedded:mnist", "test")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(DataError) as err:
        load_split("nobody-xyz/no-such-dataset-123", "test")
    assert "cannot fetch hub dataset" in str(err.value) and "\n" not in str(err.value)


# ---------------------------------------------------------------- columns


def test_detect_columns_by_feature_type_and_name():
    ds = _dataset(3)
    assert detect_columns(ds) == ("image", "label")
    cifar_like = Dataset.from_dict(
        {"img": [_gray(1)], "coarse_label": [0], "fine_label": [1]},
        features=Features(
            {"img": Image(), "coarse_label": ClassLabel(names=["a"]), "fine_label": ClassLabel(names=["x", "y"])}
        ),
    )
    assert detect_columns(cifar_like) == ("img", "fine_label")
    assert detect_columns(cifar_like, label_column="coarse_label") == ("img", "coarse_label")
    plain = Dataset.from_dict({"pixel_values": [[0.0]], "labels": [3]})
    assert detect_columns(plain) == ("pixel_values", "labels")


def test_detect_columns_errors():
    ds = _dataset(3)
    with pytest.raises(DataError, match="image column 'photo' not in the dataset; columns: image, label"):
        detect_columns(ds, image_column="photo")
    with pytest.raises(DataError, match="no label column"):
        detect_columns(ds.remove_columns("label"))
    with pytest.raises(DataError, match="no image column"):
        detect_columns(Dataset.from_dict({"text": ["a"], "label": [0]}))


def test_label_names_without_classlabel():
    ds = Dataset.from_dict(
        {"image": [None] * 4, "label": ["dog", "cat", "dog", "emu"]},
        features=Features({"image": Image(), "label": Value("string")}),
    )
    assert label_names(ds, "label") == ["cat", "dog", "emu"]
    ints = Dataset.from_dict({"label": [3, 1, 2]})
    assert label_names(ints, "label") == ["1", "2", "3"]


# ---------------------------------------------------------------- label mapping

IMAGENET_ENTRIES = {
    0: "tench, Tinca tinca",
    134: "crane",
    217: "English springer, English springer spaniel",
    482: "cassette player",
    491: "chain saw, chainsaw",
    497: "church, church building",
    517: "crane",
    566: "French horn, horn",
    569: "garbage truck, dustcart",
    571: "gas pump, gasoline pump, petrol pump, island dispenser",
    574: "golf ball",
    701: "parachute, chute",
}
IMAGENETTE = [  # (wnid, name as in the Imagenette class list, ImageNet class id)
    ("n01440764", "tench", 0),
    ("n02102040", "English springer", 217),
    ("n02979186", "cassette player", 482),
    ("n03000684", "chain saw", 491),
    ("n03028079", "church", 497),
    ("n03394916", "French horn", 566),
    ("n03417042", "garbage truck", 569),
    ("n03425413", "gas pump", 571),
    ("n03445777", "golf ball", 574),
    ("n03888605", "parachute", 701),
]


def _fake_imagenet() -> dict[int, str]:
    return {i: IMAGENET_ENTRIES.get(i, f"filler class {i}, filler{i}") for i in range(1000)}


def test_map_identical_names_case_underscore_space():
    mapping = map_labels(["Golden_Retriever", "tabby cat"], {0: "tabby cat", 1: "golden retriever", 2: "other"})
    assert mapping["method"] == "identical"
    assert mapping_table(mapping) == {0: 1, 1: 0}
    assert mapping["restricted"] is True and mapping["allowed_ids"] == [0, 1]
    assert mapping["unmapped"] == []


def test_map_imagenette_names_by_synonym():
    names = [name for _, name, _ in IMAGENETTE]
    mapping = map_labels(names, {str(k): v for k, v in _fake_imagenet().items()})  # JSON configs: str keys
    assert mapping["method"] == "synonym"
    assert mapping_table(mapping) == {i: model_id for i, (_, _, model_id) in enumerate(IMAGENETTE)}
    assert mapping["restricted"] is True
    assert mapping["allowed_ids"] == sorted(model_id for _, _, model_id in IMAGENETTE)
    assert mapping["n_model_classes"] == 1000
    assert mapping["dataset_to_model"]["3"] == 491  # keys survive JSON as strings


def test_map_imagenette_wnids_with_model_wnid_list():
    wnids = [f"n9{i:07d}" for i in range(1000)]  # filler wnids, real ones at the Imagenette classes
    for wnid, _, model_id in IMAGENETTE:
        wnids[model_id] = wnid
    mapping = map_labels([w for w, _, _ in IMAGENETTE], _fake_imagenet(), model_wnids=wnids)
    assert mapping["method"] == "wnid"
    assert mapping_table(mapping) == {i: model_id for i, (_, _, model_id) in enumerate(IMAGENETTE)}
    assert mapping["restricted"] is True and len(mapping["allowed_ids"]) == 10


def test_map_wnids_with_dataset_table_and_without_any():
    wnid_names = {wnid: name for wnid, name, _ in IMAGENETTE}
    mapping = map_labels([w for w, _, _ in IMAGENETTE], _fake_imagenet(), wnid_names=wnid_names)
    assert mapping["method"] == "wnid-table+synonym"
    assert mapping_table(mapping)[0] == 0 and mapping_table(mapping)[9] == 701
    with pytest.raises(DataError, match="WordNet ids .* carries no wnid list"):
        map_labels([w for w, _, _ in IMAGENETTE], _fake_imagenet())


def test_wnids_from_config():
    from transformers import ViTConfig

    config = ViTConfig(id2label={0: "tench", 1: "golf ball"})
    assert wnids_from_config(config) is None
    config.wnids = ["n01440764", "n03445777"]
    assert wnids_from_config(config) == ["n01440764", "n03445777"]
    assert wnids_from_config(ViTConfig(id2label={0: "n01440764", 1: "n03445777"})) == ["n01440764", "n03445777"]


def test_map_numeric_label_sets():
    names = [str(i) for i in range(10)]
    assert map_labels(names, {i: str(i) for i in range(10)})["method"] == "identical"
    shuffled = {i: f"LABEL_{(i * 3) % 10}" for i in range(10)}
    mapping = map_labels(names, shuffled)
    assert mapping["method"] == "numeric" and mapping["restricted"] is False and mapping["allowed_ids"] is None
    table = mapping_table(mapping)
    assert all(shuffled[table[d]] == f"LABEL_{d}" for d in range(10))
    with pytest.raises(DataError):  # sizes differ: never guessed
        map_labels(names[:5], shuffled)


def test_map_errors_unmappable_ambiguous_and_generic():
    with pytest.raises(DataError) as err:
        map_labels(["tench", "zebra", "okapi"], _fake_imagenet())
    assert "2 of 3 dataset classes match no model label: 'zebra', 'okapi'" in str(err.value)
    with pytest.raises(DataError, match=r"'crane' matches several model classes \(134, 517\)"):
        map_labels(["crane"], _fake_imagenet())
    with pytest.raises(DataError, match="generic LABEL_k"):
        map_labels(["cat", "dog"], {0: "LABEL_0", 1: "LABEL_1"})
    with pytest.raises(DataError, match="both map to model class 0"):
        map_labels(["tench", "Tinca tinca"], _fake_imagenet())


# ---------------------------------------------------------------- preprocessing and prepare_data


def test_preprocess_without_processor_is_resize_scale_normalize():
    pixels = preprocess_images([_gray(51), _gray(204)], None, SHAPE)
    assert pixels.shape == (2, 1, 8, 8) and pixels.dtype == torch.float32
    expected = torch.tensor([51, 204], dtype=torch.float32) / 255 * 2 - 1
    torch.testing.assert_close(pixels.mean(dim=(1, 2, 3)), expected)


def test_preprocess_channel_conversion_and_processor_resize():
    from transformers.models.vit.image_processing_pil_vit import ViTImageProcessorPil

    rgb = PILImage.fromarray(np.stack([np.full((12, 12), v, np.uint8) for v in (200, 100, 0)], -1), mode="RGB")
    gray_value = np.asarray(rgb.convert("L")).mean()  # PIL's luma: what a 1-channel model should see
    pixels = preprocess_images([rgb], None, SHAPE)
    torch.testing.assert_close(pixels.mean(), torch.tensor(gray_value / 255 * 2 - 1, dtype=torch.float32))

    three = preprocess_images([_gray(100)], None, {"channels": 3, "height": 8, "width": 8})
    assert three.shape == (1, 3, 8, 8)

    processor = ViTImageProcessorPil(size={"height": 16, "width": 16}, image_mean=[0.5], image_std=[0.5])
    notes: set[str] = set()
    out = preprocess_images([_gray(100)], processor, SHAPE, notes)
    assert out.shape == (1, 1, 8, 8) and any("resized to 8x8" in n for n in notes)

    rgb_processor = ViTImageProcessorPil(size={"height": 8, "width": 8}, image_mean=[0.5] * 3, image_std=[0.5] * 3)
    notes = set()
    out = preprocess_images([rgb], rgb_processor, SHAPE, notes)  # a 1-channel model with an RGB processor
    expected = rgb_processor(images=[rgb], return_tensors="pt")["pixel_values"].mean(dim=1, keepdim=True)
    torch.testing.assert_close(out, expected)
    assert notes == {"processor output converted from 3 to 1 channels"}


def test_prepare_data_seeded_disjoint_and_mapped(tmp_path):
    ds = _dataset(40)
    mapping = map_labels(["cat", "dog", "bird"], {0: "bird", 1: "cat", 2: "dog", 3: "fish"})
    spec = SubsetSpec(subset=16, calibration=8, seed=7)
    info = prepare_images(ds, None, SHAPE, mapping, out_path=tmp_path / "a.safetensors", spec=spec)
    again = prepare_images(ds, None, SHAPE, mapping, out_path=tmp_path / "b.safetensors", spec=spec)
    other = prepare_images(
        ds, None, SHAPE, mapping, out_path=tmp_path / "c.safetensors", spec=SubsetSpec(subset=16, calibration=8, seed=8)
    )
    assert (info["n_eval"], info["n_calib"], info["note"]) == (16, 8, "")
    assert info["image_column"] == "image" and info["label_column"] == "label"
    assert info["label_names"] == ["cat", "dog", "bird"] and info["calib_overlaps_eval"] is False
    assert info["sha256"] == again["sha256"] != other["sha256"]

    a, b = load_prepared(info["path"], with_indices=True), load_prepared(again["path"], with_indices=True)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not set(a["eval_index"].tolist()) & set(a["calib_index"].tolist())
    opened = open_prepared(info["path"], {"eval": ds, "calib": ds}, None, with_indices=True)
    stream = opened["eval_pixels"]  # validation streamed, calibration (small) in memory
    assert isinstance(stream, ImageStream) and len(stream) == 16 and opened["calib_pixels"].shape == (8, 1, 8, 8)
    eval_pixels = torch.cat(list(stream.batches(5)))
    assert eval_pixels.shape == (16, 1, 8, 8)

    # Independent check: row r has gray value 5r and dataset label r % 3 (cat, dog, bird -> model 1, 2, 0).
    rows = a["eval_index"]
    assert torch.equal(opened["eval_index"], rows)
    torch.testing.assert_close(eval_pixels.mean(dim=(1, 2, 3)), (5.0 * rows.float()) / 255 * 2 - 1)
    assert a["eval_labels"].tolist() == [[1, 2, 0][r % 3] for r in rows.tolist()]
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["a.safetensors", "b.safetensors", "c.safetensors", "image_cache"]  # reading cached uint8 images
    shards = [np.load(p) for p in (tmp_path / "image_cache").rglob("*.npy")]
    assert shards and all(s.dtype == np.uint8 for s in shards)


def test_prepare_data_with_processor_matches_processor(tmp_path):
    from transformers.models.vit.image_processing_pil_vit import ViTImageProcessorPil

    processor = ViTImageProcessorPil(size={"height": 8, "width": 8}, image_mean=[0.5], image_std=[0.5])
    ds = _dataset(20)
    info = prepare_images(
        ds,
        processor,
        SHAPE,
        _identity_mapping(["cat", "dog", "bird"]),
        out_path=tmp_path / "p.safetensors",
        spec=SubsetSpec(subset=5, calibration=4, seed=0),
    )
    data = open_prepared(info["path"], {"eval": ds, "calib": ds}, processor, with_indices=True)
    row = int(data["eval_index"][0])
    expected = processor(images=[ds[row]["image"]], return_tensors="pt")["pixel_values"][0]
    torch.testing.assert_close(data["eval_pixels"][0:1][0], expected)


def test_prepare_data_small_split_shrinks_validation_never_overlaps(tmp_path):
    info = prepare_images(
        _dataset(10),
        None,
        SHAPE,
        _identity_mapping(["cat", "dog", "bird"]),
        out_path=tmp_path / "s.safetensors",
        spec=SubsetSpec(subset=8, calibration=4, seed=0),
    )
    assert (info["n_eval"], info["n_calib"]) == (6, 4)  # calibration keeps its minimum; validation gives way
    assert info["calib_overlaps_eval"] is False and "6 validation (of 8 asked)" in info["note"]
    data = load_prepared(info["path"], with_indices=True)
    assert not set(data["calib_index"].tolist()) & set(data["eval_index"].tolist())


def test_prepare_data_holds_out_a_test_subset_loaded_only_when_asked(tmp_path):
    ds = _dataset(40)
    mapping = _identity_mapping(["cat", "dog", "bird"])
    info = prepare_images(
        ds,
        None,
        SHAPE,
        mapping,
        out_path=tmp_path / "t.safetensors",
        spec=SubsetSpec(subset=16, test_subset=12, calibration=8),
    )
    assert (info["n_eval"], info["n_test"], info["n_calib"]) == (16, 12, 8)
    default = open_prepared(info["path"], {"eval": ds, "calib": ds}, None, with_indices=True)
    assert "test_pixels" not in default and "test_labels" not in default  # held out unless asked for
    parts = ("eval", "test", "calib")
    full = open_prepared(info["path"], dict.fromkeys(parts, ds), None, with_indices=True, parts=parts)
    rows = [set(full[f"{p}_index"].tolist()) for p in parts]
    assert not (rows[0] & rows[1]) and not (rows[0] & rows[2]) and not (rows[1] & rows[2])
    assert len(full["test_pixels"]) == 12 and full["test_pixels"][:].shape == (12, 1, 8, 8)
    # the validation draw is the one a run without a test subset makes
    assert torch.equal(
        full["eval_index"], load_prepared(_plain(ds, mapping, tmp_path), with_indices=True)["eval_index"]
    )


def _plain(ds, mapping, tmp_path):
    return prepare_images(
        ds, None, SHAPE, mapping, out_path=tmp_path / "p.safetensors", spec=SubsetSpec(subset=16, calibration=8)
    )["path"]


def test_prepare_data_rejects_unlabelled(tmp_path):
    ds = _dataset(6).cast_column("label", Value("int64")).map(lambda row: {"label": -1})
    with pytest.raises(DataError, match="unlabelled"):
        prepare_images(
            ds,
            None,
            SHAPE,
            {"dataset_to_model": {}},
            out_path=tmp_path / "u.safetensors",
            spec=SubsetSpec(subset=4, calibration=2, seed=0),
        )


def test_load_prepared_missing(tmp_path):
    with pytest.raises(DataError, match="prepared data not found"):
        load_prepared(tmp_path / "none.safetensors")
