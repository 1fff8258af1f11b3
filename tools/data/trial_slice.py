"""The trial slice: the validation rows every plan trial, early stop and recovered-candidate check is judged on."""

from __future__ import annotations

from typing import Any

import numpy as np

from profiling_agent.tools.data.stream import open_run_data
from profiling_agent.tools.data.subsets import trial_rows


def open_trial_slice(
    run: Any, *, seed: int, processor: Any = None, data_file: str = "data.safetensors", image_column: str | None = None
) -> tuple[Any, Any]:
    """Return the trial slice's images (N, C, H, W) and labels from a run's prepared validation rows (`trial_rows`).

    Args:
        run: The run folder.
        seed: The run's seed (the slice's draw).
        processor: The image processor (default: the baseline artifact's).
        data_file: prepare_images' file, relative to the run.
        image_column: Image column (default: the one recorded).
    """
    tensors = open_run_data(
        run,
        parts=("eval",),
        processor=processor,
        materialize=(),
        with_indices=True,
        data_file=data_file,
        image_column=image_column,
    )
    rows = tensors["eval_index"].numpy()
    where = {int(r): i for i, r in enumerate(rows)}
    positions = [where[int(r)] for r in trial_rows(rows, seed)]
    return tensors["eval_pixels"].pixels(positions), tensors["eval_labels"][np.asarray(positions, dtype=np.int64)]
