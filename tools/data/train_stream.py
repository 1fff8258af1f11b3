"""Training images for recovery: a split, minus every image that selects, reports or calibrates, streamed by step."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F

from profiling_agent.tools import run_layout
from profiling_agent.tools.data.labels import mapping_table
from profiling_agent.tools.data.preprocess import preprocess_images
from profiling_agent.tools.data.sources import label_indexer, label_names, load_split
from profiling_agent.tools.io import read_json

if TYPE_CHECKING:  # types only: a distillation rank imports this module, and state's schemas cost it ~1 CPU-s
    from profiling_agent.state import DataRef, DatasetRef, LabelMap

MIN_TRAIN_IMAGES = 32  # fewer usable images than this: no training source (reconstruction only)


@dataclass
class TrainSource:
    """The rows of one split that recovery may train on.

    Attributes:
        ds: The split (a `datasets.Dataset`, or anything with `select` and `__getitem__` by column).
        split: Its name (None: the dataset has no splits).
        rows: Row indices recovery may read, sorted; never a validation, test or calibration row of that split.
        excluded: How many rows of the split were left out, by role.
        image_column: Image column.
        label_column: Label column.
        note: Where the images come from, for people.
    """

    ds: Any
    split: str | None
    rows: np.ndarray
    image_column: str
    label_column: str
    excluded: dict[str, int] = field(default_factory=dict)
    note: str = ""


def _same_data(a: Any, b: Any) -> bool:
    """Return True when two loaded splits are the same data (a plain Dataset ignores the split name)."""
    fa, fb = getattr(a, "_fingerprint", None), getattr(b, "_fingerprint", None)
    return a is b or (fa is not None and fa == fb)


def usable_rows(n: int, split: str | None, roles: Mapping[str, Mapping[str, Any]]) -> tuple[np.ndarray, dict[str, int]]:
    """Return the rows of an n-row split outside every role (validation, test, calibration) drawn from it.

    Args:
        n: Rows in the split.
        split: The split's name (None: a dataset without splits, whose roles all record split None).
        roles: subsets.json's roles: {role: {"split": name, "indices": [...]}}.
    """
    mask = np.ones(n, dtype=bool)
    excluded = {}
    for role, entry in roles.items():
        if entry.get("split") == split:
            idx = np.asarray(entry.get("indices") or [], dtype=np.int64)
            idx = idx[(idx >= 0) & (idx < n)]
            mask[idx] = False
            excluded[role] = int(len(idx))
    return np.flatnonzero(mask), excluded


def run_train_source(run_path: str | Path, data: DataRef | None, dataset: DatasetRef, labels: LabelMap) -> Any:
    """Find the images a run's distillation may train on (never a validation, test or calibration image), or None.

    The subsets are read from the run's `subsets.json` (or the file `data` names); recovery and the planner's trials
    both call this, so they train on the same rows.
    """
    subsets = read_json(Path(run_path) / (data.subsets if data else run_layout.SUBSETS))
    return find_train_source(
        dataset.ref,
        dataset.split,
        subsets,
        image_column=labels.image_column,
        label_column=labels.label_column,
        train_split=dataset.train_split,
    )


def find_train_source(
    ref: str,
    evaluated_split: str,
    subsets: Mapping[str, Any],
    *,
    image_column: str,
    label_column: str,
    train_split: str | None = None,
    loader: Callable[[str, str | None], Any] = load_split,
) -> TrainSource | None:
    """Pick where recovery trains: `train_split`, else a `train` split, else the evaluated split's spare images.

    Every row that a validation, test or calibration subset drew from the chosen split is excluded. None when
    fewer than MIN_TRAIN_IMAGES rows remain.

    Args:
        ref: The dataset reference.
        evaluated_split: The split the validation images come from.
        subsets: The run's subsets.json ({"validation"|"test"|"calibration": {"split", "indices"}}).
        image_column: Image column.
        label_column: Label column.
        train_split: A split the user named (an error when it does not exist).
        loader: Loads (ref, split) -> dataset; raises when the split does not exist.
    """
    roles = {k: v for k, v in subsets.items() if k in ("validation", "test", "calibration") and isinstance(v, Mapping)}
    if subsets.get("has_splits") is False:  # one undivided dataset: every split name reads the same rows
        return _spare_rows(loader(ref, None), None, roles, image_column, label_column)
    evaluated = loader(ref, evaluated_split)
    candidates: list[tuple[str, Any]] = []
    if train_split:
        candidates.append((train_split, loader(ref, train_split)))
    elif evaluated_split != "train":
        try:
            candidates.append(("train", loader(ref, "train")))
        except Exception:  # noqa: BLE001 - no train split: fall back to the evaluated split's spare images
            pass
    candidates.append((evaluated_split, evaluated))
    for split, ds in candidates:
        found = _spare_rows(
            ds, evaluated_split if _same_data(ds, evaluated) else split, roles, image_column, label_column
        )
        if found is not None or train_split:
            return found
    return None


def _spare_rows(
    ds: Any, name: str | None, roles: Mapping[str, Mapping[str, Any]], image_column: str, label_column: str
) -> TrainSource | None:
    """Return the rows of `ds` (split `name`) no role drew, or None when fewer than MIN_TRAIN_IMAGES remain."""
    rows, excluded = usable_rows(len(ds), name, roles)
    if len(rows) < MIN_TRAIN_IMAGES:
        return None
    spare = " (images outside the validation, test and calibration subsets)" if excluded else ""
    where = f"split '{name}'" if name is not None else "the dataset (it has no splits)"
    note = f"{len(rows)} images of {where}{spare}"
    return TrainSource(ds, name, rows, image_column, label_column, excluded, note)


def batch_rows(rows: np.ndarray, step: int, batch: int, seed: int) -> np.ndarray:
    """Return the rows of training step `step`: consecutive slices of one seeded permutation per epoch."""
    n = len(rows)
    positions = np.arange(step * batch, (step + 1) * batch)
    out = np.empty(batch, dtype=np.int64)
    for epoch in np.unique(positions // n):
        order = np.random.default_rng([seed, int(epoch)]).permutation(n)
        hit = positions // n == epoch
        out[hit] = rows[order[positions[hit] % n]]
    return out


def augment(
    pixels: torch.Tensor,
    generator: torch.Generator,
    flip: bool,
    scale: tuple[float, float],
    start: int = 0,
    total: int | None = None,
) -> torch.Tensor:
    """Random resized crop (area fraction in `scale`, aspect kept) and, when `flip`, horizontal flips, per image.

    `pixels` may be images start.. of a `total`-image batch (one rank's slice): the random numbers of every image
    of the batch are drawn in order, so each image of the slice is augmented as in the whole batch.
    """
    n, _, height, width = pixels.shape
    out = torch.empty_like(pixels)
    for i in range(n if total is None else total):
        area = float(torch.empty(1).uniform_(*scale, generator=generator))
        h, w = max(1, round(height * area**0.5)), max(1, round(width * area**0.5))
        top = int(torch.randint(0, height - h + 1, (1,), generator=generator))
        left = int(torch.randint(0, width - w + 1, (1,), generator=generator))
        flipped = flip and bool(torch.rand(1, generator=generator) < 0.5)
        if start <= i < start + n:
            crop = pixels[i - start : i - start + 1, :, top : top + h, left : left + w]
            image = F.interpolate(crop, size=(height, width), mode="bilinear", align_corners=False)
            out[i - start] = image[0].flip(-1) if flipped else image[0]
    return out


class TrainBatches:
    """Decode, preprocess and (optionally) augment the batch of any step on demand: nothing is materialized.

    The batch of step s depends only on (seed, s), so a resumed run reads exactly the batches it would have read.
    """

    def __init__(
        self,
        source: TrainSource,
        processor: Any,
        shape: Mapping[str, Any],
        mapping: Mapping[str, Any],
        *,
        batch: int,
        seed: int = 0,
        augmentation: bool = True,
    ) -> None:
        self.source, self.processor, self.shape = source, processor, dict(shape)
        self.batch, self.seed, self.augmentation = batch, seed, augmentation
        self.table = mapping_table(mapping)
        names = label_names(source.ds, source.label_column)
        self.to_index = label_indexer(source.ds, source.label_column, names)
        self.flip = int(self.shape["channels"]) == 3  # natural RGB images; digits and other grayscale never flip
        self.scale = (0.6, 1.0) if self.flip else (0.8, 1.0)

    def rows(self, step: int) -> np.ndarray:
        """Return the split rows step `step` reads."""
        return batch_rows(self.source.rows, step, min(self.batch, len(self.source.rows)), self.seed)

    def __call__(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Return (pixels, model label ids; -1 for unlabelled or unmapped) of step `step`."""
        picked = self.source.ds.select(self.rows(step).tolist())
        images = picked[self.source.image_column]
        labels = [self.table.get(self.to_index(v), -1) for v in picked[self.source.label_column]]
        pixels = preprocess_images(images, self.processor, self.shape)
        if self.augmentation:
            generator = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
            pixels = augment(pixels, generator, self.flip, self.scale)
        return pixels, torch.tensor(labels, dtype=torch.long)


def describe(source: TrainSource | None, roles: Sequence[str] = ("validation", "test", "calibration")) -> str:
    """Say in one line where recovery trains and what it leaves out."""
    if source is None:
        return "no training images (every image of the split selects, reports or calibrates)"
    left = ", ".join(f"{source.excluded[r]} {r}" for r in roles if source.excluded.get(r))
    return source.note + (f"; left out: {left}" if left else "")
