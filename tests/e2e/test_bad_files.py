"""Faults that name their object: an undecodable image, truncated weights, one-class data; gray images warned."""

from __future__ import annotations

import json

import numpy as np
import pytest
from datasets import ClassLabel, Dataset, Features, Image
from PIL import Image as PILImage

from profiling_agent.graph.cli.main import main
from profiling_agent.tools.data.labels import map_labels
from profiling_agent.tools.data.prepare import SubsetSpec, decode_all, prepare_images
from profiling_agent.tools.data.sources import DataError, load_split
from profiling_agent.tools.hub import ModelLoadError

DIGITS = [str(i) for i in range(10)]


def _png(path, value: int, size: int = 32, mode: str = "L") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pixels = np.full((size, size) if mode == "L" else (size, size, 3), value % 256, dtype=np.uint8)
    PILImage.fromarray(pixels, mode=mode).save(path)


def _truncate(path, keep: float = 0.5) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def _imagefolder(root, classes=DIGITS, per_class: int = 6, size: int = 32):
    for c, name in enumerate(classes):
        for i in range(per_class):
            _png(root / name / f"{i:03d}.png", 20 * c + i, size)
    return root


@pytest.fixture(scope="module")
def rgb_vit(tmp_path_factory):
    """A random 3-channel ViT for 32x32 images with the digit labels, saved with its image processor."""
    from helpers.tiny import digit_labels, seeded, vit_config
    from transformers import ViTForImageClassification, ViTImageProcessor

    folder = tmp_path_factory.mktemp("rgb-vit") / "model"
    config = vit_config(image_size=32, patch_size=8, num_channels=3, num_attention_heads=2, **digit_labels())
    seeded(ViTForImageClassification, config).save_pretrained(folder)
    ViTImageProcessor(size={"height": 32, "width": 32}).save_pretrained(folder)
    return folder


def _cli(capfd, args):
    """Run the CLI in-process; return (exit code, non-empty stderr lines)."""
    code = main(args)
    out, err = capfd.readouterr()
    assert "Traceback" not in out + err
    return code, [line for line in err.splitlines() if line.strip()]


FAST = [
    "--subset",
    "24",
    "--test-subset",
    "16",
    "--calibration",
    "8",
    "--repeats",
    "2",
    "--threads",
    "1",
    "--planner",
    "deterministic",
    "--iterations",
    "1",
    "--approve",
    "--backend",
    "torch",
]


# ------------------------------------------------------------------ images


def test_a_truncated_png_among_good_ones_is_named_with_its_row(tmp_path):
    root = _imagefolder(tmp_path / "images", classes=["a", "b"], per_class=8)
    bad = root / "b" / "005.png"
    _truncate(bad)
    ds = load_split(str(root), None)
    rows = np.arange(len(ds))
    with pytest.raises(DataError) as caught:
        decode_all(ds, rows, "image", "test")
    message = str(caught.value)
    assert f"cannot decode image {bad} (row 13) of the test images" in message and "\n" not in message
    assert decode_all(ds, rows[rows != 13], "image", "test") == 15  # the others decode (and are grayscale)


def test_an_undecodable_row_without_a_file_is_named_by_its_row(tmp_path):
    good = tmp_path / "good.png"
    _png(good, 7)
    features = Features({"image": Image(), "label": ClassLabel(names=["a", "b"])})
    images = [{"bytes": good.read_bytes(), "path": None}] * 3 + [{"bytes": b"\x89PNG\r\n\x1a\n broken", "path": None}]
    ds = Dataset.from_dict({"image": images, "label": [0, 1, 0, 1]}, features=features)
    with pytest.raises(DataError, match=r"cannot decode the image of row 3 of the calibration images"):
        decode_all(ds, np.arange(4), "image", "calibration")


def test_grayscale_images_for_an_rgb_model_are_converted_with_a_warning(tmp_path):
    root = _imagefolder(tmp_path / "images", classes=["a", "b"], per_class=10)
    ds = load_split(str(root), None)
    mapping = map_labels(["a", "b"], {0: "a", 1: "b"})
    shape = {"channels": 3, "height": 8, "width": 8}
    info = prepare_images(
        ds, None, shape, mapping, out_path=tmp_path / "d.safetensors", spec=SubsetSpec(subset=8, calibration=4)
    )
    assert info["warnings"] == ["12 of 12 images are grayscale: converted to RGB for the 3-channel model"]
    gray = prepare_images(
        ds, None, {**shape, "channels": 1}, mapping, out_path=tmp_path / "g.safetensors", spec=SubsetSpec(subset=8)
    )
    assert gray["warnings"] == []  # a one-channel model: nothing is converted


# ------------------------------------------------------------------ weights


def test_truncated_weights_name_the_file(tmp_path, rgb_vit):
    import shutil

    from profiling_agent.tools.models.loading import load_model

    folder = tmp_path / "model"
    shutil.copytree(rgb_vit, folder)
    _truncate(folder / "model.safetensors")
    with pytest.raises(ModelLoadError) as caught:
        load_model(str(folder))
    assert str(caught.value).startswith(
        f"cannot load the weights {folder / 'model.safetensors'} (corrupt or truncated)"
    )


# ------------------------------------------------------------------ the CLI: exit codes, one line


@pytest.mark.slow
def test_cli_truncated_weights_one_line_exit_2(tmp_path, capfd, rgb_vit):
    import shutil

    folder = tmp_path / "model"
    shutil.copytree(rgb_vit, folder)
    _truncate(folder / "model.safetensors", keep=0.9)
    images = _imagefolder(tmp_path / "images")
    code, lines = _cli(
        capfd, ["run", "--model", str(folder), "--dataset", str(images), "--run-dir", str(tmp_path / "runs"), *FAST]
    )
    assert code == 2 and len(lines) == 1, lines
    assert str(folder / "model.safetensors") in lines[0] and "corrupt or truncated" in lines[0]


@pytest.mark.slow
def test_cli_one_class_imagefolder_one_line_exit_2(tmp_path, capfd, rgb_vit):
    images = _imagefolder(tmp_path / "images", classes=["3"], per_class=40)
    args = ["run", "--model", str(rgb_vit), "--dataset", str(images), "--run-dir", str(tmp_path / "runs"), *FAST]
    code, lines = _cli(capfd, [*args, "--thread-id", "one"])
    assert code == 2 and len(lines) == 1, lines
    assert "1 class ('3') in 40 images" in lines[0] and "--allow-weak-eval" in lines[0]
    assert not (tmp_path / "runs" / "one").exists()  # refused before anything was made
    code, lines = _cli(capfd, [*args, "--thread-id", "forced", "--allow-weak-eval"])
    assert code == 0, lines  # forced: it runs (to the approval pause), and says so loudly
    assert sum("WARNING: accuracy results mean little" in line for line in lines) == 2, lines  # acquire, data


@pytest.mark.slow
def test_cli_truncated_png_exit_2_in_prepare_data_naming_the_file(tmp_path, capfd, rgb_vit):
    images = _imagefolder(tmp_path / "images")
    bad = images / "7" / "004.png"
    _truncate(bad)
    runs = tmp_path / "runs"
    code, lines = _cli(
        capfd,
        ["run", "--model", str(rgb_vit), "--dataset", str(images), "--run-dir", str(runs), "--thread-id", "t", *FAST],
    )
    assert code == 2, lines
    assert lines[-1].startswith("profiling-agent: error: cannot decode image") and str(bad) in lines[-1]
    assert not (runs / "t" / "profile.json").exists()  # before any model work (profile, probe, baseline)


@pytest.mark.slow
def test_cli_class_folders_draw_disjoint_rows_and_warn_about_gray_once(tmp_path, capfd, rgb_vit):
    images = _imagefolder(tmp_path / "images")  # 10 classes, 60 grayscale images, no split folders
    runs = tmp_path / "runs"
    code, lines = _cli(
        capfd,
        ["run", "--model", str(rgb_vit), "--dataset", str(images), "--run-dir", str(runs), "--thread-id", "t", *FAST],
    )
    assert code == 0, lines
    subsets = json.loads((runs / "t" / "subsets.json").read_text())
    roles = [subsets[r] for r in ("validation", "test", "calibration")]
    assert subsets["has_splits"] is False and all(r["split"] is None for r in roles)
    rows = [set(r["indices"]) for r in roles]
    assert [len(r) for r in rows] == [24, 16, 8] and len(rows[0] | rows[1] | rows[2]) == 48
    assert all(0 <= i < 60 for r in rows for i in r)
    data = [line for line in lines if line.startswith("[prepare_data]")]
    assert len(data) == 1 and "has no splits" in data[0] and "disjoint rows" in data[0]
    assert sum("grayscale: converted to RGB" in line for line in lines) == 1, lines


def test_an_image_spoilt_after_prepare_data_is_named_when_streamed(tmp_path):
    from profiling_agent.tools.data.stream import open_prepared

    root = _imagefolder(tmp_path / "images", classes=["a", "b"], per_class=10)
    ds = load_split(str(root), None)
    mapping = map_labels(["a", "b"], {0: "a", 1: "b"})
    shape = {"channels": 1, "height": 8, "width": 8}
    info = prepare_images(
        ds, None, shape, mapping, out_path=tmp_path / "d.safetensors", spec=SubsetSpec(subset=8, calibration=4)
    )
    opened = open_prepared(info["path"], {"eval": ds, "calib": ds}, None, with_indices=True, materialize=())
    row = int(opened["eval_index"][3])
    bad = root / ("a" if row < 10 else "b") / f"{row % 10:03d}.png"
    _truncate(bad)  # the dataset changed under the run (a resumed run, a file being rewritten)
    with pytest.raises(DataError, match=f"cannot decode image {bad} \\(row {row}\\) of the validation images"):
        list(opened["eval_pixels"].batches(4))
