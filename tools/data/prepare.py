"""Draw seeded evaluation, test and calibration subsets; store their rows and labels (images are streamed later)."""

from __future__ import annotations

import hashlib
import io
import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from safetensors import safe_open
from safetensors.torch import save

from profiling_agent.tools.data.labels import mapping_table
from profiling_agent.tools.data.preprocess import preprocess_images
from profiling_agent.tools.data.sources import DataError, detect_columns, label_indexer, label_names, name_listing
from profiling_agent.tools.data.subsets import Subsets, draw_subsets
from profiling_agent.tools.io import sha256_file, write_bytes_atomic
from profiling_agent.tools.text import one_line

logger = logging.getLogger(__name__)
CHECK = 8  # images of each role preprocessed by prepare_images to fail early on unusable images
PARTS = ("eval", "test", "calib")  # validation (selects), held-out test (reports), calibration (probes)
ROLE_NAMES = {"eval": "validation", "test": "test", "calib": "calibration"}
DECODE_CHUNK = 256  # rows fetched at once when every image of a role is decoded once
GRAY_MODES = frozenset({"1", "L", "LA", "I", "I;16", "F"})  # one-channel PIL modes


def _check_images(
    ds: Any, indices: np.ndarray, image_column: str, processor: Any | None, shape: Mapping[str, Any], notes: set[str]
) -> None:
    """Preprocess a role's first few images, so unusable images or processors fail here, with the conversions noted."""
    if len(indices):
        images = ds.select_columns([image_column]).select(indices[:CHECK].tolist())[image_column]
        preprocess_images(images, processor, shape, notes)


def _open_image(item: Mapping[str, Any]) -> Any:
    """Open and fully decode one undecoded `datasets.Image` value ({"bytes", "path"})."""
    image = Image.open(io.BytesIO(item["bytes"])) if item.get("bytes") else Image.open(item["path"])
    image.load()
    return image


def decode_all(ds: Any, indices: np.ndarray, image_column: str, role: str) -> int:
    """Decode every image of a role once, so an unreadable one is named now (its file, or its row), not mid-run.

    Args:
        ds: The split the rows index.
        indices: The role's rows.
        image_column: Image column; columns that are not `datasets.Image` (arrays) are not checked here.
        role: "validation", "test" or "calibration", for the message.

    Returns:
        How many of the images are grayscale (one channel, before any conversion).

    Raises:
        DataError: An image does not decode (truncated, corrupt, missing file): one line naming file and row.
    """
    from datasets import Image as ImageFeature  # lazy: datasets; nodes.prepare_data loads this module without it

    if not len(indices) or not isinstance(ds.features[image_column], ImageFeature):
        return 0
    raw = ds.select_columns([image_column]).cast_column(image_column, ImageFeature(decode=False))
    gray = 0
    for start in range(0, len(indices), DECODE_CHUNK):
        rows = indices[start : start + DECODE_CHUNK].tolist()
        for row, item in zip(rows, raw.select(rows)[image_column], strict=True):
            try:
                with _open_image(item) as image:
                    gray += image.mode in GRAY_MODES
            except Exception as err:  # noqa: BLE001 - PIL raises OSError, SyntaxError, ValueError... for bad files
                where = f"image {item['path']} (row {row})" if item.get("path") else f"the image of row {row}"
                raise DataError(f"cannot decode {where} of the {role} images: {one_line(err)}") from None
    return gray


def raw_labels_digest(ds: Any, label_column: str, indices: np.ndarray) -> str:
    """Return a sha256 of the raw label values at `indices`: what tells a changed dataset from the one drawn."""
    values = ds.select_columns([label_column])[indices.tolist()][label_column] if len(indices) else []
    return hashlib.sha256(json.dumps([str(v) for v in values]).encode()).hexdigest()


def _labels(
    ds: Any, indices: np.ndarray, label_column: str, to_index: Callable[[Any], int], table: dict[int, int]
) -> torch.Tensor:
    raw = list(ds.select_columns([label_column]).select(indices.tolist())[label_column]) if len(indices) else []
    out = []
    for value in raw:
        index = to_index(value)
        if index < 0:
            raise DataError("the split has unlabelled samples (label -1 or missing): use a labelled split")
        if index not in table:
            raise DataError(f"dataset class {index} has no entry in the label mapping")
        out.append(table[index])
    return torch.tensor(out, dtype=torch.long)


@dataclass(frozen=True)
class SubsetSpec:
    """What prepare_images draws: the size of each role, the seed of the draw and the columns it reads.

    Attributes:
        subset: Validation samples (0: every row of the split outside the test and calibration subsets).
        calibration: Calibration samples.
        seed: Seed of every draw.
        test_subset: Held-out test samples (0: none).
        image_column: Image column (detected when None).
        label_column: Label column (detected when None).
    """

    subset: int = 512
    calibration: int = 64
    seed: int = 0
    test_subset: int = 0
    image_column: str | None = None
    label_column: str | None = None


@dataclass
class _Roles:
    """What reading every role's rows gave: the tensors to store, and what the checks found."""

    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    rows: dict[str, int] = field(default_factory=dict)  # rows of each role's source split
    digests: dict[str, str] = field(default_factory=dict)  # raw labels at the drawn rows
    gray: int = 0  # grayscale images, before any conversion
    notes: set[str] = field(default_factory=set)  # conversions preprocessing made


def _draw(ds: Any, test_src: Any, calib_src: Any, spec: SubsetSpec) -> Subsets:
    """Draw the three roles' rows from one seeded permutation (the other splits' rows when they come from one)."""
    n = len(ds)
    return draw_subsets(
        n,
        val=spec.subset if spec.subset > 0 else n,
        test=spec.test_subset,
        calib=spec.calibration,
        seed=spec.seed,
        test_rows=len(test_src) if test_src is not ds else None,
        calib_rows=len(calib_src) if calib_src is not ds else None,
        val_all=spec.subset <= 0,
    )


def _read_roles(
    parts: Mapping[str, tuple[Any, np.ndarray]],
    columns: tuple[str, str],
    names: list[str],
    table: dict[int, int],
    processor: Any | None,
    shape: Mapping[str, Any],
) -> _Roles:
    """Map each role's labels, digest them, decode every image once and preprocess a few (failing early)."""
    image_column, label_column = columns
    roles = _Roles()
    for name, (src, idx) in parts.items():
        to_index = label_indexer(src, label_column, names)
        roles.tensors[f"{name}_labels"] = _labels(src, idx, label_column, to_index, table)
        roles.tensors[f"{name}_index"] = torch.from_numpy(idx.astype(np.int64))
        roles.rows[name], roles.digests[name] = len(src), raw_labels_digest(src, label_column, idx)
        roles.gray += decode_all(src, idx, image_column, ROLE_NAMES[name])
        _check_images(src, idx, image_column, processor, shape, roles.notes)
    return roles


def _warnings(drawn: Subsets, gray: int, channels: int) -> list[str]:
    """Return what the console must say: grayscale images converted for an RGB model."""
    if not gray or channels != 3:
        return []
    total = len(drawn.val) + len(drawn.test) + len(drawn.calib)
    return [f"{gray} of {total} images are grayscale: converted to RGB for the 3-channel model"]


def _note(drawn: Subsets, test_src: Any, calib_src: Any, ds: Any, notes: set[str]) -> str:
    """Say what had to give in the draw, which roles come from another split, and the conversions made."""
    where = []
    if test_src is not ds:
        where.append(f"test images from another split ({len(drawn.test)} of {len(test_src)})")
    if calib_src is not ds:
        where.append(f"calibration images drawn from another split ({len(drawn.calib)} of {len(calib_src)})")
    return "; ".join(x for x in [drawn.note, *where, *sorted(notes)] if x)


def prepare_images(
    ds: Any,
    processor: Any | None,
    shape: Mapping[str, Any],
    mapping: Mapping[str, Any],
    *,
    out_path: str | Path,
    spec: SubsetSpec = SubsetSpec(),
    calibration_ds: Any | None = None,
    test_ds: Any | None = None,
) -> dict[str, Any]:
    """Draw seeded validation, test and calibration subsets and save their row numbers and labels (safetensors).

    The three are disjoint by construction (`draw_subsets`): the validation subset is what the loop selects
    on, the test subset is held out for reporting, the calibration images feed the sensitivity probe. Labels
    are mapped to model class ids with `mapping`. No pixels are stored: `stream.open_prepared` decodes and
    preprocesses the images batch by batch from these rows, so the file stays small whatever the subset size
    (every image of each role is decoded once and a few preprocessed here, so an unreadable image is named now, not
    mid-run, and conversions are noted).

    Args:
        ds: A `datasets.Dataset`: the evaluated split.
        processor: The model's image processor, or None (resize + [0, 1] + normalize 0.5/0.5).
        shape: {"channels", "height", "width"} from resolve_input_shape.
        mapping: The dict returned by map_labels for this dataset's label names.
        out_path: Where to write the .safetensors file (atomically).
        spec: Subset sizes, seed and columns (`SubsetSpec`).
        calibration_ds: Another split (same columns and labels) to draw the calibration images from.
        test_ds: Another split (same columns and labels) to draw the test images from.

    Returns:
        {"path", "n_eval", "n_test", "n_calib", "image_column", "label_column", "label_names", "note", "shape",
        "seed", "calib_overlaps_eval" (always False now), "test_other_split", "calib_other_split", "sha256",
        "warnings" (what the console must say: grayscale images converted for an RGB model)}.

    Raises:
        DataError: Empty split, unlabelled samples, an image that does not decode (named), unusable columns.
    """
    image_column, label_column = detect_columns(ds, spec.image_column, spec.label_column)
    if len(ds) == 0:
        raise DataError("the split is empty")
    names = label_names(ds, label_column)
    test_src = test_ds if test_ds is not None and len(test_ds) > 0 else ds
    calib_src = calibration_ds if calibration_ds is not None and len(calibration_ds) > 0 else ds
    drawn = _draw(ds, test_src, calib_src, spec)
    parts = {"eval": (ds, drawn.val), "test": (test_src, drawn.test), "calib": (calib_src, drawn.calib)}
    roles = _read_roles(parts, (image_column, label_column), names, mapping_table(mapping), processor, shape)
    note = _note(drawn, test_src, calib_src, ds, roles.notes)
    shape_list = [int(shape["channels"]), int(shape["height"]), int(shape["width"])]
    meta = {"seed": spec.seed, "shape": shape_list, "note": note, "image_column": image_column}
    meta.update(label_column=label_column, rows=roles.rows, labels_sha256=roles.digests)
    save_tensors(out_path, roles.tensors, meta)
    logger.info(
        "prepared %d validation, %d test and %d calibration images at %s",
        len(drawn.val),
        len(drawn.test),
        len(drawn.calib),
        out_path,
    )
    return {
        "path": str(out_path),
        "n_eval": len(drawn.val),
        "n_test": len(drawn.test),
        "n_calib": len(drawn.calib),
        "image_column": image_column,
        "label_column": label_column,
        "label_names": names,
        "note": note,
        "shape": shape_list,
        "seed": spec.seed,
        "calib_overlaps_eval": False,
        "test_other_split": test_src is not ds,
        "calib_other_split": calib_src is not ds,
        "sha256": sha256_file(out_path),
        "warnings": _warnings(drawn, roles.gray, int(shape["channels"])),
    }


def save_tensors(path: str | Path, tensors: dict[str, torch.Tensor], metadata: dict[str, Any]) -> None:
    """Write tensors with safetensors through a temp file and os.replace (same inputs, same bytes)."""
    # One metadata key: safetensors keeps metadata in a hash map, so several keys come out in random order.
    header = {"profiling_agent": json.dumps(metadata, sort_keys=True)}
    write_bytes_atomic(path, save({k: v.contiguous() for k, v in tensors.items()}, metadata=header))


def load_prepared(
    path: str | Path, with_indices: bool = False, parts: tuple[str, ...] = ("eval", "calib"), with_meta: bool = False
) -> dict[str, Any]:
    """Load what prepare_images wrote for the parts asked for: labels (and row numbers), never pixels.

    The images themselves are streamed from the dataset rows (`stream.open_prepared`).

    Args:
        path: The .safetensors file.
        with_indices: Also return each part's `<part>_index` (row numbers in its split).
        with_meta: Also return "meta": how the subsets were drawn (seed, shape, note, image and label columns,
            rows of each source split, digests of the raw labels at the drawn rows).
        parts: Which of "eval" (validation), "test" and "calib" to load.

    Returns:
        {"<part>_labels"} for each part (+ "<part>_index" and "meta" when asked).

    Raises:
        DataError: The file is missing or lacks a tensor.
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"prepared data not found: {path}")
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        raise ValueError(f"unknown parts {unknown}: use {', '.join(PARTS)}")
    keys = [f"{p}_{k}" for p in parts for k in ("labels", *(("index",) if with_indices else ()))]
    with safe_open(str(path), framework="pt") as handle:
        present = set(handle.keys())
        missing = [k for k in keys if k not in present]
        if missing:
            raise DataError(f"{path} lacks tensors: {name_listing(missing)}")
        # cloned: get_tensor views a private mapping of the file, which a rewrite in place would change (facts.md)
        out: dict[str, Any] = {k: handle.get_tensor(k).clone() for k in keys}
        if with_meta:
            out["meta"] = json.loads((handle.metadata() or {}).get("profiling_agent", "{}"))
        return out
