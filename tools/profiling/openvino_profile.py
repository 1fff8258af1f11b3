"""OpenVINO forms as profiled backend forms: per-node times from OpenVINO's PERF_COUNT counters.

`ov_fp32` (the f32 precision hint) and `ov_int8` (NNCF post-training quantization; the rest of the graph at the
CPU's best precision, as the delivered `ov_int8` form runs) are built from the TorchScript ONNX export, so the
IR's operation names keep the module paths ("/model/vit/layers.0/mlp/fc1/MatMul"). The CPU plugin fuses
operations and NNCF inserts its own (".../MatMul/DequantizationMultiply", ".../nncf_smooth_quant/fq_output_0"):
`ov_module_of` reads the module path up to the first operation segment, so a fused int8 MatMul is charged to its
Linear. Executed nodes whose name carries no module path (a fused "Multiply_1234") count as time no group owns.

The profiling int8 form is calibrated on the run's calibration images, as `measure_baseline` builds it, which then
measures this very build (`runtimes.int8_reuse`); without them (a profile outside a run), on the profiling example
and small perturbations of it: its timings are what matter here (int8 kernels cost the same whatever the scales).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from profiling_agent.tools.profiling.backend_profile import WRAPPER, BackendForm, module_path_of
from profiling_agent.tools.profiling.node_samples import node_medians, sample_calls, warm_run_s
from profiling_agent.tools.profiling.shared_export import onnx_export, ov_convert
from profiling_agent.tools.runtimes.int8_reuse import active_calibration
from profiling_agent.tools.runtimes.kept_compiled import compile_file
from profiling_agent.tools.runtimes.openvino_forms import (
    OpenVinoSettings,
    nncf_model_type,
    quantize_int8,
    quantize_kept,
)
from profiling_agent.tools.runtimes.openvino_model import Precision, compile_config

CALIBRATION_COPIES = 8  # profiling-only NNCF calibration: the example and 7 perturbed copies


def ov_module_of(node: str) -> str:
    """Return the module path an OpenVINO node name carries ('' when none).

    Module path segments are the PyTorch attribute names (lower case: "vit", "layers.0", "q_proj"); the first
    segment that starts with a capital letter is an ONNX/OpenVINO operation ("MatMul", "Conv", "Add_1").
    """
    parts = node.split("/")
    if len(parts) < 3 or parts[0] != "" or parts[1] != WRAPPER:
        return ""
    path = []
    for part in parts[2:]:
        if not part or not (part[0].islower() or part[0].isdigit() or part[0] == "_"):
            break
        path.append(part)
    if len(path) == len(parts) - 2:  # no operation segment: not a node name the exporter wrote
        return ""
    return module_path_of(path)


def _model_type(model: nn.Module) -> str | None:
    return nncf_model_type(getattr(getattr(model, "config", None), "model_type", None))


def _convert(model: nn.Module, example: torch.Tensor, folder: Path) -> Any:
    return ov_convert(model, example, folder)  # within `profile_backends`, the forms' one export and conversion


def _save(ov_model: Any, path: Path) -> Path:
    import openvino as ov  # lazy: openvino; tools.profiling.deliverable loads this module without it

    path.parent.mkdir(parents=True, exist_ok=True)  # a shared export may have been written to another form's folder
    ov.save_model(ov_model, str(path), compress_to_fp16=False)
    return path


def build_ov_fp32(model: nn.Module, example: torch.Tensor, folder: Path) -> Path:
    """Build the FP32 OpenVINO IR of `model` (via the TorchScript ONNX export) into `folder`."""
    return _save(_convert(model, example, folder), folder / "ov_fp32.xml")


def build_ov_int8(model: nn.Module, example: torch.Tensor, folder: Path) -> Path:
    """Build an NNCF INT8 OpenVINO IR of `model`: on the run's calibration images when the profile has them.

    Inside `int8_reuse` (the profile step of a run) it is the build `measure_baseline` reuses: the same ONNX file,
    calibration images and settings. Outside one, calibrated on `example` and perturbed copies (timing only).
    """
    calibration = active_calibration()
    if calibration is not None:
        onnx = onnx_export(model, example, folder)
        quantized, _ = quantize_kept(
            _convert(model, example, folder),
            onnx,
            calibration,
            model_type=_model_type(model),
            settings=OpenVinoSettings(),
        )
        return _save(quantized, folder / "ov_int8.xml")
    gen = torch.Generator().manual_seed(0)
    one = example[:1].detach().cpu()
    noisy = (one + 0.1 * torch.randn(one.shape, generator=gen) for _ in range(CALIBRATION_COPIES - 1))
    calib = torch.cat([one, *noisy])
    settings = OpenVinoSettings(calibration_samples=CALIBRATION_COPIES)
    quantized, _ = quantize_int8(
        _convert(model, example, folder), calib, model_type=_model_type(model), settings=settings
    )
    return _save(quantized, folder / "ov_int8.xml")


def time_ov_nodes(
    path: Path, pixels: torch.Tensor, warmup: int = 2, repeats: int = 5, precision: Precision = "f32"
) -> dict[str, float]:
    """Run an OpenVINO IR with PERF_COUNT on; return each executed node's median real time per run, in ms.

    `repeats` samples of `sample_calls` runs each (one run for a full-size model, up to 200 for a fast one), after
    `warmup` untimed ones (at least one); a node's time is its median over the samples of its mean in each.
    Compiled for the pixels' static shape, as the side-by-side measurements run it (`OvClassifier.compiled_for`).
    One thread, one stream, no pinning (as the side-by-side latency measurements); `precision` is the
    inference precision hint ("f32", or "default": the CPU's best, as the delivered int8 form runs).
    """
    config = {**compile_config(precision, 1), "PERF_COUNT": "YES"}
    compiled = compile_file(path, tuple(pixels.shape), config)  # compiled once within `kept_compiled`
    request = compiled.create_infer_request()
    feed = {0: pixels.detach().cpu().numpy()}
    calls = sample_calls(warm_run_s(lambda: request.infer(feed), warmup))
    runs: dict[str, list[float]] = {}
    for _ in range(calls * repeats):
        request.infer(feed)
        for info in request.get_profiling_info():
            if str(info.status).endswith(".EXECUTED"):
                runs.setdefault(info.node_name, []).append(info.real_time.total_seconds() * 1e3)
    return node_medians(runs, calls, repeats)


def _time_f32(path: Path, pixels: torch.Tensor, warmup: int, repeats: int) -> dict[str, float]:
    return time_ov_nodes(path, pixels, warmup, repeats, "f32")


def _time_best(path: Path, pixels: torch.Tensor, warmup: int, repeats: int) -> dict[str, float]:
    return time_ov_nodes(path, pixels, warmup, repeats, "default")


OV_PROFILE_FORMS = (
    BackendForm("ov_fp32", "openvino", build_ov_fp32, _time_f32, ov_module_of),
    BackendForm("ov_int8", "openvino", build_ov_int8, _time_best, ov_module_of),
)
