"""ONNX Runtime backend: export the FP32 model to ONNX, quantize it, run it like a torch model."""

from __future__ import annotations

import contextlib
import io
import logging
import os
import time
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn

from profiling_agent.tools.io import failed_file, machine_fault
from profiling_agent.tools.runtimes.forward import PixelWrapper
from profiling_agent.tools.runtimes.onnx_model import OrtClassifier, OrtOutput, ort_session

logger = logging.getLogger(__name__)

Exporter = Literal["auto", "torchscript", "dynamo"]
OPSET = 17  # what both exporters and ONNX Runtime >= 1.16 handle for ViT, DeiT, Swin and ResNet
INPUT_NAME, OUTPUT_NAME = "pixel_values", "logits"

__all__ = [
    "OrtClassifier",
    "OrtOutput",
    "export_onnx",
    "onnx_runtime_baseline",
    "ort_session",
    "quantize_onnx",
    "quiet",
]


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Silence exporter/quantizer chatter: warnings, stdout progress lines and root-logger advice."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        root.setLevel(level)


def _export(wrapper: nn.Module, example: torch.Tensor, path: Path, exporter: str, opset: int) -> None:
    common: dict[str, Any] = {"input_names": [INPUT_NAME], "output_names": [OUTPUT_NAME], "opset_version": opset}
    if exporter == "torchscript":
        axes = {INPUT_NAME: {0: "batch"}, OUTPUT_NAME: {0: "batch"}}
        torch.onnx.export(wrapper, (example,), str(path), dynamo=False, dynamic_axes=axes, **common)
    else:
        shapes = {"pixel_values": {0: torch.export.Dim("batch", min=1, max=4096)}}
        torch.onnx.export(wrapper, (example,), str(path), dynamo=True, dynamic_shapes=shapes, **common)


def export_onnx(
    model: nn.Module,
    example: torch.Tensor,
    path: str | os.PathLike,
    *,
    exporter: Exporter = "auto",
    opset: int = OPSET,
) -> dict[str, Any]:
    """Export an FP32 image classifier to ONNX with a dynamic batch axis (input pixel_values, output logits).

    On torch 2.13 the TorchScript exporter (`dynamo=False`) handles HF ViT, DeiT, Swin and ResNet in seconds;
    the dynamo exporter (onnxscript) handles ViT and ResNet but fails to decompose Swin, and is much slower.
    "auto" tries TorchScript first and falls back to dynamo.

    Args:
        model: The FP32 model (not dynamically quantized: torch's quantized Linear does not export).
        example: A pixel batch (N, C, H, W) on the CPU used for tracing.
        path: Destination .onnx file (parent folders are created).
        exporter: "auto", "torchscript" or "dynamo".
        opset: ONNX opset.

    Returns:
        {"path", "size_bytes", "exporter", "seconds"}.

    Raises:
        RuntimeError: When no exporter could export the model (with each exporter's one-line reason).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    wrapper = PixelWrapper(model).eval()
    model.eval()
    order = ["torchscript", "dynamo"] if exporter == "auto" else [exporter]
    errors = []
    for name in order:
        start = time.perf_counter()
        try:
            with quiet(), torch.no_grad():
                _export(wrapper, example.detach().cpu(), path, name, opset)
        except Exception as exc:  # noqa: BLE001 - try the next exporter, report all reasons if none works
            machine_fault(exc, failed_file(exc, path), "could not write the ONNX export")  # a full disk stops the run
            errors.append(f"{name}: {type(exc).__name__}: {str(exc).strip().splitlines()[0][:200] if str(exc) else ''}")
            continue
        seconds = time.perf_counter() - start
        logger.info("exported %s to %s with the %s exporter in %.1f s", type(model).__name__, path, name, seconds)
        return {"path": str(path), "size_bytes": path.stat().st_size, "exporter": name, "seconds": seconds}
    raise RuntimeError("ONNX export failed: " + "; ".join(errors))


def quantize_onnx(
    src: str | os.PathLike,
    dst: str | os.PathLike,
    *,
    op_types: Sequence[str] = ("MatMul", "Gemm"),
    per_channel: bool = False,
    exclude_nodes: Sequence[str] = (),
) -> dict[str, Any]:
    """Quantize an ONNX model dynamically with ONNX Runtime: QInt8 weights, activations quantized at run time.

    Args:
        src: The FP32 .onnx file.
        dst: The quantized .onnx file to write.
        op_types: Operator types to quantize (MatMul and Gemm: the Linear layers; convolutions stay FP32).
        per_channel: Per-output-channel weight scales instead of one per tensor.
        exclude_nodes: ONNX node names left in float.

    Returns:
        {"path", "size_bytes", "seconds", "op_types"}.
    """
    from onnxruntime.quantization import (
        QuantType,
        quantize_dynamic,
    )  # lazy: onnxruntime and onnx; tools.runtimes.forms loads this module without it

    dst = Path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with quiet():
        quantize_dynamic(
            str(src),
            str(dst),
            weight_type=QuantType.QInt8,
            op_types_to_quantize=list(op_types),
            per_channel=per_channel,
            nodes_to_exclude=list(exclude_nodes),
        )
    seconds = time.perf_counter() - start
    return {"path": str(dst), "size_bytes": dst.stat().st_size, "seconds": seconds, "op_types": list(op_types)}


def onnx_runtime_baseline(
    model: nn.Module,
    example: torch.Tensor,
    out_dir: str | os.PathLike,
    *,
    threads: int | None = None,
    exporter: Exporter = "auto",
) -> dict[str, Any]:
    """Export `model` to ONNX, quantize it with ONNX Runtime (dynamic QInt8) and open both as classifiers.

    Args:
        model: The FP32 model.
        example: A pixel batch used for tracing.
        out_dir: Folder for model.onnx and model.int8.onnx.
        threads: ONNX Runtime intra-op threads (default: torch's).
        exporter: Which torch exporter to use ("auto" tries TorchScript, then dynamo).

    Returns:
        {"fp32": OrtClassifier, "int8": OrtClassifier, "export": export_onnx's dict,
        "quantize": quantize_onnx's dict}.
    """
    out = Path(out_dir)
    exported = export_onnx(model, example, out / "model.onnx", exporter=exporter)
    quantized = quantize_onnx(exported["path"], out / "model.int8.onnx")
    return {
        "fp32": OrtClassifier(exported["path"], threads),
        "int8": OrtClassifier(quantized["path"], threads),
        "export": exported,
        "quantize": quantized,
    }
