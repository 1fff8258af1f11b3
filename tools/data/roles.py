"""Where each role's images come from (validation, test, calibration), what subsets.json says, and what is judgeable."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from profiling_agent.tools.data.labels import map_labels, wnids_from_config
from profiling_agent.tools.data.sources import DataError, detect_columns, has_splits, label_names, load_split
from profiling_agent.tools.data.subsets import MIN_CALIBRATION, trial_rows

MIN_EVAL = 8  # fewest validation (and test) images a protocol judges on: the floor DatasetRef puts on subsets
MIN_CLASSES = 2  # one class: every prediction restricted to the dataset's classes is right, any model scores 100%
ROLES = ("validation", "test", "calibration")
WEAK_FLAG = "--allow-weak-eval"


@dataclass(frozen=True)
class RoleSources:
    """The loaded data each role is drawn from; roles drawn from the same data share one seeded permutation.

    Attributes:
        evaluated: The evaluated split (the whole dataset when it has no splits): validation rows, and test and
            calibration rows unless another split supplies them.
        test: Another split the test rows come from, or None (drawn from `evaluated`).
        calibration: Another split the calibration rows come from, or None (drawn from `evaluated`).
        splits: Role -> the split recorded in subsets.json; None for a dataset without splits.
        note: What the policy decided, for people ("" when nothing needs saying).
    """

    evaluated: Any
    test: Any | None
    calibration: Any | None
    splits: dict[str, str | None] = field(default_factory=dict)
    note: str = ""

    @property
    def whole(self) -> bool:
        """True when the dataset has no splits: every role is rows of the same data."""
        return self.splits.get("validation") is None


def _optional(ref: str, split: str, loader: Callable[[str, str | None], Any]) -> Any | None:
    """Load `split` when it exists and has rows, else None (a dataset without that split simply has none)."""
    try:
        ds = loader(ref, split)
    except Exception:  # noqa: BLE001 - DataError for an unknown split, a hub error for a missing one
        return None
    return ds if len(ds) else None


def role_sources(
    dataset: Any, *, loader: Callable[[str, str | None], Any] = load_split, splits: bool | None = None
) -> RoleSources:
    """Decide where validation, test and calibration images come from, so that no two roles share an image.

    A dataset without splits (a save_to_disk `Dataset`, an imagefolder of class folders) reads the same rows
    under any split name: every role is drawn from it at once, from one seeded permutation (`draw_subsets`), and
    subsets.json records split null and has_splits false. With splits: validation from `split`; test from
    `test_split` (or `test` beside `validation`) when that split exists, else from `split`; calibration from
    `train` when `split` cannot hold every role and no other role draws from `train`, else from `split`.
    Recovery trains on rows no role drew (`train_stream.find_train_source`).

    Args:
        dataset: The run's `DatasetRef` (ref, split, test_split, train_split, subset, test_subset, calibration).
        loader: (ref, split) -> `datasets.Dataset`; raises for a split that does not exist.
        splits: Whether the dataset has splits (default: `sources.has_splits`).

    Raises:
        DataError: The evaluated split, or a test split the user named, does not exist.
    """
    ref, split = dataset.ref, dataset.split
    if not (has_splits(ref) if splits is None else splits):
        named = [f"--{k.replace('_', '-')} {v}" for k in ("test_split", "train_split") if (v := getattr(dataset, k))]
        note = f"{ref} has no splits: validation, test, calibration and training images are disjoint rows of it all"
        if named:
            note += f" ({', '.join(named)} cannot apply)"
        return RoleSources(loader(ref, None), None, None, dict.fromkeys(ROLES), note)
    evaluated = loader(ref, split)
    test_split = dataset.test_split or ("test" if split == "validation" else None)
    test = None
    if test_split and test_split != split:
        test = loader(ref, test_split) if dataset.test_split else _optional(ref, test_split, loader)
        test = test if test is not None and len(test) else None
    here = dataset.subset + dataset.calibration + (dataset.test_subset if test is None else 0)
    small = len(evaluated) < here and "train" not in (split, test_split if test is not None else None)
    calibration = _optional(ref, "train", loader) if small else None  # never a split another role draws from
    names = {
        "validation": split,
        "test": test_split if test is not None else split,
        "calibration": "train" if calibration is not None else split,
    }
    return RoleSources(evaluated, test, calibration, names)


def subsets_record(ref: str, seed: int, sources: RoleSources, rows: Mapping[str, Any]) -> dict[str, Any]:
    """Build subsets.json: the dataset, whether it has splits, each role's split and sorted rows, and the trial slice.

    `trial` names the validation rows every plan trial is judged on (`subsets.trial_rows`): a seeded subset of the
    validation rows, so disjoint from the calibration and test rows as validation is.

    Args:
        ref: The dataset reference.
        seed: Seed of the draws.
        sources: Where each role came from.
        rows: Role -> row indices (validation, test, calibration).
    """
    record: dict[str, Any] = {"dataset": ref, "seed": seed, "has_splits": not sources.whole}
    for role in ROLES:
        record[role] = {"split": sources.splits[role], "indices": [int(i) for i in np.asarray(rows[role])]}
    for i, a in enumerate(ROLES):  # what the console calls disjoint is checked, not assumed
        for b in ROLES[i + 1 :]:
            shared = set(record[a]["indices"]) & set(record[b]["indices"])
            if record[a]["split"] == record[b]["split"] and shared:
                raise RuntimeError(f"{a} and {b} images share {len(shared)} rows of {ref}: a bug, please report it")
    trial = trial_rows(np.asarray(rows["validation"]), seed)  # judges every plan trial: a slice of validation
    record["trial"] = {"split": sources.splits["validation"], "of": "validation", "indices": [int(i) for i in trial]}
    return record


def weak_reasons(counts: Mapping[str, int], classes: Mapping[str, int], wanted: Mapping[str, int]) -> list[str]:
    """Say why the drawn subsets cannot judge a compressed model ([] when they can).

    Args:
        counts: Role -> images drawn.
        classes: Role -> distinct classes among the drawn images (validation and test).
        wanted: Role -> images asked for (0: the role is not used).
    """
    reasons = []
    for role, floor in (("validation", MIN_EVAL), ("test", MIN_EVAL), ("calibration", MIN_CALIBRATION)):
        if wanted.get(role, 0) and counts.get(role, 0) < floor:
            reasons.append(f"{counts.get(role, 0)} {role} images (at least {floor} needed)")
    for role in ("validation", "test"):
        if counts.get(role, 0) and classes.get(role, 0) < MIN_CLASSES:
            reasons.append(f"{classes.get(role, 0)} class among the {role} images (any model scores 100%)")
    return reasons


def check_judgeable(reasons: list[str], allow_weak: bool) -> str:
    """Refuse data the protocol cannot judge (DataError, one line), or return the loud warning when forced.

    Returns:
        "" when nothing is weak, else the warning to put in the history and on the console.

    Raises:
        DataError: Something is weak and `allow_weak` is False.
    """
    if not reasons:
        return ""
    what = "; ".join(reasons)
    if not allow_weak:
        raise DataError(f"the dataset cannot judge a compressed model: {what} (pass {WEAK_FLAG} to run anyway)")
    return f"WARNING: accuracy results mean little: {what} ({WEAK_FLAG})"


def check_classes(ds: Any, label_column: str, allow_weak: bool) -> str:
    """Refuse a split whose labelled rows hold fewer than MIN_CLASSES classes, before any model work is done.

    Returns:
        "" or the warning (see `check_judgeable`).

    Raises:
        DataError: One class (or none) and `allow_weak` is False.
    """
    from datasets import ClassLabel  # lazy: datasets; nodes.acquire loads this module without it

    present = {v for v in ds.unique(label_column) if v is not None and v != -1}
    if len(present) >= MIN_CLASSES:
        return ""
    feature = ds.features[label_column]
    names = [feature.int2str(int(v)) if isinstance(feature, ClassLabel) else str(v) for v in present]
    shown = f" ({names[0]!r})" if names else ""
    return check_judgeable([f"{len(present)} class{shown} in {len(ds)} images (any model scores 100%)"], allow_weak)


def judge_subsets(tensors: Mapping[str, Any], ds_ref: Any, sources: RoleSources) -> tuple[dict[str, Any], str]:
    """Check the drawn subsets can judge a model (enough images and classes per role) and describe them.

    Args:
        tensors: What prepare_images wrote, loaded with row numbers (`<part>_index`, `<part>_labels`).
        ds_ref: The run's DatasetRef (sizes asked for, seed, allow_weak_eval).
        sources: Where each role's rows came from.

    Returns:
        The subsets.json record and the weak-evaluation note ('' when every role can judge). A set that cannot
        judge a model raises DataError unless the run allows weak evaluation.
    """
    from profiling_agent.tools.data.prepare import (
        PARTS,
        ROLE_NAMES,
    )  # lazy: torch; nodes.acquire loads this module without it

    rows = {ROLE_NAMES[p]: tensors[f"{p}_index"].numpy() for p in PARTS}
    classes = {ROLE_NAMES[p]: len(set(tensors[f"{p}_labels"].tolist())) for p in PARTS}
    counts = {role: len(r) for role, r in rows.items()}
    wanted = {"validation": 1, "test": ds_ref.test_subset, "calibration": ds_ref.calibration}
    weak = check_judgeable(weak_reasons(counts, classes, wanted), ds_ref.allow_weak_eval)
    return subsets_record(ds_ref.ref, ds_ref.seed, sources, rows), weak


def dataset_labels(dataset: Any, config: Any, ds_ref: Any) -> tuple[dict[str, Any], str]:
    """Find the image and label columns, refuse a one-class set, and map the dataset's labels to the model's ids.

    Args:
        dataset: The loaded split.
        config: The model's config (id2label, ImageNet wnids).
        ds_ref: The run's DatasetRef (column names given, allow_weak_eval).

    Returns:
        The labels record (mapping, columns, the dataset's label names) and the weak-evaluation note.
    """
    image_col, label_col = detect_columns(dataset, ds_ref.image_column, ds_ref.label_column)
    names = label_names(dataset, label_col)
    weak = check_classes(dataset, label_col, ds_ref.allow_weak_eval)  # one class: refused before any work
    id2label = {int(k): str(v) for k, v in (config.id2label or {}).items()}
    mapping = map_labels(names, id2label, model_wnids=wnids_from_config(config))
    return {**mapping, "image_column": image_col, "label_column": label_col, "dataset_label_names": names}, weak
