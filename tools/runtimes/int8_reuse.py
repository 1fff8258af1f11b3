"""A run's NNCF INT8 builds of the baseline kept by what they depend on: the profile's is the one measured after.

The profile step times an INT8 OpenVINO form of the baseline and `measure_baseline` builds one again to measure:
two NNCF post-training quantizations of the same model (on ViT-B/16 about 22 s each; on the zoo's tiny models
most of a step, NNCF's graph matching). Inside `int8_reuse(folder, calib)` the profile calibrates on the run's
calibration images, as `measure_baseline` does, and every `quantize_once` keeps its result in `folder` under a key
of what it depends on: the bytes of the ONNX file the IR was converted from, the calibration images NNCF reads,
the model type, the settings and the ignored scope, and NNCF's version. The second build with the same key reads
the kept IR instead (the same weights and graph; `tests/unit/test_int8_reuse.py`); a differing key builds anew.
The folder lives in the run folder, so a resumed run finds it; `measure_baseline` removes it when it is done.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

RECIPE = "quantization.json"  # beside the kept IR: the recipe `quantize_int8` returned
_ACTIVE: tuple[Path, torch.Tensor, bool] | None = None  # the open block's folder, calibration images, and keep


@contextlib.contextmanager
def int8_reuse(folder: Path, calib_pixels: torch.Tensor, *, drop_after: bool = False) -> Iterator[None]:
    """Within the block, `quantize_once` reuses the INT8 builds kept in `folder`, and keeps its own there.

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
    from profiling_agent.tools.versions import versions

    digest = hashlib.sha256()
    with open(onnx_file, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    digest.update(calib.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    digest.update(json.dumps({**facts, "versions": versions("nncf", "openvino")}, sort_keys=True).encode())
    return digest.hexdigest()


def quantize_once(
    ov_model: Any,
    onnx_file: str | os.PathLike | None,
    calib_pixels: torch.Tensor,
    *,
    model_type: str | None,
    settings: Any,
    ignored: Sequence[str] = (),
) -> tuple[Any, dict[str, Any]]:
    """Quantize as `openvino_forms.quantize_int8` does; inside a block, once per key (`int8_key`).

    Args:
        ov_model: The FP32 `openvino.Model`, converted from `onnx_file`.
        onnx_file: The ONNX file it was converted from (None: no key; quantized every time).
        calib_pixels: Calibration images; the first `settings.calibration_samples` are read.
        model_type: NNCF's model type ("transformer" or None).
        settings: The `OpenVinoSettings` (calibration count, bias correction, ignored names).
        ignored: IR node names kept in float.

    Returns:
        The INT8 model and its recipe, as `quantize_int8` returns them.
    """
    from profiling_agent.tools.io import write_json_atomic
    from profiling_agent.tools.runtimes.openvino_forms import keep_float_patterns, quantize_int8

    def build() -> tuple[Any, dict[str, Any]]:
        return quantize_int8(ov_model, calib_pixels, model_type=model_type, settings=settings, ignored=ignored)

    if _ACTIVE is None or onnx_file is None or not Path(onnx_file).is_file():
        return build()
    facts = {
        "model_type": model_type,
        "samples": settings.calibration_samples,
        "fast_bias_correction": settings.fast_bias_correction,
        "ignored": sorted(set(ignored) | set(settings.ignored_names)),
        "patterns": keep_float_patterns(ov_model),
    }
    key = int8_key(Path(onnx_file), calib_pixels[: settings.calibration_samples], facts)
    folder = _ACTIVE[0] / key[:24]
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
    import openvino as ov

    from profiling_agent.tools.runtimes.openvino_model import OV_FILE

    folder.mkdir(parents=True, exist_ok=True)
    ov.save_model(ov_model, str(folder / OV_FILE), compress_to_fp16=False)


def _read(folder: Path) -> tuple[Any, dict[str, Any]] | None:
    from profiling_agent.tools.io import read_json
    from profiling_agent.tools.runtimes.openvino_model import OV_FILE, shared_core

    if not (folder / OV_FILE).is_file() or not (folder / RECIPE).is_file():
        return None
    try:
        return shared_core().read_model(str(folder / OV_FILE)), dict(read_json(folder / RECIPE))
    except Exception:  # noqa: BLE001 - a kept IR that no longer reads is built again
        return None
