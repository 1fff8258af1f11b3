"""Backend variants of a pruned FP32 candidate: ONNX Runtime FP32, dynamic QInt8 and static int8 (QDQ).

Each variant is a folder (`model.onnx`, `recipe.json`, the model's `config.json` and image processor) checked
against the torch model's logits on the evaluation images. Whatever goes wrong (ONNX Runtime missing, an export
or a quantizer failing, logits that do not match) marks that variant failed with a one-line reason; the caller
keeps the torch model, never loses the run.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn

from profiling_agent.tools.io import failed_file, machine_fault, write_json_atomic
from profiling_agent.tools.runtimes.forward import forward_logits
from profiling_agent.tools.runtimes.onnx_model import (
    ONNX_FILE,
    ONNX_FORMAT,
    ONNX_FORMAT_VERSION,
    ONNX_RECIPE,
    OrtClassifier,
    onnxruntime_missing,
)
from profiling_agent.tools.runtimes.onnx_runtime import OPSET, Exporter, export_onnx, quantize_onnx, quiet
from profiling_agent.tools.versions import versions

logger = logging.getLogger(__name__)

OrtMethod = Literal["fp32", "dynamic", "static"]
ORT_METHODS: tuple[OrtMethod, ...] = ("fp32", "dynamic", "static")
CalibrationName = Literal["minmax", "entropy", "percentile"]


@dataclass
class BackendSettings:
    """How the ONNX Runtime variants are built and checked (defaults measured on ViT, DeiT, Swin and ResNet)."""

    methods: tuple[OrtMethod, ...] = ORT_METHODS  # which ORT variants to build
    exporter: Exporter = "auto"  # TorchScript first, dynamo as the fallback (dynamo fails on Swin)
    opset: int = OPSET
    dynamic_op_types: tuple[str, ...] = ("MatMul", "Gemm")  # dynamic quantization: the Linear layers
    dynamic_per_channel: bool = True  # per-output-channel weight scales: closer logits at no speed cost
    static_op_types: tuple[str, ...] = ("Conv", "MatMul", "Gemm")  # static QDQ: convolutions too
    static_per_channel: bool = True  # per-channel conv/Linear weights (per-tensor conv int8 loses accuracy)
    calibration: CalibrationName = "minmax"  # activation ranges from the calibration images
    calibration_samples: int = 64  # at most this many calibration images
    calibration_batch: int = 8  # images per calibration forward pass
    exclude_nodes: tuple[str, ...] = ()  # ONNX node names kept in float by both quantizers
    fp32_tolerance: float = 1e-3  # FP32 export must match torch: max |diff| <= this x the largest |logit|
    static_on_transformers: bool = False  # see STATIC_TRANSFORMER_REASON: skipped unless asked for explicitly
    source_check: int = 0  # check images of ort_fp32 when it is built only as the others' source (0: all of them)


# Measured on ViT-B/16 (DESIGN.md section 8): U8S8 MinMax per-channel QDQ was slower than ORT dynamic QInt8 (81-87
# vs 68-74 ms) and off (cosine to FP32 0.95, max |logit diff| 0.7 on logits of about 2), because LayerNorm/GELU/
# softmax outputs with outliers get one static uint8 range each; ORT dynamic (per-batch ranges) and OpenVINO INT8
# (NNCF's transformer scheme: SmoothQuant, mixed preset, softmax/LayerNorm kept in float) beat it on both counts.
STATIC_TRANSFORMER_REASON = (
    "not built for transformers: ONNX Runtime static QDQ on ViT is slower than ort_dynamic and loses accuracy "
    "(static uint8 activation ranges on LayerNorm/GELU outliers); ort_dynamic and ov_int8 cover this model"
)
TRANSFORMER_MODEL_TYPES = ("vit", "deit", "swin")


@dataclass
class Variant:
    """One built backend variant: where it is, how it was made, how close it is to torch, or why it failed."""

    name: str  # ort_fp32, ort_dynamic, ort_static, ov_fp32, ov_bf16, ov_int8
    method: str  # fp32, dynamic, static (ONNX Runtime); fp32, bf16, int8 (OpenVINO)
    status: Literal["ok", "failed", "skipped"] = "failed"
    path: str | None = None  # the variant's folder
    size_bytes: int = 0  # bytes of model.onnx
    max_abs_diff: float | None = None  # against the torch logits on the check images
    logit_agreement: float | None = None  # % of check images with the same top-1 as torch
    error: str | None = None
    seconds: float = 0.0  # export (FP32) or export + quantization time; kept out of the recipe (files stay stable)
    recipe: dict[str, Any] = field(default_factory=dict)
    model: Any = field(default=None, repr=False)  # the open session or compiled model (ok variants only)

    def record(self) -> dict[str, Any]:
        """Return the JSON facts of the variant (without the session)."""
        out = asdict(self)
        out.pop("model")
        return out


def planned_variants(prefix: str, methods: Sequence[str], missing: str | None) -> list[Variant]:
    """Return one Variant per method, named `<prefix>_<method>`, its error `missing` (why the runtime is absent)."""
    return [Variant(name=f"{prefix}_{m}", method=m, error=missing) for m in methods]


@dataclass(frozen=True)
class FormFiles:
    """What each form's folder holds beside the model file: the config, the image processor, the recipe's facts."""

    config: Any = None  # the transformers config (labels; its model_type picks NNCF's model type)
    processor: Any = None  # the image processor, so the folder can be evaluated on its own
    extra: Mapping[str, Any] | None = None  # JSON facts copied into each recipe (params, MACs, the source artifact)


def failure_reason(exc: BaseException) -> str:
    """Return an exception as one line: its type and the first line of its message (at most 300 characters)."""
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0][:300]}" if text else type(exc).__name__


class _Reader:
    """Calibration images for onnxruntime.quantization.quantize_static, `batch` at a time."""

    def __init__(self, input_name: str, pixels: torch.Tensor, batch: int) -> None:
        self.input_name = input_name
        self.batches = [pixels[i : i + batch].contiguous().numpy() for i in range(0, len(pixels), batch)]
        self.index = 0

    def get_next(self) -> dict[str, Any] | None:
        if self.index >= len(self.batches):
            return None
        self.index += 1
        return {self.input_name: self.batches[self.index - 1]}

    def rewind(self) -> None:
        self.index = 0


def _calibration_reader(input_name: str, pixels: torch.Tensor, batch: int) -> Any:
    from onnxruntime.quantization import (
        CalibrationDataReader,
    )  # lazy: onnxruntime and onnx; tools.runtimes.forms loads this module without it

    class Reader(_Reader, CalibrationDataReader):
        pass

    return Reader(input_name, pixels, batch)


@contextlib.contextmanager
def _scratch_cwd() -> Iterator[None]:
    """Run in a throw-away working directory: symbolic shape inference dumps a model into the cwd when it fails."""
    here = os.getcwd()
    with tempfile.TemporaryDirectory(prefix="ort-pre-") as tmp:
        os.chdir(tmp)
        try:
            yield
        finally:
            os.chdir(here)


def _pre_process(src: Path, dst: Path) -> str:
    """Run ONNX Runtime's quantization pre-processing (shape inference, graph optimization); say what ran."""
    from onnxruntime.quantization.shape_inference import (
        quant_pre_process,
    )  # lazy: onnxruntime and onnx; tools.runtimes.forms loads this module without it

    src, dst = src.resolve(), dst.resolve()
    try:
        with quiet(), _scratch_cwd():
            quant_pre_process(str(src), str(dst))
        return "quant_pre_process (symbolic shape inference, optimization, ONNX shape inference)"
    except Exception as exc:  # noqa: BLE001 - symbolic shape inference fails on some graphs: plain ONNX shapes
        logger.info("quant_pre_process failed (%s): retrying without symbolic shape inference", failure_reason(exc))
    with quiet(), _scratch_cwd():
        quant_pre_process(str(src), str(dst), skip_symbolic_shape=True)
    return "quant_pre_process without symbolic shape inference (it failed on this graph)"


def quantize_static_onnx(src: Path, dst: Path, calib: torch.Tensor, settings: BackendSettings) -> dict[str, Any]:
    """Quantize an FP32 ONNX file to static int8 QDQ with activation ranges calibrated on `calib`.

    Returns:
        The quantization recipe: method, format, types, per-channel, calibration method and sample count,
        operator types, excluded nodes, pre-processing.
    """
    from onnxruntime.quantization import (
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )  # lazy: onnxruntime and onnx; tools.runtimes.forms loads this module without it

    methods = {
        "minmax": CalibrationMethod.MinMax,
        "entropy": CalibrationMethod.Entropy,
        "percentile": CalibrationMethod.Percentile,
    }
    pre = dst.with_name("pre_process.onnx")
    how = _pre_process(src, pre)
    images = calib[: settings.calibration_samples].detach().to("cpu", torch.float32)
    try:
        with quiet():
            quantize_static(
                str(pre),
                str(dst),
                _calibration_reader("pixel_values", images, settings.calibration_batch),
                quant_format=QuantFormat.QDQ,
                activation_type=QuantType.QUInt8,
                weight_type=QuantType.QInt8,
                op_types_to_quantize=list(settings.static_op_types),
                nodes_to_exclude=list(settings.exclude_nodes),
                per_channel=settings.static_per_channel,
                calibrate_method=methods[settings.calibration],
            )
    finally:
        pre.unlink(missing_ok=True)
        for extra in dst.parent.glob("augmented_model*.onnx"):  # the calibrator's scratch files
            extra.unlink(missing_ok=True)
    return {
        "method": "static",
        "format": "QDQ",
        "activation_type": "QUInt8",
        "weight_type": "QInt8",
        "per_channel": settings.static_per_channel,
        "calibration": {"method": settings.calibration, "samples": len(images), "batch": settings.calibration_batch},
        "op_types": list(settings.static_op_types),
        "excluded_nodes": list(settings.exclude_nodes),
        "pre_process": how,
    }


def check_logits(variant: Variant, reference: torch.Tensor, pixels: torch.Tensor, tolerance: float | None) -> None:
    """Compare the variant's logits with torch's; a shape mismatch, NaN or (FP32) a large difference fails it."""
    got = variant.model(pixel_values=pixels).logits if variant.model is not None else None
    if got is None or got.shape != reference.shape:
        raise RuntimeError(
            f"logits shape {None if got is None else tuple(got.shape)} != torch {tuple(reference.shape)}"
        )
    if not torch.isfinite(got).all():
        raise RuntimeError("logits are not finite")
    diff = (got - reference).abs().max().item()
    variant.max_abs_diff = diff
    variant.logit_agreement = round(100.0 * (got.argmax(-1) == reference.argmax(-1)).float().mean().item(), 4)
    scale = max(reference.abs().max().item(), 1e-6)
    if tolerance is not None and diff > tolerance * scale:
        raise RuntimeError(f"logits differ from torch by {diff:.3g} (> {tolerance:g} x max |logit| {scale:.3g})")


def write_form_folder(folder: Path, variant: Variant, recipe: dict[str, Any], config: Any, processor: Any) -> None:
    """Write recipe.json, config.json and the processor next to model.onnx."""
    variant.recipe = recipe
    write_json_atomic(folder / ONNX_RECIPE, recipe)
    if config is not None:
        config.to_json_file(str(folder / "config.json"))
    if processor is not None:
        processor.save_pretrained(str(folder))


def finish_form(
    variant: Variant,
    weights: Path,
    checked: tuple[torch.Tensor, torch.Tensor, float | None],
    recipe: dict[str, Any],
    config: Any,
    processor: Any,
) -> None:
    """Check a built form against torch, then write its recipe (with the check's figures), config and processor.

    Args:
        variant: The form; its model is loaded from the folder holding `weights`.
        weights: The form's weight file (its size is the form's size on disk).
        checked: Torch's reference logits, the images they came from and the FP32 tolerance (None: int8 forms).
        recipe: The recipe's fields shared by the run's forms plus the form's own (quantization, runtime).
        config: The model's Hugging Face config, written beside the form (None: none).
        processor: The image processor, written beside the form (None: none).
    """
    reference, check, tolerance = checked
    check_logits(variant, reference, check, tolerance)
    folder = weights.parent
    variant.status, variant.path = "ok", str(folder)
    variant.size_bytes = weights.stat().st_size
    recipe = {
        **recipe,
        "variant": variant.name,
        "method": variant.method,
        "check": {
            "images": len(check),
            "max_abs_diff": variant.max_abs_diff,
            "agreement": variant.logit_agreement,
            "fp32_tolerance": tolerance,
        },
    }
    write_form_folder(folder, variant, recipe, config, processor)


def build_ort_variants(
    model: nn.Module,
    calib_pixels: torch.Tensor,
    check_pixels: torch.Tensor,
    out_dir: str | os.PathLike,
    *,
    settings: BackendSettings | None = None,
    threads: int | None = None,
    files: FormFiles | None = None,
    reference: torch.Tensor | None = None,
) -> list[Variant]:
    """Export a pruned FP32 torch classifier to ONNX, quantize it with ONNX Runtime, check every file against torch.

    Args:
        model: The FP32 model (pruned or not; not dynamically quantized).
        calib_pixels: Calibration images (N, C, H, W) for the static quantizer's activation ranges.
        check_pixels: Images whose logits each variant must reproduce (the evaluation images).
        out_dir: Parent folder; each variant writes OUT/ort_<method>/.
        settings: Which variants and how (defaults: all three, per-channel, MinMax calibration).
        threads: ONNX Runtime intra-op threads (default: torch's).
        files: The image processor and the recipe's extra facts saved into each folder, so it can be evaluated on
            its own (the config: the model's own when not given).
        reference: The model's FP32 logits on `check_pixels`, when the caller has them (computed otherwise).

    Returns:
        One Variant per requested method, in order; failed ones carry the reason.
    """
    settings = settings or BackendSettings()
    files = files or FormFiles()
    out = Path(out_dir)
    missing = onnxruntime_missing()
    variants = planned_variants("ort", settings.methods, missing)
    if missing or not variants:
        return variants
    _skip_static_on_transformers(variants, model, settings)
    model = model.eval().to("cpu")
    check = check_pixels.detach().to("cpu", torch.float32)
    if reference is None:
        with torch.inference_mode():
            reference = forward_logits(model, check).float()
    fp32_folder = out / "ort_fp32"
    exported = _export_fp32(model, check, fp32_folder, settings, variants)
    if exported is None:
        return variants
    if files.config is None:
        files = replace(files, config=getattr(model, "config", None))
    base = _ort_recipe_base(model, check, exported, settings, files)
    fp32_error = ""
    for variant in variants:
        folder = out / variant.name
        if variant.method != "fp32":
            shutil.rmtree(folder, ignore_errors=True)
        if variant.status == "skipped":
            continue
        try:
            if fp32_error:
                raise RuntimeError(f"the FP32 export is wrong ({fp32_error})")
            start = time.perf_counter()
            quant = _quantize(variant.method, Path(exported["path"]), folder / ONNX_FILE, calib_pixels, settings)
            variant.seconds = round(exported["seconds"] + time.perf_counter() - start, 3)
            variant.model = OrtClassifier(folder / ONNX_FILE, threads)
            tolerance = settings.fp32_tolerance if variant.method == "fp32" else None
            recipe = {**base, "quantization": quant}
            n = settings.source_check if variant.method == "fp32" and settings.source_check else len(check)
            checked = (reference[:n], check[:n], tolerance)
            finish_form(variant, folder / ONNX_FILE, checked, recipe, files.config, files.processor)
        except Exception as exc:  # noqa: BLE001 - this variant fails, the others and the run go on (not for a full disk)
            machine_fault(exc, failed_file(exc, folder), f"could not write the {variant.name} form")
            variant.status, variant.model, variant.error = "failed", None, failure_reason(exc)
            if variant.method == "fp32":
                fp32_error = variant.error
            logger.info("backend variant %s failed: %s", variant.name, variant.error)
    if "fp32" not in settings.methods:
        shutil.rmtree(fp32_folder, ignore_errors=True)
    return variants


def _skip_static_on_transformers(variants: list[Variant], model: nn.Module, settings: BackendSettings) -> None:
    model_type = str(getattr(getattr(model, "config", None), "model_type", "") or "").lower()
    for v in variants:
        if v.method == "static" and model_type in TRANSFORMER_MODEL_TYPES and not settings.static_on_transformers:
            v.status, v.error = "skipped", STATIC_TRANSFORMER_REASON


def _export_fp32(
    model: nn.Module, check: torch.Tensor, folder: Path, settings: BackendSettings, variants: list[Variant]
) -> dict[str, Any] | None:
    """Export the FP32 ONNX file every variant starts from; None (each variant failed with the reason) if it fails."""
    shutil.rmtree(folder, ignore_errors=True)
    try:
        return export_onnx(model, check[:2], folder / ONNX_FILE, exporter=settings.exporter, opset=settings.opset)
    except Exception as exc:  # noqa: BLE001 - every variant needs the export: all fail with its reason
        machine_fault(exc, failed_file(exc, folder), "could not write the ONNX export")
        for v in variants:
            if v.status != "skipped":
                v.error = f"ONNX export failed: {failure_reason(exc)}"
        return None


def _ort_recipe_base(
    model: nn.Module, check: torch.Tensor, exported: dict[str, Any], settings: BackendSettings, files: FormFiles
) -> dict[str, Any]:
    """Return the recipe fields every ONNX Runtime variant of one export shares."""
    return {
        "format": ONNX_FORMAT,
        "format_version": ONNX_FORMAT_VERSION,
        "runtime": "onnxruntime",
        "architecture": type(model).__name__,
        "model_file": ONNX_FILE,
        "input": {"name": "pixel_values", "shape": list(check.shape[1:]), "dynamic_batch": True},
        "output": "logits",
        "export": {"exporter": exported["exporter"], "opset": settings.opset},
        "versions": versions("onnx", "onnxruntime"),
        "extra": dict(files.extra or {}),
    }


def _quantize(method: str, src: Path, dst: Path, calib: torch.Tensor, settings: BackendSettings) -> dict | None:
    """Write the `method` variant of the FP32 file `src` to `dst`; return its quantization recipe."""
    if method == "fp32":
        return None
    dst.parent.mkdir(parents=True, exist_ok=True)
    if method == "dynamic":
        quantize_onnx(
            src,
            dst,
            op_types=settings.dynamic_op_types,
            per_channel=settings.dynamic_per_channel,
            exclude_nodes=settings.exclude_nodes,
        )
        return {
            "method": "dynamic",
            "weight_type": "QInt8",
            "activations": "quantized at run time (uint8)",
            "per_channel": settings.dynamic_per_channel,
            "op_types": list(settings.dynamic_op_types),
            "excluded_nodes": list(settings.exclude_nodes),
        }
    if len(calib) == 0:
        raise RuntimeError("static int8 needs calibration images and the run has none")
    return quantize_static_onnx(src, dst, calib, settings)
