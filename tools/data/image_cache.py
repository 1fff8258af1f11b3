"""Keep a role's resized uint8 images on disk in small shards, so later accuracy passes skip decoding and resizing."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from profiling_agent.tools.io import write_atomic

logger = logging.getLogger(__name__)
BUDGET_ENV = "PROFILING_AGENT_IMAGE_CACHE_MB"  # largest cache of one role in MB (0: never cache)
DEFAULT_BUDGET_MB = 8192  # large enough for ImageNet-1K's whole validation split at 224x224 in uint8
SHARD_BYTES = 32 * 2**20  # a shard file holds at most this many bytes of pixels (and at least one image)
MAX_SHARD_IMAGES = 1024
FORMAT = 1  # bumped when the stored layout changes, so old shards are not read


def budget_mb() -> float:
    """Return the cache budget per role from $PROFILING_AGENT_IMAGE_CACHE_MB (default 8192; bad values: default)."""
    try:
        return max(0.0, float(os.environ.get(BUDGET_ENV, DEFAULT_BUDGET_MB)))
    except ValueError:
        return float(DEFAULT_BUDGET_MB)


def cache_key(rows: np.ndarray, processor: Any | None, shape: Mapping[str, Any]) -> str:
    """Return a short digest of what the cached pixels depend on: the rows, the processor's settings, the shape."""
    settings = processor.to_dict() if processor is not None and hasattr(processor, "to_dict") else repr(processor)
    blob = json.dumps(
        {
            "format": FORMAT,
            "rows": hashlib.sha256(np.ascontiguousarray(rows, np.int64).tobytes()).hexdigest(),
            "processor": settings,
            "shape": dict(shape),
        },
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


class ShardCache:
    """`count` images of one shape (uint8, (C, H, W)) stored as .npy shards of `per_shard` images in `folder`.

    A shard is written once, atomically (tools.io.write_atomic without fsync: it is only a cache), by whoever decodes it
    first; a missing, partial or unreadable shard is simply decoded again. Only the shard being read is held in
    memory.
    """

    def __init__(self, folder: str | Path, count: int, image_shape: tuple[int, ...]) -> None:
        self.folder, self.count, self.image_shape = Path(folder), int(count), tuple(int(d) for d in image_shape)
        per_image = max(1, int(np.prod(self.image_shape)))
        self.per_shard = max(1, min(MAX_SHARD_IMAGES, SHARD_BYTES // per_image))

    @classmethod
    def open(cls, root: str | Path, role: str, key: str, count: int, image_shape: tuple[int, ...]) -> ShardCache:
        """Return the cache of `role` under `root`, removing the role's shards of other keys (stale settings)."""
        root = Path(root)
        if root.is_dir():
            for old in root.glob(f"{role}-*"):
                if old.name != f"{role}-{key}":
                    shutil.rmtree(old, ignore_errors=True)
        return cls(root / f"{role}-{key}", count, image_shape)

    def span(self, shard: int) -> range:
        """Return the positions (0..count-1) `shard` holds."""
        return range(shard * self.per_shard, min(self.count, (shard + 1) * self.per_shard))

    def path(self, shard: int) -> Path:
        """Return the shard's file."""
        return self.folder / f"{shard:06d}.npy"

    def load(self, shard: int) -> np.ndarray | None:
        """Return the shard's images, or None when it is missing or not what it should be."""
        path = self.path(shard)
        if not path.is_file():
            return None
        try:
            arr = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as err:
            logger.warning("image cache shard %s unreadable (%s): decoding it again", path, err)
            return None
        if arr.dtype != np.uint8 or arr.shape != (len(self.span(shard)), *self.image_shape):
            logger.warning("image cache shard %s holds %s %s: decoding it again", path, arr.dtype, arr.shape)
            return None
        return arr

    def save(self, shard: int, arr: np.ndarray) -> None:
        """Store the shard's images (uint8, len(span) images), atomically."""
        expected = (len(self.span(shard)), *self.image_shape)
        if arr.dtype != np.uint8 or arr.shape != expected:
            raise ValueError(f"shard {shard} must be uint8 {expected}, got {arr.dtype} {arr.shape}")
        try:  # written in place (no copy into a buffer first), not fsynced: a lost shard is only decoded again
            write_atomic(self.path(shard), lambda handle: np.save(handle, arr, allow_pickle=False), durable=False)
        except OSError as err:  # a full disk or read-only run folder costs speed, not the run
            logger.warning("image cache shard %s not written (%s): it will be decoded again", self.path(shard), err)

    def nbytes(self) -> int:
        """Bytes all shards would take (the cache's size once every image was read)."""
        return self.count * int(np.prod(self.image_shape))


__all__ = ["BUDGET_ENV", "ShardCache", "budget_mb", "cache_key"]
