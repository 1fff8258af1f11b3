"""One ONNX export (and one OpenVINO conversion of it) shared by every backend form the profile step builds.

The profile step builds ort_fp32, ort_dynamic, ov_fp32 and ov_int8 of the same FP32 model; each started from a
TorchScript ONNX export of its own (ort_dynamic exported again for its source, each OpenVINO form converted its own
export). The export is deterministic, so inside `shared_exports()` the first one is kept and handed to the others
(the files are the same bytes; `tests/unit/test_shared_export.py`). Outside the block every call exports, as before:
the latency table and the token-rate builds export a different model each time.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from profiling_agent.tools.runtimes import onnx_runtime
from profiling_agent.tools.runtimes.onnx_runtime import quiet

_ACTIVE: dict[tuple[int, tuple[int, ...]], dict[str, Any]] | None = None  # the open block's memo, None outside one


@contextlib.contextmanager
def shared_exports() -> Iterator[None]:
    """Within the block, `onnx_export` and `ov_convert` export and convert each (model, input shape) once."""
    global _ACTIVE
    before, _ACTIVE = _ACTIVE, {}
    try:
        yield
    finally:
        _ACTIVE = before


def _entry(model: nn.Module, example: torch.Tensor) -> dict[str, Any] | None:
    if _ACTIVE is None:
        return None
    key = (id(model), tuple(example.shape))
    entry = _ACTIVE.setdefault(key, {"model": model})  # the model is held, so its id is not reused in the block
    return entry if entry["model"] is model else None


def onnx_export(model: nn.Module, example: torch.Tensor, folder: Path) -> Path:
    """Return the TorchScript ONNX export of `model` (written to `folder/model.onnx`, or the block's first one)."""
    entry = _entry(model, example)
    kept = entry.get("onnx") if entry is not None else None
    if kept is not None and Path(kept).is_file():
        return Path(kept)
    path = Path(onnx_runtime.export_onnx(model, example, folder / "model.onnx", exporter="torchscript")["path"])
    if entry is not None:
        entry["onnx"] = path
    return path


def ov_convert(model: nn.Module, example: torch.Tensor, folder: Path) -> Any:
    """Return the `openvino.Model` converted from `onnx_export`'s file (converted once in a block; never mutated)."""
    import openvino as ov  # lazy: openvino; tools.profiling.backend_profile loads this module without it

    entry = _entry(model, example)
    if entry is not None and "ov" in entry:
        return entry["ov"].clone()  # a copy: what one form does with its model never reaches the next
    onnx = onnx_export(model, example, folder)
    with quiet():
        converted = ov.convert_model(str(onnx))
    if entry is not None:
        entry["ov"] = converted
    return converted
