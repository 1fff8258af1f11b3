"""Stream preprocessed image batches from dataset rows: a run keeps row numbers and labels, never float pixels."""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from profiling_agent.tools.data import prepare
from profiling_agent.tools.data.prepare import PARTS, preprocess_images, raw_labels_digest
from profiling_agent.tools.data.sources import DataError, load_split

WORKERS_ENV = "PROFILING_AGENT_DATA_WORKERS"  # DataLoader worker processes that decode ahead (default 0: a thread)
ROLES = {"eval": "validation", "test": "test", "calib": "calibration"}  # prepare_data's parts -> subsets.json roles


def data_workers() -> int:
    """Return the DataLoader worker processes asked for in $PROFILING_AGENT_DATA_WORKERS (0 when unset or bad)."""
    try:
        return max(0, int(os.environ.get(WORKERS_ENV, "0")))
    except ValueError:
        return 0


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
        workers: int | None = None,
    ) -> None:
        self.images = ds.select_columns([image_column])
        self.rows = np.asarray(rows, dtype=np.int64)
        self.labels = labels
        self.image_column, self.processor = image_column, processor
        self.shape = {k: int(shape[k]) for k in ("channels", "height", "width")}
        self.workers = data_workers() if workers is None else workers
        if len(self.rows) != len(labels):
            raise ValueError(f"{len(self.rows)} rows but {len(labels)} labels")

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def chw(self) -> tuple[int, int, int]:
        """(channels, height, width) of every image."""
        return self.shape["channels"], self.shape["height"], self.shape["width"]

    def pixels(self, positions: Sequence[int] | range) -> torch.Tensor:
        """Decode and preprocess the images at `positions` (0..len-1) into a float32 (N, C, H, W) tensor."""
        picked = [int(self.rows[p]) for p in positions]
        if not picked:
            return torch.zeros(0, *self.chw)
        images = self.images[picked][self.image_column]
        return preprocess_images(images, self.processor, self.shape)

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
        if self.workers > 0:
            loader = torch.utils.data.DataLoader(
                chunks, batch_size=None, shuffle=False, num_workers=self.workers, pin_memory=pin_memory
            )
            yield from loader
            return
        for batch in _ahead(chunks.__getitem__, len(chunks)):
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
    workers: int | None = None,
) -> dict[str, Any]:
    """Open the roles prepare_data drew: labels in memory, images streamed from their dataset rows.

    Args:
        path: The file prepare_data wrote (row numbers, labels and how they were drawn).
        sources: part -> the `datasets.Dataset` its rows index (the split each role was drawn from).
        processor: The image processor the model was prepared with (None: resize + normalize 0.5/0.5).
        parts: Which of "eval", "test" and "calib" to open (held-out images stay held out).
        materialize: Parts returned as float tensors instead of streams (small ones: calibration).
        with_indices: Also return `<part>_index`.
        image_column: Image column (default: the one recorded by prepare_data).
        workers: DataLoader workers (default: $PROFILING_AGENT_DATA_WORKERS).

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
    out: dict[str, Any] = {}
    for part in parts:
        ds, rows = sources[part], stored[f"{part}_index"]
        _check_source(ds, part, rows, meta)
        stream = ImageStream(
            ds, rows.numpy(), stored[f"{part}_labels"], image_column=column, processor=processor, shape=shape,
            workers=workers,
        )  # fmt: skip
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
    loader: Callable[[str, str], Any] = load_split,
) -> dict[str, Any]:
    """Open a run's prepared roles from its folder: subsets.json names the dataset and each role's split.

    Args:
        run: RUN_DIR/THREAD_ID.
        parts: Which roles ("eval", "test", "calib").
        processor: The processor to preprocess with (default: the baseline artifact's, what the run used).
        materialize: Parts returned as tensors (small ones).
        with_indices: Also return `<part>_index`.
        data_file: prepare_data's file, relative to the run.
        image_column: Image column (default: the one recorded in that file).
        loader: (ref, split) -> dataset.
    """
    from profiling_agent.tools.io import read_json

    run = Path(run)
    subsets = read_json(run / "subsets.json")
    if processor is None and (run / "baseline").is_dir():
        from profiling_agent.tools.models.artifact_load import load_processor

        processor = load_processor(run / "baseline")
    loaded: dict[str, Any] = {}
    sources = {}
    for part in parts:
        split = str(subsets[ROLES[part]]["split"])
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


__all__ = ["PARTS", "ImageStream", "data_workers", "iter_batches", "open_prepared", "open_run_data"]
