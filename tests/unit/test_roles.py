"""Every input format draws validation, test, calibration and training rows disjoint (tools/data/roles.py)."""

from __future__ import annotations

import numpy as np
import pytest
from datasets import ClassLabel, Dataset, DatasetDict, Features, Image
from PIL import Image as PILImage

from profiling_agent.state import DatasetRef
from profiling_agent.tools.data.labels import map_labels
from profiling_agent.tools.data.prepare import PARTS, ROLE_NAMES, SubsetSpec, load_prepared, prepare_images
from profiling_agent.tools.data.roles import check_classes, check_judgeable, role_sources, subsets_record, weak_reasons
from profiling_agent.tools.data.sources import DataError, has_splits, load_split
from profiling_agent.tools.data.subsets import trial_rows, trial_size
from profiling_agent.tools.data.train_stream import find_train_source

NAMES = ("cat", "dog", "bird")
SHAPE = {"channels": 1, "height": 8, "width": 8}


def _image(value: int) -> PILImage.Image:
    return PILImage.fromarray(np.full((8, 8), value % 256, dtype=np.uint8), mode="L")


def _dataset(n: int, offset: int = 0) -> Dataset:
    """Images whose gray value encodes (offset + row), labels cycling over three classes."""
    features = Features({"image": Image(), "label": ClassLabel(names=list(NAMES))})
    rows = {"image": [_image(offset + i) for i in range(n)], "label": [i % 3 for i in range(n)]}
    return Dataset.from_dict(rows, features=features)


def _imagefolder(root, n: int, offset: int = 0) -> None:
    for i in range(n):
        folder = root / NAMES[i % 3]
        folder.mkdir(parents=True, exist_ok=True)
        _image(offset + i).save(folder / f"{offset + i:04d}.png")


def _build(kind: str, tmp_path):
    """Return (dataset folder, evaluated split) of one input format, 140 images in a dataset without splits."""
    path = tmp_path / kind
    if kind == "imagefolder":  # class folders only: no splits
        _imagefolder(path, 140)
        return path, "test"
    if kind == "imagefolder-splits":
        _imagefolder(path / "train", 100, offset=100)
        _imagefolder(path / "test", 40)
        return path, "test"
    if kind == "dataset":  # save_to_disk of one Dataset: no splits
        _dataset(140).save_to_disk(str(path))
        return path, "test"
    DatasetDict({"train": _dataset(100, offset=100), "test": _dataset(40)}).save_to_disk(str(path))
    return path, "test"


def _prepare(tmp_path, ref: DatasetRef):
    """Run what the prepare_images node runs; return (subsets.json record, role sources)."""
    sources = role_sources(ref)
    out = tmp_path / f"{ref.split}-data.safetensors"
    prepare_images(
        sources.evaluated,
        None,
        SHAPE,
        map_labels(list(NAMES), dict(enumerate(NAMES))),
        out_path=out,
        calibration_ds=sources.calibration,
        test_ds=sources.test,
        spec=SubsetSpec(subset=ref.subset, test_subset=ref.test_subset, calibration=ref.calibration, seed=ref.seed),
    )
    tensors = load_prepared(out, with_indices=True, parts=PARTS)
    rows = {ROLE_NAMES[p]: tensors[f"{p}_index"].numpy() for p in PARTS}
    return subsets_record(ref.ref, ref.seed, sources, rows), sources


def _pixels(ref: str, split: str | None, rows: list[int]) -> set[int]:
    """The gray values (the images' identities) at `rows` of `split`."""
    ds = load_split(ref, split).select(rows)
    return {int(np.asarray(image).flat[0]) for image in ds["image"]}


@pytest.mark.parametrize("kind", ["imagefolder", "imagefolder-splits", "dataset", "datasetdict"])
def test_roles_are_disjoint_images_in_every_format(tmp_path, kind):
    path, split = _build(kind, tmp_path)
    ref = DatasetRef(ref=str(path), split=split, subset=48, test_subset=32, calibration=16)
    record, sources = _prepare(tmp_path, ref)
    roles = ("validation", "test", "calibration")
    whole = kind in ("imagefolder", "dataset")
    assert has_splits(str(path)) is not whole and record["has_splits"] is not whole
    if whole:  # one permutation of the whole dataset, recorded as such
        assert all(record[r]["split"] is None for r in roles) and sources.note
        assert [len(record[r]["indices"]) for r in roles] == [48, 32, 16]
    else:  # the 40-image test split cannot hold 96: validation and test from it, calibration from train
        assert [record[r]["split"] for r in roles] == ["test", "test", "train"]
        assert len(record["calibration"]["indices"]) == 16
    # what the rows point at: distinct images, whatever split name each role recorded
    images = {r: _pixels(str(path), record[r]["split"], record[r]["indices"]) for r in roles}
    assert all(len(images[r]) == len(record[r]["indices"]) for r in roles)
    assert not images["validation"] & images["test"]
    assert not (images["validation"] | images["test"]) & images["calibration"]
    # recovery trains on what is left, never on a role's image
    train = find_train_source(str(path), split, record, image_column="image", label_column="label")
    assert train is not None
    trained = _pixels(str(path), train.split, train.rows.tolist())
    assert not trained & (images["validation"] | images["test"] | images["calibration"])
    if whole:
        assert len(trained) == 140 - 96 and train.split is None and "no splits" in train.note
    else:
        assert train.split == "train" and len(trained) == 100 - 16
    # the trial slice judges every plan trial: validation rows only (so never a test, calibration or training image)
    trial = record["trial"]
    assert trial["split"] == record["validation"]["split"] and trial["of"] == "validation"
    n_val = len(record["validation"]["indices"])  # 48, or what the 40-image split left
    assert set(trial["indices"]) <= set(record["validation"]["indices"]) and len(trial["indices"]) == trial_size(n_val)
    assert trial["indices"] == trial_rows(np.asarray(record["validation"]["indices"]), ref.seed).tolist()
    judged = _pixels(str(path), trial["split"], trial["indices"])
    assert judged <= images["validation"] and not judged & (images["test"] | images["calibration"] | trained)


def test_named_splits_of_a_split_less_dataset_are_not_other_data(tmp_path):
    path, _ = _build("dataset", tmp_path)
    ref = DatasetRef(ref=str(path), split="validation", test_split="test", train_split="train", subset=48)
    ref = ref.model_copy(update={"test_subset": 32, "calibration": 16})
    record, sources = _prepare(tmp_path, ref)
    assert sources.test is None and sources.calibration is None
    assert "--test-split test" in sources.note and "--train-split train" in sources.note
    sets = [set(record[r]["indices"]) for r in ("validation", "test", "calibration")]
    assert not (sets[0] & sets[1] or sets[0] & sets[2] or sets[1] & sets[2])


def test_calibration_never_shares_the_test_split(tmp_path):
    path = tmp_path / "dd"
    DatasetDict({"validation": _dataset(30), "train": _dataset(60, offset=300)}).save_to_disk(str(path))
    ref = DatasetRef(ref=str(path), split="validation", test_split="train", subset=16, test_subset=16, calibration=8)
    record, sources = _prepare(tmp_path, ref)
    assert sources.calibration is None  # train feeds the test images: calibration stays in validation
    assert record["calibration"]["split"] == "validation" == record["validation"]["split"]
    assert not set(record["calibration"]["indices"]) & set(record["validation"]["indices"])


def test_a_record_that_shares_rows_is_refused():
    class Sources:
        whole, splits = True, dict.fromkeys(("validation", "test", "calibration"))

    with pytest.raises(RuntimeError, match="share 1 rows"):
        subsets_record("x", 0, Sources(), {"validation": [1, 2], "test": [3], "calibration": [2]})  # type: ignore[arg-type]


def test_weak_data_is_refused_or_warned():
    assert weak_reasons({"validation": 48, "test": 32, "calibration": 16}, {"validation": 3, "test": 3}, {}) == []
    reasons = weak_reasons(
        {"validation": 5, "test": 8, "calibration": 2},
        {"validation": 1, "test": 2},
        {"validation": 1, "test": 8, "calibration": 16},
    )
    assert reasons == [
        "5 validation images (at least 8 needed)",
        "2 calibration images (at least 4 needed)",
        "1 class among the validation images (any model scores 100%)",
    ]
    with pytest.raises(DataError, match="--allow-weak-eval"):
        check_judgeable(reasons, allow_weak=False)
    assert check_judgeable(reasons, allow_weak=True).startswith("WARNING: ")
    one = Dataset.from_dict({"label": [2] * 30}, features=Features({"label": ClassLabel(names=list(NAMES))}))
    with pytest.raises(DataError, match=r"1 class \(.bird.\) in 30 images"):
        check_classes(one, "label", allow_weak=False)
    assert check_classes(_dataset(6), "label", allow_weak=False) == ""


def test_a_hub_dataset_with_splits_draws_each_role_from_its_split(tmp_path):
    splits = {"validation": _dataset(30), "test": _dataset(40, offset=30), "train": _dataset(100, offset=100)}

    def hub(ref, split):  # what load_dataset(ref, split=...) does: the split, or an error for an unknown one
        if split not in splits:
            raise DataError(f"split '{split}' not found in {ref}")
        return splits[split]

    ref = DatasetRef(ref="org/name", split="validation", subset=24, test_subset=32, calibration=8)
    sources = role_sources(ref, loader=hub, splits=True)
    assert sources.splits == {"validation": "validation", "test": "test", "calibration": "train"}
    assert sources.test is splits["test"] and sources.calibration is splits["train"] and not sources.whole
    wider = role_sources(ref.model_copy(update={"subset": 8}), loader=hub, splits=True)
    assert wider.calibration is None and wider.splits["calibration"] == "validation"  # 30 rows hold 8 + 8
    with pytest.raises(DataError, match="split 'nope' not found"):
        role_sources(ref.model_copy(update={"test_split": "nope"}), loader=hub, splits=True)
