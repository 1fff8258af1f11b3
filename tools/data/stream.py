"""Stream preprocessed image batches from dataset rows: a run keeps row numbers and labels, never float pixels."""

from __future__ import annotations

import logging
import os
import queue
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from profiling_agent.tools import run_layout
from profiling_agent.tools.data import prepare
from profiling_agent.tools.data.image_cache import ShardCache, budget_mb, cache_key
from profiling_agent.tools.data.prepare import PARTS, raw_labels_digest
from profiling_agent.tools.data.preprocess import Preprocessing
from profiling_agent.tools.data.sources import DataError, load_split
from profiling_agent.tools.io import read_json
from profiling_agent.tools.models.artifact_load import load_processor

logger = logging.getLogger(__name__)
WORKERS_ENV = "PROFILING_AGENT_DATA_WORKERS"  # DataLoader worker processes that decode ahead (default 0: a thread)
SPLIT_CHECK = 4  # first images of a stream on which the two-step preprocessing is compared with the processor
CACHE_FOLDER = "image_cache"  # beside the prepared data file: RUN/THREAD/image_cache/<role>-<key>/NNNNNN.npy
ROLES = {"eval": "validation", "test": "test", "calib": "calibration"}  # prepare_images' parts -> subsets.json roles


def data_workers() -> int:
    """Return the DataLoader worker processes asked for in $PROFILING_AGENT_DATA_WORKERS (0 when unset or bad)."""
    try:
        return max(0, int(os.environ.get(WORKERS_ENV, "0")))
    except ValueError:
        return 0


@dataclass(frozen=True)
class StreamOptions:
    """How a stream reads its images: who decodes ahead, and where the uint8 cache lives.

    Attributes:
        workers: DataLoader worker processes that decode ahead (None: $PROFILING_AGENT_DATA_WORKERS; 0: a thread).
        cache_dir: Folder of the uint8 shard cache (None: not cached).
    """

    workers: int | None = None
    cache_dir: str | Path | None = None


def cache_folder(path: str | Path) -> Path:
    """Return the uint8 image cache folder of a prepared data file: `image_cache/` beside it."""
    return Path(path).parent / CACHE_FOLDER


class _Chunks(torch.utils.data.Dataset):
    """Batch i of a stream as one item, so a DataLoader keeps the order and its workers decode ahead."""

    def __init__(self, stream: ImageStream, size: int) -> None:
        self.stream, self.size = stream, size

    def __len__(self) -> int:
        return (len(self.stream) + self.size - 1) // self.size

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.stream.pixels(range(i * self.size, min(len(self.stream), (i + 1) * self.size)))


class ImageStream:
    """One role's images (validation, test or calibration), decoded and preprocessed batch by batch on demand.

    The order is the order of `rows` (sorted row numbers drawn by a seeded permutation), the same on every pass,
    so the baseline and every candidate see the same images in the same order. Only the current batch (and the
    one decoded ahead) is ever held as float32. Slicing (`stream[a:b]`) returns those images as a tensor, so code
    written for a pixel tensor (`len`, slices, `predict`) works on a stream.

    With a `cache_dir`, the images are decoded, resized and cropped once: the uint8 result is kept in small shard
    files (`image_cache.ShardCache`) that later passes read instead, scaling and normalizing as they go. Every pass,
    cached or not, preprocesses the same way (uint8 geometry, then normalization), so its pixels do not depend on
    which shards were already written. A processor that cannot be split that way (checked on the first images)
    is called whole, uncached. A role larger than the cache budget ($PROFILING_AGENT_IMAGE_CACHE_MB) is not cached.
    """

    def __init__(
        self,
        ds: Any,
        rows: Sequence[int] | np.ndarray,
        labels: torch.Tensor,
        *,
        image_column: str,
        processor: Any | None,
        shape: Mapping[str, Any],
        role: str = "images",
        options: StreamOptions = StreamOptions(),
    ) -> None:
        self.images = ds.select_columns([image_column])
        self.rows = np.asarray(rows, dtype=np.int64)
        self.labels = labels
        self.image_column, self.processor = image_column, processor
        self.shape = {k: int(shape[k]) for k in ("channels", "height", "width")}
        self.preprocessing = Preprocessing(processor, self.shape)
        self.workers = data_workers() if options.workers is None else options.workers
        self.cache_dir = None if options.cache_dir is None else Path(options.cache_dir)
        self.role = role
        if len(self.rows) != len(labels):
            raise ValueError(f"{len(self.rows)} rows but {len(labels)} labels")
        self.split_note: str | None = None  # why the two-step path is not used (None: it is, or not checked yet)
        self._split: bool | None = None  # decided on the first images, once
        self._cache: ShardCache | None = None
        self._held: tuple[int, np.ndarray] | None = None  # the shard last read
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:  # DataLoader workers get a copy without the lock or the held shard
        return {**self.__dict__, "_lock": None, "_held": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def chw(self) -> tuple[int, int, int]:
        """(channels, height, width) of every image."""
        return self.shape["channels"], self.shape["height"], self.shape["width"]

    @property
    def cache(self) -> ShardCache | None:
        """The uint8 shard cache in use (None: not cached, or no image read yet)."""
        return self._cache

    def pixels(self, positions: Sequence[int] | range) -> torch.Tensor:
        """Decode and preprocess the images at `positions` (0..len-1) into a float32 (N, C, H, W) tensor."""
        return self._finish(self._read(positions))

    def _read(self, positions: Sequence[int] | range) -> torch.Tensor:
        """Return the images at `positions` as uint8 geometry (two-step path) or float32 pixels (processor whole)."""
        positions = list(positions)
        if not positions:
            return torch.zeros(0, *self.chw)
        with self._lock:
            if not self._decide_split():
                return self.preprocessing.full(self._decode(positions))
            return self._geometry(positions)

    def _finish(self, read: torch.Tensor) -> torch.Tensor:
        """Turn what _read returned into float32 pixels (normalizing uint8 geometry)."""
        return self.preprocessing.normalize(read) if read.dtype == torch.uint8 else read

    def _decode(self, positions: Sequence[int] | range) -> list:
        rows = [int(self.rows[p]) for p in positions]
        try:
            return self.images[rows][self.image_column]
        except (OSError, SyntaxError, ValueError) as err:  # an image that decoded in prepare_images fails now
            prepare.decode_all(self.images, np.asarray(rows), self.image_column, self.role)  # names file or row
            raise DataError(f"cannot decode the {self.role} images of rows {rows[0]}..{rows[-1]}: {err}") from None

    def _decide_split(self) -> bool:
        """Check once, on the first images, that uint8 geometry + normalization equals the processor; open the cache."""
        if self._split is None and len(self):
            sample = self._decode(range(min(SPLIT_CHECK, len(self))))
            geometry, self.split_note = self.preprocessing.check(sample)
            self._split = geometry is not None
            if self.split_note:
                logger.warning("%s images are preprocessed whole and not cached: %s", self.role, self.split_note)
            if geometry is not None and self.cache_dir is not None:
                image_shape = tuple(geometry.shape[1:])
                key = cache_key(self.rows, self.processor, self.shape)
                cache = ShardCache.open(self.cache_dir, self.role, key, len(self), image_shape)
                if cache.nbytes() <= budget_mb() * 2**20:
                    self._cache = cache
        return bool(self._split)

    def _geometry(self, positions: list[int]) -> torch.Tensor:
        """uint8 images at `positions`: from the cache's shards (decoding and storing missing ones) or decoded."""
        cache = self._cache
        if cache is None:
            return self.preprocessing.geometry(self._decode(positions))
        wanted = np.asarray(positions, dtype=np.int64)
        shards = wanted // cache.per_shard
        out: list[np.ndarray] = []
        start = 0
        while start < len(wanted):  # runs of positions in one shard (a batch spans one or two)
            end = start + 1
            while end < len(wanted) and shards[end] == shards[start]:
                end += 1
            arr, local = self._shard(int(shards[start])), wanted[start:end] - int(shards[start]) * cache.per_shard
            contiguous = bool(np.all(np.diff(local) == 1))
            out.append(arr[local[0] : local[-1] + 1] if contiguous else arr[local])  # a view when it can be
            start = end
        return torch.from_numpy(out[0] if len(out) == 1 else np.concatenate(out))

    def _shard(self, shard: int) -> np.ndarray:
        """Return one shard's uint8 images: the one held, the stored file, or decoded now and stored."""
        if self._held is not None and self._held[0] == shard:
            return self._held[1]
        cache = self._cache
        assert cache is not None
        arr = cache.load(shard)
        if arr is None:
            arr = self.preprocessing.geometry(self._decode(cache.span(shard))).numpy()
            cache.save(shard, arr)
        self._held = (shard, arr)
        return arr

    def between(self, start: int, stop: int) -> ImageStream:
        """Return a stream of images [start, stop), uncached (the role's cache folder is keyed by its full row list)."""
        return ImageStream(
            self.images,
            self.rows[start:stop],
            self.labels[start:stop],
            image_column=self.image_column,
            processor=self.processor,
            shape=self.shape,
            role=self.role,
            options=StreamOptions(workers=self.workers),
        )

    def __getitem__(self, key: slice) -> torch.Tensor:
        if not isinstance(key, slice):
            raise TypeError("an ImageStream is sliced (stream[a:b]); iterate batches() for a whole pass")
        return self.pixels(range(len(self))[key])

    def batches(self, batch_size: int = 64, *, pin_memory: bool = False) -> Iterator[torch.Tensor]:
        """Yield the images in order, `batch_size` at a time, the next batch decoded while the caller works.

        With workers (`$PROFILING_AGENT_DATA_WORKERS`) a torch DataLoader decodes in worker processes; otherwise
        one background thread decodes one batch ahead. `pin_memory` pins each batch for fast copies to a GPU.
        """
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        chunks = _Chunks(self, batch_size)
        with self._lock:  # decided here, so DataLoader workers inherit the decision and the cache
            self._decide_split()
        if self.workers > 0:
            loader = torch.utils.data.DataLoader(
                chunks, batch_size=None, shuffle=False, num_workers=self.workers, pin_memory=pin_memory
            )
            yield from loader
            return
        # The thread only reads (cached shards are views, not copies); the float batch is made here, in the thread
        # that frees it: float batches made in one thread and freed in another fragment glibc's per-thread
        # arenas, and peak memory then grows with the number of images.
        size = chunks.size
        for read in _ahead(lambda i: self._read(range(i * size, min(len(self), (i + 1) * size))), len(chunks)):
            batch = self._finish(read)
            yield batch.pin_memory() if pin_memory else batch

    def materialize(self) -> torch.Tensor:
        """Return every image as one tensor: for small roles only (calibration), never a whole split."""
        return self.pixels(range(len(self)))


def _ahead(make: Callable[[int], torch.Tensor], n: int) -> Iterator[torch.Tensor]:
    """Yield make(0..n-1) in order while a background thread computes the next item (one item ahead)."""
    if n <= 1:
        yield from (make(i) for i in range(n))
        return
    slots: queue.Queue = queue.Queue(maxsize=1)
    stop = threading.Event()

    def work() -> None:
        for i in range(n):
            if stop.is_set():
                return
            try:
                item: Any = make(i)
            except BaseException as err:  # noqa: BLE001 - handed to the consumer, raised there
                item = err
            while not stop.is_set():
                try:
                    slots.put(item, timeout=0.1)
                    break
                except queue.Full:
                    continue
            if isinstance(item, BaseException):
                return

    worker = threading.Thread(target=work, name="image-stream", daemon=True)
    worker.start()
    try:
        for _ in range(n):
            item = slots.get()
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        worker.join()


def iter_batches(pixels: Any, batch_size: int, *, pin_memory: bool = False) -> Iterator[torch.Tensor]:
    """Yield batches of a pixel tensor (sliced) or an ImageStream (streamed), in order."""
    if isinstance(pixels, ImageStream):
        yield from pixels.batches(batch_size, pin_memory=pin_memory)
        return
    for start in range(0, len(pixels), batch_size):
        yield pixels[start : start + batch_size]


def open_prepared(
    path: str | Path,
    sources: Mapping[str, Any],
    processor: Any | None,
    *,
    parts: tuple[str, ...] = ("eval", "calib"),
    materialize: tuple[str, ...] = ("calib",),
    with_indices: bool = False,
    image_column: str | None = None,
    options: StreamOptions | None = None,
) -> dict[str, Any]:
    """Open the roles prepare_data drew: labels in memory, images streamed from their dataset rows.

    Args:
        path: The file prepare_images wrote (row numbers, labels and how they were drawn).
        sources: part -> the `datasets.Dataset` its rows index (the split each role was drawn from).
        processor: The image processor the model was prepared with (None: resize + normalize 0.5/0.5).
        parts: Which of "eval", "test" and "calib" to open (held-out images stay held out).
        materialize: Parts returned as float tensors instead of streams (small ones: calibration).
        with_indices: Also return `<part>_index`.
        image_column: Image column (default: the one recorded by prepare_images).
        options: Workers and cache folder (`StreamOptions`). None: the default workers, and each role's resized
            uint8 images kept in `image_cache/` beside `path` (`cache_folder`), so only the first pass decodes them
            (within $PROFILING_AGENT_IMAGE_CACHE_MB per role).

    Returns:
        {"<part>_pixels": ImageStream or tensor, "<part>_labels": tensor} for each part (+ indices).

    Raises:
        DataError: The file is missing, or a source no longer holds the images the rows were drawn from.
    """
    stored = prepare.load_prepared(path, with_indices=True, parts=parts, with_meta=True)
    meta = stored.pop("meta")
    column = image_column or meta.get("image_column")
    if not column:
        raise DataError(f"{path} does not record the image column: pass image_column")
    shape = dict(zip(("channels", "height", "width"), meta["shape"], strict=True))
    options = StreamOptions(cache_dir=cache_folder(path)) if options is None else options
    out: dict[str, Any] = {}
    for part in parts:
        ds, rows = sources[part], stored[f"{part}_index"]
        _check_source(ds, part, rows, meta)
        stream = ImageStream(
            ds,
            rows.numpy(),
            stored[f"{part}_labels"],
            image_column=column,
            processor=processor,
            shape=shape,
            role=ROLES[part],
            options=options,
        )
        out[f"{part}_pixels"] = stream.materialize() if part in materialize else stream
        out[f"{part}_labels"] = stored[f"{part}_labels"]
        if with_indices:
            out[f"{part}_index"] = rows
    return out


def _check_source(ds: Any, part: str, rows: torch.Tensor, meta: Mapping[str, Any]) -> None:
    """Refuse a dataset that changed since the rows were drawn (row count, or the labels at those rows)."""
    n_rows = (meta.get("rows") or {}).get(part)
    if n_rows is not None and len(ds) != int(n_rows):
        raise DataError(f"the {ROLES[part]} split now has {len(ds)} rows, not {n_rows}: the dataset changed")
    digest, column = (meta.get("labels_sha256") or {}).get(part), meta.get("label_column")
    if digest and column and raw_labels_digest(ds, column, rows.numpy()) != digest:
        raise DataError(f"the {ROLES[part]} images' labels changed since the run drew them: the dataset changed")


def open_run_data(
    run: str | Path,
    *,
    parts: tuple[str, ...] = ("eval", "calib"),
    processor: Any | None = None,
    materialize: tuple[str, ...] = ("calib",),
    with_indices: bool = False,
    data_file: str = "data.safetensors",
    image_column: str | None = None,
    loader: Callable[[str, str | None], Any] = load_split,
) -> dict[str, Any]:
    """Open a run's prepared roles from its folder: subsets.json names the dataset and each role's split.

    Args:
        run: RUN_DIR/THREAD_ID.
        parts: Which roles ("eval", "test", "calib").
        processor: The processor to preprocess with (default: the baseline artifact's, what the run used).
        materialize: Parts returned as tensors (small ones).
        with_indices: Also return `<part>_index`.
        data_file: prepare_images' file, relative to the run.
        image_column: Image column (default: the one recorded in that file).
        loader: (ref, split) -> dataset.
    """
    run = Path(run)
    subsets = read_json(run / run_layout.SUBSETS)
    if processor is None and (run / run_layout.BASELINE).is_dir():
        processor = load_processor(run / run_layout.BASELINE)
    loaded: dict[str | None, Any] = {}
    sources = {}
    for part in parts:
        split = subsets[ROLES[part]]["split"]  # None: a dataset without splits
        if split not in loaded:
            loaded[split] = loader(str(subsets["dataset"]), split)
        sources[part] = loaded[split]
    return open_prepared(
        run / data_file,
        sources,
        processor,
        parts=parts,
        materialize=materialize,
        with_indices=with_indices,
        image_column=image_column,
    )


__all__ = [
    "PARTS",
    "ImageStream",
    "StreamOptions",
    "cache_folder",
    "data_workers",
    "iter_batches",
    "open_prepared",
    "open_run_data",
]
