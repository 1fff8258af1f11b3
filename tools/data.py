"""Load labelled image splits, map dataset labels to model classes, and prepare seeded evaluation tensors."""

from __future__ import annotations

import contextlib
import json
import logging
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from profiling_agent.tools.io import sha256_file, write_bytes_atomic
from profiling_agent.tools.models import hub_offline, looks_like_path, one_line, quiet_hf

logger = logging.getLogger(__name__)

EMBEDDED_DATASETS = ("embedded:digits",)
IMAGE_EXTENSIONS = frozenset({".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm"})
IMAGE_COLUMNS = ("image", "img", "pixel_values")  # tried in order when no datasets.Image feature exists
LABEL_COLUMNS = ("label", "labels", "fine_label")  # preferred names among ClassLabel features, then fallbacks
HUB_TIMEOUT_S = 10.0
BATCH = 64  # images per processor call
_WNID = re.compile(r"^n\d{8}$")
_NUMERIC = re.compile(r"^(?:label_)?(\d+)$", re.IGNORECASE)
PREPARED_KEYS = ("eval_pixels", "eval_labels", "calib_pixels", "calib_labels")


class DataError(ValueError):
    """A dataset problem; the message is one line, shown to users as-is."""


def _listing(items: Iterable[Any], limit: int = 8) -> str:
    """Return a short comma-separated listing of `items`."""
    items = [str(item) for item in items]
    shown = ", ".join(items[:limit])
    return shown + (f", ... ({len(items)} in all)" if len(items) > limit else "")


# ---------------------------------------------------------------- loading splits


def _pick_split(obj: Any, split: str | None, ref: str) -> Any:
    """Return `split` of a DatasetDict, or a plain Dataset as is."""
    from datasets import DatasetDict

    if not isinstance(obj, DatasetDict):
        if split:
            logger.info("%s is a single dataset without splits: using all of it for split '%s'", ref, split)
        return obj
    if not split:
        raise DataError(f"{ref} has several splits; choose one of: {_listing(obj.keys())}")
    if split not in obj:
        raise DataError(f"split '{split}' not found in {ref}; available: {_listing(obj.keys())}")
    return obj[split]


def _images_in(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS)


def _subdirs(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))


def _imagefolder(path: Path, split: str | None, ref: str) -> Any:
    """Build a Dataset from class subfolders, or from split subfolders holding class subfolders."""
    from datasets import ClassLabel, Dataset, Features, Image

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
            raise DataError(f"split '{split}' not found in {ref}; available: {_listing(splits)}")
        names = sorted({c.name for d in splits.values() for c in _subdirs(d)})  # same ids in every split
        classes = {name: splits[split] / name for name in names}
    names = sorted(classes)
    images, labels = [], []
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
    from datasets import load_dataset

    why = "offline mode is on (HF_HUB_OFFLINE)" if hub_offline() else _hub_unreachable(ref)
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
    import datasets.config as ds_config
    import huggingface_hub.constants as hub_constants

    saved = (hub_constants.HF_HUB_OFFLINE, ds_config.HF_HUB_OFFLINE, ds_config.HF_DATASETS_OFFLINE)
    hub_constants.HF_HUB_OFFLINE = ds_config.HF_HUB_OFFLINE = ds_config.HF_DATASETS_OFFLINE = True
    try:
        yield
    finally:
        hub_constants.HF_HUB_OFFLINE, ds_config.HF_HUB_OFFLINE, ds_config.HF_DATASETS_OFFLINE = saved


def _hub_unreachable(ref: str) -> str | None:
    """Ask the hub about dataset `ref` with a short timeout; return None when it answered, else why not."""
    from huggingface_hub import dataset_info
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    try:
        dataset_info(ref, timeout=HUB_TIMEOUT_S)
    except GatedRepoError:
        raise DataError(f"hub dataset {ref} is gated: accept its terms and log in (hf auth login)") from None
    except RepositoryNotFoundError:
        raise DataError(f"hub dataset not found: {ref} (or it is private: log in with hf auth login)") from None
    except Exception as err:  # noqa: BLE001 - network failures of any kind
        return f"the hub is unreachable ({one_line(err, 120)})"
    return None


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
    from datasets import load_from_disk

    ref = (ref or "").strip()
    if not ref:
        raise DataError("empty dataset reference")
    if ref.startswith("embedded:"):
        if ref not in EMBEDDED_DATASETS:
            raise DataError(f"unknown embedded dataset '{ref}'; choose from {_listing(EMBEDDED_DATASETS)}")
        from profiling_agent.tools.embedded import ensure_dataset

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
    from datasets import ClassLabel, Image

    columns = list(ds.column_names)
    features = ds.features
    for kind, name in (("image", image_column), ("label", label_column)):
        if name is not None and name not in columns:
            raise DataError(f"{kind} column '{name}' not in the dataset; columns: {_listing(columns)}")
    image = image_column or _first(
        [c for c in columns if isinstance(features[c], Image)] + [c for c in IMAGE_COLUMNS if c in columns]
    )
    if image is None:
        raise DataError(f"no image column found (columns: {_listing(columns)}); pass image_column")
    class_labels = [c for c in columns if c != image and isinstance(features[c], ClassLabel)]
    preferred = [c for c in LABEL_COLUMNS if c in class_labels] + class_labels
    label = label_column or _first(preferred + [c for c in LABEL_COLUMNS if c in columns and c != image])
    if label is None:
        raise DataError(f"no label column found (columns: {_listing(columns)}); pass label_column")
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
    from datasets import ClassLabel

    feature = ds.features[label_column]
    if isinstance(feature, ClassLabel):
        return list(feature.names)
    values = [v for v in ds.unique(label_column) if v is not None]
    if all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in values):
        return [str(v) for v in sorted(int(v) for v in values if v >= 0)]
    return sorted(str(v) for v in values)


def _label_indexer(ds: Any, label_column: str, names: Sequence[str]) -> Callable[[Any], int]:
    """Return a function from a raw label value to its dataset class index (-1 when unlabelled)."""
    from datasets import ClassLabel

    if isinstance(ds.features[label_column], ClassLabel):
        return lambda value: -1 if value is None else int(value)
    position = {name: i for i, name in enumerate(names)}
    return lambda value: position.get(str(value), -1)


# ---------------------------------------------------------------- label mapping


def _norm(name: Any) -> str:
    """Normalize a class name: case-, underscore- and whitespace-insensitive."""
    return re.sub(r"[\s_]+", "", str(name).strip().lower())


def _int_keys(id2label: Mapping[Any, Any]) -> dict[int, str]:
    try:
        return {int(k): str(v) for k, v in id2label.items()}
    except (TypeError, ValueError):
        raise DataError("model id2label keys must be class ids (integers)") from None


def _index(pairs: Iterable[tuple[str, int]]) -> dict[str, list[int]]:
    table: dict[str, list[int]] = {}
    for key, model_id in pairs:
        ids = table.setdefault(key, [])
        if model_id not in ids:
            ids.append(model_id)
    return table


def _by_names(names: Sequence[str], labels: dict[int, str], synonyms: bool) -> tuple[dict[int, int], list[str]]:
    """Map dataset names to model ids by full label (and, with `synonyms`, comma-separated synonyms).

    Returns:
        ({dataset index: model id}, [problems for unmapped classes]).
    """
    full = _index((_norm(label), i) for i, label in labels.items())
    syn = _index((_norm(part), i) for i, label in labels.items() for part in label.split(",") if part.strip())
    mapped: dict[int, int] = {}
    problems: list[str] = []
    for index, name in enumerate(names):
        key = _norm(name)
        hits = full.get(key) or (syn.get(key) if synonyms else None) or []
        if len(hits) == 1:
            mapped[index] = hits[0]
        elif hits:
            problems.append(f"'{name}' matches several model classes ({_listing(hits, 4)})")
        else:
            problems.append(f"'{name}'")
    return mapped, problems


def _by_number(names: Sequence[str], labels: dict[int, str]) -> dict[int, int] | None:
    """Map numeric names ("3", "LABEL_3") to the model class with the same number, when both sets are numeric."""
    ds_nums = [_NUMERIC.match(n.strip()) for n in names]
    model_nums = {i: _NUMERIC.match(label.strip()) for i, label in labels.items()}
    if not all(ds_nums) or not all(model_nums.values()) or len(names) != len(labels):
        return None
    number_to_id = {int(m.group(1)): i for i, m in model_nums.items()}
    wanted = [int(m.group(1)) for m in ds_nums]
    if sorted(wanted) != sorted(number_to_id) or len(set(wanted)) != len(wanted):
        return None
    return {index: number_to_id[number] for index, number in enumerate(wanted)}


def _by_wnid(names: Sequence[str], model_wnids: Mapping[int, str]) -> tuple[dict[int, int], list[str]]:
    table = _index((w.strip().lower(), i) for i, w in model_wnids.items())
    mapped, problems = {}, []
    for index, name in enumerate(names):
        hits = table.get(name.strip().lower(), [])
        if len(hits) == 1:
            mapped[index] = hits[0]
        else:
            problems.append(f"'{name}'" if not hits else f"'{name}' matches several model classes")
    return mapped, problems


def _as_id_map(model_wnids: Sequence[str] | Mapping[Any, str]) -> dict[int, str]:
    if isinstance(model_wnids, Mapping):
        return {int(k): str(v) for k, v in model_wnids.items()}
    return {i: str(w) for i, w in enumerate(model_wnids)}


def _fail(problems: list[str], n_names: int, labels: dict[int, str], what: str) -> DataError:
    generic = all(_NUMERIC.match(label.strip()) for label in labels.values())
    hint = " (the model's labels are generic LABEL_k/numbers: its config has no class names)" if generic else ""
    return DataError(
        f"{len(problems)} of {n_names} dataset classes match no {what}: {_listing(problems, 4)}; model labels "
        f"e.g. {_listing([repr(v) for v in list(labels.values())[:4]], 4)}{hint}"
    )


def _match(names: Sequence[str], labels: dict[int, str]) -> tuple[str, dict[int, int]]:
    """Try identical names, then synonyms, then numbers; return (method, mapping) or raise DataError."""
    mapped, problems = _by_names(names, labels, synonyms=False)
    if not problems:
        return "identical", mapped
    mapped, problems = _by_names(names, labels, synonyms=True)
    if not problems:
        return "synonym", mapped
    numeric = _by_number(names, labels)
    if numeric is not None:
        return "numeric", numeric
    raise _fail(problems, len(names), labels, "model label")


def map_labels(
    dataset_label_names: Sequence[str],
    id2label: Mapping[Any, Any],
    *,
    model_wnids: Sequence[str] | Mapping[Any, str] | None = None,
    wnid_names: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Build an explicit mapping from dataset class indices to model class ids.

    Methods, tried in order: "identical" names (case-, underscore- and space-insensitive); "synonym"
    (one of the comma-separated names of an ImageNet-style label such as "tench, Tinca tinca"; a full
    label match wins over a synonym match); "numeric" (same-size sets of numbers such as "0".."9" vs
    "0".."9" or LABEL_0..). When every dataset name is a WordNet id (n01440764), the ids are matched
    against `model_wnids` ("wnid"), or translated with `wnid_names` and then matched by name
    ("wnid-table+identical" / "wnid-table+synonym"); without either table this raises: there is no
    offline WordNet here and wnids are never guessed.

    Args:
        dataset_label_names: Class names, index = dataset class id.
        id2label: The model config's id2label (int or str keys).
        model_wnids: The model's wnid per class id (see wnids_from_config), if it carries them.
        wnid_names: A wnid -> readable name table provided with the dataset.

    Returns:
        JSON-able {"method", "dataset_to_model": {"<dataset index>": model id} (string keys so the dict
        survives JSON; see mapping_table), "restricted": dataset classes are a strict subset of the
        model's, "allowed_ids": sorted model ids when restricted else None, "unmapped": [],
        "n_dataset_classes", "n_model_classes", "examples": a few "dataset -> model" strings}.

    Raises:
        DataError: Some dataset class maps to no model class (a few are listed), to several, or two
            dataset classes map to the same model class.
    """
    names = [str(n) for n in dataset_label_names]
    labels = _int_keys(id2label)
    if not names:
        raise DataError("the dataset has no class names")
    if not labels:
        raise DataError("the model config has no id2label")
    if all(_WNID.match(n.strip()) for n in names):
        method, mapped = _map_wnids(names, labels, model_wnids, wnid_names)
    else:
        method, mapped = _match(names, labels)
    _check_injective(mapped, names)
    used = sorted(set(mapped.values()))
    restricted = len(used) < len(labels)
    return {
        "method": method,
        "dataset_to_model": {str(i): int(mapped[i]) for i in range(len(names))},
        "restricted": restricted,
        "allowed_ids": used if restricted else None,
        "unmapped": [],
        "n_dataset_classes": len(names),
        "n_model_classes": len(labels),
        "examples": [f"{names[i]} -> {mapped[i]} {labels[mapped[i]]}" for i in range(min(5, len(names)))],
    }


def _map_wnids(
    names: list[str],
    labels: dict[int, str],
    model_wnids: Sequence[str] | Mapping[Any, str] | None,
    wnid_names: Mapping[str, str] | None,
) -> tuple[str, dict[int, int]]:
    if not model_wnids and all(_WNID.match(label.strip()) for label in labels.values()):
        model_wnids = labels  # the model's labels are wnids themselves
    if model_wnids:
        mapped, problems = _by_wnid(names, _as_id_map(model_wnids))
        if problems:
            raise DataError(
                f"{len(problems)} of {len(names)} dataset wnids are not in the model's wnid list: "
                f"{_listing(problems, 4)}"
            )
        return "wnid", mapped
    if wnid_names:
        missing = [n for n in names if n not in wnid_names]
        if missing:
            raise DataError(f"the wnid->name table lacks {len(missing)} dataset classes: {_listing(missing, 4)}")
        method, mapped = _match([str(wnid_names[n]) for n in names], labels)
        return f"wnid-table+{method}", mapped
    raise DataError(
        f"dataset classes are WordNet ids ({_listing(names, 3)}) but the model config carries no wnid list; "
        "pass a wnid->name table (wnid_names) or use class-name folders"
    )


def _check_injective(mapped: dict[int, int], names: Sequence[str]) -> None:
    seen: dict[int, int] = {}
    for index, model_id in mapped.items():
        if model_id in seen:
            raise DataError(
                f"dataset classes '{names[seen[model_id]]}' and '{names[index]}' both map to model class {model_id}"
            )
        seen[model_id] = index


def wnids_from_config(config: Any) -> list[str] | None:
    """Return the model's WordNet id per class id when its config carries one, else None.

    Looks for a list or {id: wnid} attribute named wnids / label_wnids / imagenet_wnids, or an id2label
    whose labels are themselves wnids.
    """
    num = getattr(config, "num_labels", None)
    for attr in ("wnids", "label_wnids", "imagenet_wnids"):
        value = getattr(config, attr, None)
        if isinstance(value, Mapping):
            value = [value.get(i, value.get(str(i))) for i in range(len(value))]
        if isinstance(value, (list, tuple)) and value and (num is None or len(value) == num):
            if all(isinstance(w, str) and _WNID.match(w) for w in value):
                return list(value)
    labels = _int_keys(getattr(config, "id2label", {}) or {})
    if labels and all(_WNID.match(v.strip()) for v in labels.values()):
        return [labels[i] for i in sorted(labels)]
    return None


def mapping_table(mapping: Mapping[str, Any]) -> dict[int, int]:
    """Return map_labels' dataset_to_model as {dataset index (int): model id (int)}."""
    return {int(k): int(v) for k, v in mapping["dataset_to_model"].items()}


# ---------------------------------------------------------------- preprocessing


def _to_pil(image: Any, mode: str) -> Any:
    """Convert a decoded dataset image (PIL, array, tensor or {"bytes"/"path"}) to a PIL image in `mode`."""
    from PIL import Image

    if isinstance(image, Mapping):
        import io

        image = Image.open(io.BytesIO(image["bytes"])) if image.get("bytes") else Image.open(image["path"])
    if isinstance(image, torch.Tensor):
        image = image.numpy()
    if isinstance(image, (np.ndarray, list)):
        arr = np.asarray(image)
        if arr.ndim == 3 and arr.shape[0] in (1, 3, 4) and arr.shape[-1] not in (1, 3, 4):
            arr = np.moveaxis(arr, 0, -1)
        if arr.ndim == 3 and arr.shape[-1] == 1:
            arr = arr[..., 0]
        if arr.dtype != np.uint8:
            scale = 255.0 if arr.max(initial=0) <= 1.0 else 1.0
            arr = np.clip(arr.astype(np.float32) * scale, 0, 255).round().astype(np.uint8)
        image = Image.fromarray(arr)
    if not hasattr(image, "convert"):
        raise DataError(f"unsupported image value of type {type(image).__name__}")
    return image.convert(mode)


def _fallback_pixels(images: list, height: int, width: int) -> torch.Tensor:
    """Resize to (height, width), scale to [0, 1] and normalize with mean 0.5, std 0.5 (no processor)."""
    from PIL import Image

    arrays = []
    for image in images:
        arr = np.asarray(image.resize((width, height), Image.BILINEAR), dtype=np.float32) / 255.0
        arrays.append(arr[None] if arr.ndim == 2 else np.moveaxis(arr, -1, 0))
    return (torch.from_numpy(np.stack(arrays)) - 0.5) / 0.5


def _fit(pixels: torch.Tensor, channels: int, height: int, width: int, notes: set[str]) -> torch.Tensor:
    """Bring processor output to (N, channels, height, width), noting any conversion made."""
    got = pixels.shape[1]
    if got != channels:
        if got == 3 and channels == 1:
            pixels = pixels.mean(dim=1, keepdim=True)
        elif got == 1 and channels == 3:
            pixels = pixels.repeat(1, 3, 1, 1)
        else:
            raise DataError(f"processor gives {got} channels but the model expects {channels}")
        notes.add(f"processor output converted from {got} to {channels} channels")
    if tuple(pixels.shape[-2:]) != (height, width):
        notes.add(f"processor output {tuple(pixels.shape[-2:])} resized to {height}x{width}")
        pixels = F.interpolate(pixels, size=(height, width), mode="bilinear", align_corners=False, antialias=True)
    return pixels.contiguous()


def preprocess_images(
    images: Sequence[Any], processor: Any | None, shape: Mapping[str, Any], notes: set[str] | None = None
) -> torch.Tensor:
    """Turn decoded images into a float32 (N, C, H, W) tensor at `shape`.

    Images are converted to grayscale ("L") or "RGB" as the processor's image_mean expects (else as the
    model expects) and passed through the processor; without one they are converted to the model's
    channels, resized, scaled to [0, 1] and normalized with mean 0.5 and std 0.5. Processor output at
    another size or channel count than `shape` is adapted: RGB -> gray by channel mean, gray -> RGB by
    repetition, bilinear resize (each noted).

    Args:
        images: PIL images, arrays, tensors or datasets {"bytes", "path"} dicts.
        processor: A transformers image processor or None.
        shape: {"channels", "height", "width"}.
        notes: A set that collects notes on conversions made.

    Returns:
        float32 tensor (N, C, H, W).
    """
    notes = notes if notes is not None else set()
    channels, height, width = int(shape["channels"]), int(shape["height"]), int(shape["width"])
    modes = {1: "L", 3: "RGB", 4: "RGBA"}
    if channels not in modes:
        raise DataError(f"cannot build {channels}-channel inputs from images (supported: 1, 3, 4)")
    if processor is None:
        pil = [_to_pil(image, modes[channels]) for image in images]
        return _fit(_fallback_pixels(pil, height, width), channels, height, width, notes)
    mean = getattr(processor, "image_mean", None)
    fed = len(mean) if isinstance(mean, (list, tuple)) and len(mean) in modes else channels
    pil = [_to_pil(image, modes[fed]) for image in images]  # give the processor the channels it normalizes
    try:
        with quiet_hf():
            pixels = processor(images=pil, return_tensors="pt")["pixel_values"]
    except Exception as err:  # noqa: BLE001 - processors raise many types
        raise DataError(f"the image processor failed: {one_line(err)}") from None
    return _fit(torch.as_tensor(pixels).float(), channels, height, width, notes)


def _split_indices(n: int, subset: int, calibration: int, seed: int) -> tuple[np.ndarray, np.ndarray, str]:
    """Draw a seeded evaluation subset and a calibration set disjoint from it when the split allows."""
    rng = np.random.default_rng(seed)
    order = rng.permutation(n)
    n_eval = min(subset, n)
    eval_idx, rest = order[:n_eval], order[n_eval:]
    note = ""
    if subset > n:
        note = f"split has {n} samples (< subset {subset}): evaluating on all of them. "
    if len(rest) >= calibration:
        calib_idx = rest[:calibration]
    else:
        extra = min(calibration, n) - len(rest)
        calib_idx = np.concatenate([rest, rng.choice(eval_idx, size=extra, replace=False)])
        note += (
            f"only {len(rest)} samples outside the evaluation subset: {extra} calibration samples are "
            "drawn from the evaluation subset"
        )
        if calibration > n:
            note += f" (calibration capped at {n})"
    return np.sort(eval_idx), np.sort(calib_idx), note.strip()


def _encode(
    ds: Any,
    indices: np.ndarray,
    image_column: str,
    processor: Any | None,
    shape: Mapping[str, Any],
    notes: set[str],
    bar: Any,
) -> torch.Tensor:
    channels, height, width = int(shape["channels"]), int(shape["height"]), int(shape["width"])
    if len(indices) == 0:
        return torch.zeros(0, channels, height, width)
    images = ds.select_columns([image_column]).select(indices.tolist())
    chunks = []
    for start in range(0, len(images), BATCH):
        batch = images[start : start + BATCH][image_column]
        chunks.append(preprocess_images(batch, processor, shape, notes))
        bar.update(len(batch))
    return torch.cat(chunks)


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


def prepare_data(
    ds: Any,
    processor: Any | None,
    shape: Mapping[str, Any],
    mapping: Mapping[str, Any],
    *,
    out_path: str | Path,
    subset: int = 512,
    calibration: int = 64,
    seed: int = 0,
    image_column: str | None = None,
    label_column: str | None = None,
    calibration_ds: Any | None = None,
) -> dict[str, Any]:
    """Preprocess a seeded evaluation subset and a calibration set into tensors saved with safetensors.

    The evaluation subset holds `subset` samples (all when the split is smaller); the calibration set
    holds `calibration` samples drawn from the rest, or partly from the evaluation subset (with a note)
    when the split is too small. Labels are mapped to model class ids with `mapping`.

    Args:
        ds: A `datasets.Dataset`.
        processor: The model's image processor, or None (resize + [0, 1] + normalize 0.5/0.5).
        shape: {"channels", "height", "width"} from resolve_input_shape.
        mapping: The dict returned by map_labels for this dataset's label names.
        out_path: Where to write the .safetensors file (atomically).
        subset: Evaluation samples.
        calibration: Calibration samples.
        seed: Seed of both draws.
        image_column: Image column (detected when None).
        label_column: Label column (detected when None).
        calibration_ds: Another split (same columns and labels) to draw the calibration set from, so it never
            overlaps the evaluation subset even when the evaluated split is small.

    Returns:
        {"path", "n_eval", "n_calib", "image_column", "label_column", "label_names", "note", "shape",
        "seed", "calib_overlaps_eval", "sha256"}.

    Raises:
        DataError: Empty split, unlabelled samples, unusable images or columns.
    """
    from tqdm.auto import tqdm

    image_column, label_column = detect_columns(ds, image_column, label_column)
    n = len(ds)
    if n == 0:
        raise DataError("the split is empty")
    names = label_names(ds, label_column)
    eval_idx, calib_idx, note = _split_indices(n, subset, calibration, seed)
    calib_src = ds
    if calibration_ds is not None and len(calibration_ds) > 0:
        calib_src = calibration_ds
        eval_idx, _, eval_note = _split_indices(n, subset, 0, seed)
        _, calib_idx, _ = _split_indices(len(calibration_ds), 0, calibration, seed)
        note = f"{eval_note} calibration images drawn from another split ({len(calib_idx)} of {len(calibration_ds)})"
    table, to_index = mapping_table(mapping), _label_indexer(ds, label_column, names)
    eval_labels = _labels(ds, eval_idx, label_column, to_index, table)
    calib_labels = _labels(calib_src, calib_idx, label_column, _label_indexer(calib_src, label_column, names), table)
    notes: set[str] = set()
    total = len(eval_idx) + len(calib_idx)
    with tqdm(
        total=total,
        desc="preprocessing images",
        unit="img",
        file=sys.stderr,
        leave=False,
        disable=total < 256 or not sys.stderr.isatty(),
    ) as bar:
        eval_pixels = _encode(ds, eval_idx, image_column, processor, shape, notes, bar)
        calib_pixels = _encode(calib_src, calib_idx, image_column, processor, shape, notes, bar)
    note = " ".join([note, *sorted(notes)]).strip()
    tensors = {
        "eval_pixels": eval_pixels,
        "eval_labels": eval_labels,
        "calib_pixels": calib_pixels,
        "calib_labels": calib_labels,
        "eval_index": torch.from_numpy(eval_idx.astype(np.int64)),
        "calib_index": torch.from_numpy(calib_idx.astype(np.int64)),
    }
    shape_list = [int(shape["channels"]), int(shape["height"]), int(shape["width"])]
    _save(out_path, tensors, {"seed": seed, "shape": shape_list, "note": note})
    overlap = calib_src is ds and bool(np.intersect1d(eval_idx, calib_idx).size)
    logger.info("prepared %d evaluation and %d calibration images at %s", len(eval_idx), len(calib_idx), out_path)
    return {
        "path": str(out_path),
        "n_eval": len(eval_idx),
        "n_calib": len(calib_idx),
        "image_column": image_column,
        "label_column": label_column,
        "label_names": names,
        "note": note,
        "shape": shape_list,
        "seed": seed,
        "calib_overlaps_eval": overlap,
        "sha256": sha256_file(out_path),
    }


def _save(path: str | Path, tensors: dict[str, torch.Tensor], metadata: dict[str, Any]) -> None:
    """Write tensors with safetensors through a temp file and os.replace (same inputs, same bytes)."""
    from safetensors.torch import save

    # One metadata key: safetensors keeps metadata in a hash map, so several keys come out in random order.
    header = {"profiling_agent": json.dumps(metadata, sort_keys=True)}
    write_bytes_atomic(path, save({k: v.contiguous() for k, v in tensors.items()}, metadata=header))


def load_prepared(path: str | Path, with_indices: bool = False) -> dict[str, torch.Tensor]:
    """Load tensors written by prepare_data.

    Args:
        path: The .safetensors file.
        with_indices: Also return eval_index and calib_index (row numbers in the split).

    Returns:
        {"eval_pixels", "eval_labels", "calib_pixels", "calib_labels"} (+ the indices when asked).

    Raises:
        DataError: The file is missing or lacks a tensor.
    """
    from safetensors.torch import load_file

    path = Path(path)
    if not path.is_file():
        raise DataError(f"prepared data not found: {path}")
    tensors = load_file(str(path))
    keys = PREPARED_KEYS + (("eval_index", "calib_index") if with_indices else ())
    missing = [k for k in keys if k not in tensors]
    if missing:
        raise DataError(f"{path} lacks tensors: {_listing(missing)}")
    return {k: tensors[k] for k in keys}
