"""Load labelled image splits (embedded, save_to_disk, imagefolder, hub) and find their columns."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import huggingface_hub.constants as hub_constants
import numpy as np

from profiling_agent.tools.hub import EMBEDDED_PREFIX, hub_offline, hub_probe, looks_like_path, quiet_hf
from profiling_agent.tools.models.embedded_data import ensure_dataset
from profiling_agent.tools.text import one_line

logger = logging.getLogger(__name__)

EMBEDDED_DATASETS = ("embedded:digits",)
IMAGE_EXTENSIONS = frozenset({".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm"})
IMAGE_COLUMNS = ("image", "img", "pixel_values")  # tried in order when no datasets.Image feature exists
LABEL_COLUMNS = ("label", "labels", "fine_label")  # preferred names among ClassLabel features, then fallbacks


class DataError(ValueError):
    """A dataset problem; the message is one line, shown to users as-is."""


def name_listing(items: Iterable[Any], limit: int = 8) -> str:
    """Return a short comma-separated listing of `items`."""
    items = [str(item) for item in items]
    shown = ", ".join(items[:limit])
    return shown + (f", ... ({len(items)} in all)" if len(items) > limit else "")


# ---------------------------------------------------------------- loading splits


def _pick_split(obj: Any, split: str | None, ref: str) -> Any:
    """Return `split` of a DatasetDict, or a plain Dataset as is."""
    from datasets import DatasetDict  # lazy: datasets; nodes.acquire loads this module without it

    if not isinstance(obj, DatasetDict):
        if split:
            logger.info("%s is a single dataset without splits: using all of it for split '%s'", ref, split)
        return obj
    if not split:
        raise DataError(f"{ref} has several splits; choose one of: {name_listing(obj.keys())}")
    if split not in obj:
        raise DataError(f"split '{split}' not found in {ref}; available: {name_listing(obj.keys())}")
    return obj[split]


def has_splits(ref: str) -> bool:
    """Return False when `ref` is one undivided dataset: a save_to_disk `Dataset` or an imagefolder of class folders.

    Such a dataset reads the same rows whatever split is named, so every role must be drawn from it at once
    (`roles.role_sources`). A DatasetDict, split folders, the embedded data set and hub datasets have splits.
    """
    ref = (ref or "").strip()
    path = Path(ref).expanduser()
    if ref.startswith(EMBEDDED_PREFIX) or not path.is_dir():
        return True
    if (path / "dataset_dict.json").is_file():
        return True
    if any((path / name).is_file() for name in ("state.json", "dataset_info.json")):
        return False
    top = _subdirs(path)
    return bool(top) and not any(_images_in(d) for d in top)


def _images_in(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS)


def _subdirs(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))


def _imagefolder(path: Path, split: str | None, ref: str) -> Any:
    """Build a Dataset from class subfolders, or from split subfolders holding class subfolders."""
    from datasets import (
        ClassLabel,
        Dataset,
        Features,
        Image,
    )  # lazy: datasets; nodes.acquire loads this module without it

    top = _subdirs(path)
    if not top:
        raise DataError(f"{ref} is not a dataset folder: no save_to_disk files and no class subfolders")
    if any(_images_in(d) for d in top):  # class layout: the folder is one split
        classes = {d.name: d for d in top}
        if split:
            logger.info("%s has class folders but no split folders: using all images for split '%s'", ref, split)
    else:  # split layout: split/class/image
        splits = {d.name: d for d in top if any(_images_in(c) for c in _subdirs(d))}
        if not splits:
            raise DataError(f"{ref} holds no images in class subfolders (imagefolder layout: [split/]class/img.png)")
        if split not in splits:
            raise DataError(f"split '{split}' not found in {ref}; available: {name_listing(splits)}")
        names = sorted({c.name for d in splits.values() for c in _subdirs(d)})  # same ids in every split
        classes = {name: splits[split] / name for name in names}
    names = sorted(classes)
    images: list[str] = []
    labels: list[int] = []
    for index, name in enumerate(names):
        folder = classes[name]
        found = _images_in(folder) if folder.is_dir() else []
        images.extend(str(p) for p in found)
        labels.extend([index] * len(found))
    if not images:
        raise DataError(f"{ref}: no images found for split '{split}'")
    features = Features({"image": Image(), "label": ClassLabel(names=names)})
    return Dataset.from_dict({"image": images, "label": labels}, features=features)


def _hub_dataset(ref: str, split: str | None) -> Any:
    """Load a hub dataset split, failing fast with one line when offline or unreachable."""
    from datasets import load_dataset  # lazy: datasets; nodes.acquire loads this module without it

    why = "offline mode is on (HF_HUB_OFFLINE)" if hub_offline() else _unreachable(hub_probe("dataset", ref, DataError))
    try:
        with quiet_hf(), _offline(bool(why)):
            return load_dataset(ref, split=split)
    except ValueError as err:
        text = one_line(err)
        if "split" in text.lower():
            raise DataError(f"split '{split}' not found in {ref}: {text}") from None
        raise DataError(f"cannot load hub dataset {ref}: {text}") from None
    except Exception as err:  # noqa: BLE001 - network, cache and not-found errors of any kind
        if why:
            raise DataError(f"cannot fetch hub dataset {ref}: {why} and it is not in the local cache") from None
        raise DataError(f"cannot load hub dataset {ref}: {one_line(err)}") from None


@contextlib.contextmanager
def _offline(active: bool) -> Iterator[None]:
    """Make datasets and huggingface_hub use the local cache only (no retries against an unreachable hub).

    Both libraries read HF_HUB_OFFLINE once at import, so the flags are patched for the duration.
    """
    if not active:
        yield
        return
    import datasets.config as ds_config  # lazy: datasets; nodes.acquire loads this module without it

    saved = (hub_constants.HF_HUB_OFFLINE, ds_config.HF_HUB_OFFLINE, ds_config.HF_DATASETS_OFFLINE)
    hub_constants.HF_HUB_OFFLINE = ds_config.HF_HUB_OFFLINE = ds_config.HF_DATASETS_OFFLINE = True
    try:
        yield
    finally:
        hub_constants.HF_HUB_OFFLINE, ds_config.HF_HUB_OFFLINE, ds_config.HF_DATASETS_OFFLINE = saved


def _unreachable(reason: str | None) -> str | None:
    return None if reason is None else f"the hub is unreachable ({reason})"


def load_split(ref: str, split: str | None) -> Any:
    """Load one split of a labelled image dataset.

    Args:
        ref: "embedded:digits", a save_to_disk folder (Dataset or DatasetDict), an imagefolder directory
            (class subfolders, or split subfolders holding class subfolders), or a hub id.
        split: The split name; required for a DatasetDict, split folders or a hub id; ignored (with a log
            line) for a single Dataset or a class-only folder.

    Returns:
        A `datasets.Dataset`.

    Raises:
        DataError: One-line reason: path not found, not a dataset, unknown split (with the available
            ones), hub unreachable or offline and not cached.
    """
    from datasets import load_from_disk  # lazy: datasets; nodes.acquire loads this module without it

    ref = (ref or "").strip()
    if not ref:
        raise DataError("empty dataset reference")
    if ref.startswith(EMBEDDED_PREFIX):
        if ref not in EMBEDDED_DATASETS:
            raise DataError(f"unknown embedded dataset '{ref}'; choose from {name_listing(EMBEDDED_DATASETS)}")

        return _pick_split(load_from_disk(str(ensure_dataset())), split, ref)
    path = Path(ref).expanduser()
    if path.exists():
        if not path.is_dir():
            raise DataError(f"{ref} is a file; expected a save_to_disk or imagefolder directory")
        if any((path / name).is_file() for name in ("dataset_dict.json", "state.json", "dataset_info.json")):
            try:
                with quiet_hf():
                    loaded = load_from_disk(str(path))
            except Exception as err:  # noqa: BLE001 - corrupt or foreign folders
                raise DataError(f"cannot load the save_to_disk folder {ref}: {one_line(err)}") from None
            return _pick_split(loaded, split, ref)
        return _imagefolder(path, split, ref)
    if looks_like_path(ref):
        raise DataError(f"dataset path not found: {ref}")
    return _hub_dataset(ref, split)


# ---------------------------------------------------------------- columns and label names


def detect_columns(ds: Any, image_column: str | None = None, label_column: str | None = None) -> tuple[str, str]:
    """Find the image and label columns of a dataset, validating explicit choices.

    The image column is the `datasets.Image` feature, else one named image/img/pixel_values; the label
    column is the `ClassLabel` feature (label/labels/fine_label preferred when several), else one of
    those names.

    Returns:
        (image_column, label_column).

    Raises:
        DataError: An explicit name is not a column, or no suitable column exists.
    """
    from datasets import ClassLabel, Image  # lazy: datasets; nodes.acquire loads this module without it

    columns = list(ds.column_names)
    features = ds.features
    for kind, name in (("image", image_column), ("label", label_column)):
        if name is not None and name not in columns:
            raise DataError(f"{kind} column '{name}' not in the dataset; columns: {name_listing(columns)}")
    image = image_column or _first(
        [c for c in columns if isinstance(features[c], Image)] + [c for c in IMAGE_COLUMNS if c in columns]
    )
    if image is None:
        raise DataError(f"no image column found (columns: {name_listing(columns)}); pass image_column")
    class_labels = [c for c in columns if c != image and isinstance(features[c], ClassLabel)]
    preferred = [c for c in LABEL_COLUMNS if c in class_labels] + class_labels
    label = label_column or _first(preferred + [c for c in LABEL_COLUMNS if c in columns and c != image])
    if label is None:
        raise DataError(f"no label column found (columns: {name_listing(columns)}); pass label_column")
    if label == image:
        raise DataError(f"image and label columns are both '{label}'")
    return image, label


def _first(items: Sequence[str]) -> str | None:
    return items[0] if items else None


def label_names(ds: Any, label_column: str) -> list[str]:
    """Return the dataset's class names, index = dataset class id.

    ClassLabel names when the column has them; otherwise the sorted distinct values (strings, or
    integers written as strings).
    """
    from datasets import ClassLabel  # lazy: datasets; nodes.acquire loads this module without it

    feature = ds.features[label_column]
    if isinstance(feature, ClassLabel):
        return list(feature.names)
    values = [v for v in ds.unique(label_column) if v is not None]
    if all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in values):
        return [str(v) for v in sorted(int(v) for v in values if v >= 0)]
    return sorted(str(v) for v in values)


def label_indexer(ds: Any, label_column: str, names: Sequence[str]) -> Callable[[Any], int]:
    """Return a function from a raw label value to its dataset class index (-1 when unlabelled)."""
    from datasets import ClassLabel  # lazy: datasets; nodes.acquire loads this module without it

    if isinstance(ds.features[label_column], ClassLabel):
        return lambda value: -1 if value is None else int(value)
    position = {name: i for i, name in enumerate(names)}
    return lambda value: position.get(str(value), -1)
