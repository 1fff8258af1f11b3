"""Seeded, disjoint-by-construction image subsets: validation (selects), test (reports), calibration (probes)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MIN_CALIBRATION = 4  # a probe needs a few images; fewer makes its damage scores meaningless


@dataclass(frozen=True)
class Subsets:
    """Row indices of each role, each sorted; roles drawn from the same split never share a row.

    Attributes:
        val: Validation rows of the evaluated split: the loop, the planners and the selection rule see these.
        test: Held-out rows: of the evaluated split, or of `test_split` when the test images come from another.
        calib: Calibration rows: of the evaluated split, or of the calibration split when they come from another.
        note: What had to give when the split was too small, for people.
    """

    val: np.ndarray
    test: np.ndarray
    calib: np.ndarray
    note: str


def draw_subsets(
    n: int,
    *,
    val: int,
    test: int = 0,
    calib: int = 0,
    seed: int = 0,
    test_rows: int | None = None,
    calib_rows: int | None = None,
    val_all: bool = False,
) -> Subsets:
    """Draw validation, test and calibration rows from one seeded permutation, so they are disjoint by construction.

    The validation rows come first in the permutation (so a validation subset of the same size and seed is the
    same images whatever else is drawn), then the test rows, then the calibration rows. When the split cannot
    hold all three, the test set keeps at least half of it and calibration at least a tenth (and
    MIN_CALIBRATION images); the note says so.

    Args:
        n: Rows in the evaluated split.
        val: Validation images wanted.
        test: Test images wanted (0: none).
        calib: Calibration images wanted (0: none).
        seed: Seed of every draw.
        test_rows: Rows of another split the test images come from (None: the evaluated split).
        calib_rows: Rows of another split the calibration images come from (None: the evaluated split).
        val_all: Validate on every row the test and calibration subsets leave (`val` is ignored).
    """
    if n < 1:
        raise ValueError("the split is empty")
    val = n if val_all else val
    order = np.random.default_rng(seed).permutation(n)
    test_here = test if test_rows is None else 0
    calib_here = calib if calib_rows is None else 0
    test_min = min(test_here, n // 2)
    calib_min = min(calib_here, max(MIN_CALIBRATION, n // 10))
    n_val = max(0, min(val, n - test_min - calib_min))
    n_test = max(0, min(test_here, n - n_val - calib_min))
    n_calib = max(0, min(calib_here, n - n_val - n_test))
    notes = []
    if n_val < val and not val_all:
        notes.append(f"the split has {n} images: {n_val} validation (of {val} asked)")
    if n_test < test_here:
        notes.append(f"{n_test} test images (of {test_here} asked)")
    if n_calib < calib_here:
        notes.append(f"{n_calib} calibration images (of {calib_here} asked)")
    val_idx = order[:n_val]
    test_idx = order[n_val : n_val + n_test]
    calib_idx = order[n_val + n_test : n_val + n_test + n_calib]
    if test_rows is not None:
        test_idx = np.random.default_rng(seed + 1).permutation(test_rows)[: min(test, test_rows)]
    if calib_rows is not None:
        calib_idx = np.random.default_rng(seed + 2).permutation(calib_rows)[: min(calib, calib_rows)]
    return Subsets(np.sort(val_idx), np.sort(test_idx), np.sort(calib_idx), "; ".join(notes))


TRIAL_MAX = 256  # the trial slice: at most this many validation images...
TRIAL_FRACTION = 4  # ...and at most a quarter of them
TRIAL_MIN = 128  # but at least this many (or every validation image when there are fewer): 0 +- 1.5 pp


def trial_size(n_val: int) -> int:
    """Return the trial slice's size: min(TRIAL_MAX, a quarter of the validation rows), at least TRIAL_MIN (or all)."""
    return min(n_val, max(TRIAL_MIN, min(TRIAL_MAX, n_val // TRIAL_FRACTION)))


def trial_rows(val_rows: np.ndarray, seed: int) -> np.ndarray:
    """Return the trial slice: a seeded subset of the validation rows (sorted), the images trials are judged on.

    The slice is drawn from the validation rows alone (never training, calibration or test images), so a plan's
    predicted loss comes from images the model never trained on, and the held-out test rows stay untouched.
    """
    val_rows = np.sort(np.asarray(val_rows))
    pick = np.random.default_rng(seed + 3).permutation(len(val_rows))[: trial_size(len(val_rows))]
    return val_rows[np.sort(pick)]
