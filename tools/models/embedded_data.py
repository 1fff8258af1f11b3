"""The embedded offline dataset: scikit-learn's digits as a Hugging Face dataset, built once and cached."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from PIL import Image

from profiling_agent.tools.hub import quiet_hf
from profiling_agent.tools.io import atomic_dir

logger = logging.getLogger(__name__)

DATASET_NAME = "digits"
IMAGE_SIZE = 32  # digits are 8x8; stored upscaled (bilinear) to 32x32 grayscale PNGs
LABEL_NAMES = [str(i) for i in range(10)]
SPLIT_SEED = 0  # seed of the stratified 80/20 train/test split
TEST_FRACTION = 0.2
_DATASET_MARKER = "dataset_dict.json"


def cache_dir() -> Path:
    """Return the cache root: $PROFILING_AGENT_CACHE, else ~/.cache/profiling-agent."""
    env = os.environ.get("PROFILING_AGENT_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "profiling-agent"


@contextlib.contextmanager
def file_lock(name: str) -> Iterator[None]:
    """Hold an exclusive inter-process lock under cache_dir()/locks (no-op where fcntl is missing)."""
    lock_dir = cache_dir() / "locks"
    lock_dir.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl  # lazy: probe; fcntl is POSIX-only
    except ImportError:  # pragma: no cover - Windows: atomic replace alone keeps readers safe
        yield
        return
    with open(lock_dir / f"{name}.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


# ---------------------------------------------------------------- dataset


def dataset_path() -> Path:
    """Return where the embedded digits DatasetDict lives (it may not be built yet)."""
    return cache_dir() / "datasets" / DATASET_NAME


def _digit_images(images: np.ndarray) -> list:
    """Turn 8x8 arrays in 0..16 into 32x32 grayscale PIL images."""
    out = []
    for img in images:
        small = Image.fromarray(np.clip(img * (255.0 / 16.0), 0, 255).round().astype(np.uint8), mode="L")
        out.append(small.resize((IMAGE_SIZE, IMAGE_SIZE), Image.Resampling.BILINEAR))
    return out


def _build_dataset(target: Path) -> None:
    """Write the digits DatasetDict (train/test, stratified 80/20, seeded) to `target`."""
    from datasets import (
        ClassLabel,
        Dataset,
        DatasetDict,
        Features,
    )  # lazy: datasets; tools.data.sources loads this module without it
    from datasets import Image as ImageFeature  # lazy: datasets; tools.data.sources loads this module without it
    from sklearn.datasets import load_digits  # lazy: sklearn; tools.data.sources loads this module without it
    from sklearn.model_selection import (
        train_test_split,
    )  # lazy: sklearn; tools.data.sources loads this module without it

    digits = load_digits()
    idx = np.arange(len(digits.target))
    train_idx, test_idx = train_test_split(
        idx, test_size=TEST_FRACTION, stratify=digits.target, random_state=SPLIT_SEED
    )
    features = Features({"image": ImageFeature(), "label": ClassLabel(names=LABEL_NAMES)})

    def split(ids: np.ndarray) -> Dataset:
        ids = np.sort(ids)
        return Dataset.from_dict(
            {"image": _digit_images(digits.images[ids]), "label": digits.target[ids].astype(int).tolist()},
            features=features,
        )

    with atomic_dir(target) as tmp, quiet_hf():
        DatasetDict({"train": split(train_idx), "test": split(test_idx)}).save_to_disk(str(tmp))


def ensure_dataset(force: bool = False) -> Path:
    """Build the embedded digits dataset once and return its save_to_disk folder.

    Args:
        force: Rebuild even when a complete copy is cached.

    Returns:
        The folder of a `datasets.DatasetDict` with splits train (1,437) and test (360), columns
        "image" (32x32 grayscale) and "label" (ClassLabel "0".."9").
    """
    target = dataset_path()
    if not force and (target / _DATASET_MARKER).exists():
        return target
    with file_lock(f"dataset-{DATASET_NAME}"):
        if force or not (target / _DATASET_MARKER).exists():  # another process may have built it meanwhile
            logger.info("building the embedded digits dataset in %s", target)
            _build_dataset(target)
    return target
