"""A run's NNCF INT8 builds of the baseline kept by what they depend on: the profile's is the one measured after.

The profile step times an INT8 OpenVINO form of the baseline and `measure_baseline` builds one again to measure:
two NNCF post-training quantizations of the same model (on ViT-B/16 about 22 s each; on the zoo's tiny models
most of a step, NNCF's graph matching). Inside `int8_reuse(folder, calib)` the profile calibrates on the run's
calibration images, as `measure_baseline` does, and `openvino_forms.quantize_kept` keeps each build in `folder`
under a key of what it depends on: the bytes of the ONNX file the IR was converted from, the calibration images
NNCF reads, the model type, the settings and the ignored scope, and NNCF's version. A second build with the same
key reads the kept IR instead (the same weights and logits; `tests/unit/test_int8_reuse.py`); another key builds
anew. The folder lives in the run folder, so a resumed run finds it; `measure_baseline` removes it when done.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from profiling_agent.tools.io import read_json, sha256_file, write_json_atomic
from profiling_agent.tools.runtimes.openvino_model import OV_FILE, shared_core
from profiling_agent.tools.versions import versions

RECIPE = "quantization.json"  # beside the kept IR: the recipe `quantize_int8` returned
_ACTIVE: tuple[Path, torch.Tensor, bool] | None = None  # the open block's folder, calibration images, and keep


@contextlib.contextmanager
def int8_reuse(folder: Path, calib_pixels: torch.Tensor, *, drop_after: bool = False) -> Iterator[None]:
    """Within the block, `kept_or_built` reuses the INT8 builds kept in `folder`, and keeps its own there.

    With `drop_after` (the last step that reads them) its own builds are not kept, and the folder is removed when
    the block ends without an error (a stopped step leaves it for the resume).
    """
    global _ACTIVE
    before, _ACTIVE = _ACTIVE, (Path(folder), calib_pixels, not drop_after)
    try:
        yield
    finally:
        _ACTIVE = before
    if drop_after:
        shutil.rmtree(folder, ignore_errors=True)


def active_calibration() -> torch.Tensor | None:
    """Return the open block's calibration images (None outside a block)."""
    return _ACTIVE[1] if _ACTIVE is not None else None


def int8_key(onnx_file: Path, calib: torch.Tensor, facts: dict[str, Any]) -> str:
    """Return the key of one INT8 build: the ONNX file's bytes, the calibration images NNCF reads and `facts`."""
    digest = hashlib.sha256(sha256_file(onnx_file).encode())
    digest.update(calib.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    digest.update(json.dumps({**facts, "versions": versions("nncf", "openvino")}, sort_keys=True).encode())
    return digest.hexdigest()


def kept_or_built(
    onnx_file: str | os.PathLike | None,
    calib: torch.Tensor,
    facts: dict[str, Any],
    build: Callable[[], tuple[Any, dict[str, Any]]],
) -> tuple[Any, dict[str, Any]]:
    """Return `build()` (an INT8 model and its recipe); inside a block, built once per key (`int8_key`).

    Args:
        onnx_file: The ONNX file the FP32 IR was converted from (None: no key; built every time).
        calib: The calibration images `build` reads (exactly those).
        facts: Everything else the build depends on (model type, settings, ignored scope).
        build: Quantizes (`openvino_forms.quantize_int8`).
    """
    if _ACTIVE is None or onnx_file is None or not Path(onnx_file).is_file():
        return build()
    folder = _ACTIVE[0] / int8_key(Path(onnx_file), calib, facts)[:24]
    kept = _read(folder)
    if kept is not None:
        return kept
    quantized, recipe = build()
    if not _ACTIVE[2]:
        return quantized, recipe
    scratch = folder.with_name(folder.name + ".part")
    shutil.rmtree(scratch, ignore_errors=True)
    _save_ir(quantized, scratch)
    write_json_atomic(scratch / RECIPE, recipe)
    shutil.rmtree(folder, ignore_errors=True)
    os.replace(scratch, folder)  # whole or absent: a stopped build leaves no half-kept IR
    return quantized, recipe


def _save_ir(ov_model: Any, folder: Path) -> None:
    import openvino as ov  # lazy: openvino; tools.profiling.deliverable loads this module without it

    folder.mkdir(parents=True, exist_ok=True)
    ov.save_model(ov_model, str(folder / OV_FILE), compress_to_fp16=False)


def _read(folder: Path) -> tuple[Any, dict[str, Any]] | None:
    if not (folder / OV_FILE).is_file() or not (folder / RECIPE).is_file():
        return None
    try:
        return shared_core().read_model(str(folder / OV_FILE)), dict(read_json(folder / RECIPE))
    except Exception:  # noqa: BLE001 - a kept IR that no longer reads is built again
        return None
