"""OpenVINO forms of an FP32 classifier: ov_fp32 (f32 hint), ov_bf16 (where native) and ov_int8 (NNCF PTQ).

Each form is a folder (`openvino_model.xml` + `.bin`, `recipe.json`, the model's `config.json` and image
processor) built from the exported FP32 ONNX file (`openvino.convert_model`), checked against the torch logits on
the check images like the ONNX Runtime variants. A form that cannot be built, compiled or checked is marked failed
with a one-line reason; bf16 on a CPU without native bf16 is marked skipped with the reason. The run goes on.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from profiling_agent.tools.io import failed_file, machine_fault
from profiling_agent.tools.runtimes.int8_reuse import kept_or_built
from profiling_agent.tools.runtimes.onnx_forms import FormFiles, Variant, failure_reason, finish_form, planned_variants
from profiling_agent.tools.runtimes.onnx_runtime import quiet
from profiling_agent.tools.runtimes.openvino_model import (
    OV_FILE,
    OV_FORMAT,
    OV_FORMAT_VERSION,
    OV_WEIGHTS,
    OvClassifier,
    bf16_unsupported,
    compile_config,
    nncf_missing,
    openvino_missing,
)
from profiling_agent.tools.versions import versions

logger = logging.getLogger(__name__)

OvForm = Literal["fp32", "bf16", "int8"]
OV_FORMS: tuple[OvForm, ...] = ("fp32", "bf16", "int8")
TRANSFORMER_TYPES = ("vit", "deit", "swin")  # NNCF's ModelType.TRANSFORMER (mixed preset, SmoothQuant, no softmax)
# IR nodes whose names hold this stay in float in every INT8 form: a torch model names a child module so when
# quantizing its ops would change what the model computes (token merging's matching, `models.merged_tokens`)
KEEP_FLOAT_SCOPE = "keep_float"
# a name OpenVINO gave from its counter: `<type>_<id>`, kept by a constant folded from that op (`Range_194`)
COUNTED_NAME = re.compile(
    r"([A-Za-z][A-Za-z0-9]*)_[0-9]+(?:_[0-9]+)*"
)  # `Constant_256`, de-duplicated `Constant_256_1`


@dataclass
class OpenVinoSettings:
    """How the OpenVINO forms are built and checked (defaults measured on ViT, DeiT, Swin and ResNet)."""

    forms: tuple[OvForm, ...] = OV_FORMS  # which OpenVINO forms to build
    calibration_samples: int = 64  # at most this many calibration images for NNCF (one image per item)
    fast_bias_correction: bool = True  # NNCF's default; the slow variant costs minutes on ViT-B for no gain here
    ignored_names: tuple[str, ...] = ()  # IR node names NNCF keeps in float (the accuracy-aware retry fills it)
    fp32_tolerance: float = 1e-3  # ov_fp32 must match torch: max |diff| <= this x the largest |logit|


def nncf_model_type(model_type: str | None) -> str | None:
    """Return NNCF's model type for a transformers `model_type`: "transformer" for ViT, DeiT, Swin; else None."""
    return "transformer" if (model_type or "").lower() in TRANSFORMER_TYPES else None


def keep_float_patterns(ov_model: Any) -> list[str]:
    """Return NNCF ignored-scope patterns for the model's KEEP_FLOAT_SCOPE nodes (empty when it has none)."""
    if not any(KEEP_FLOAT_SCOPE in op.get_friendly_name() for op in ov_model.get_ordered_ops()):
        return []
    logging.getLogger("nncf").setLevel(logging.WARNING)  # else NNCF logs one INFO line per node it leaves float
    return [f".*{KEEP_FLOAT_SCOPE}.*"]


def _link_or_copy(src: Path, dst: Path) -> None:
    dst.unlink(missing_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _dataset(pixels: torch.Tensor, limit: int) -> list[Any]:
    images = pixels[:limit].detach().to("cpu", torch.float32)
    return [images[i : i + 1].contiguous().numpy() for i in range(len(images))]


def quantize_int8(
    ov_model: Any,
    calib_pixels: torch.Tensor,
    *,
    model_type: str | None,
    settings: OpenVinoSettings,
    ignored: Sequence[str] = (),
) -> tuple[Any, dict[str, Any]]:
    """Quantize an OpenVINO FP32 model to INT8 with NNCF post-training quantization on the calibration images.

    Args:
        ov_model: The FP32 `openvino.Model` (left unchanged).
        calib_pixels: Calibration images (N, C, H, W); at most `settings.calibration_samples` are used.
        model_type: "transformer" (ViT, DeiT, Swin: NNCF's transformer scheme) or None (CNNs).
        settings: Calibration count and bias correction.
        ignored: IR node names kept in float.

    Returns:
        The quantized model and its recipe (NNCF version, model type, preset, calibration count, ignored scope).
    """
    import nncf  # lazy: nncf and openvino; tools.runtimes.forms loads this module without it

    if len(calib_pixels) == 0:
        raise RuntimeError("INT8 needs calibration images and the run has none")
    items = _dataset(calib_pixels, settings.calibration_samples)
    kwargs: dict[str, Any] = {
        "subset_size": len(items),
        "fast_bias_correction": settings.fast_bias_correction,
    }
    if model_type == "transformer":
        kwargs["model_type"] = nncf.ModelType.TRANSFORMER
    names = sorted(set(ignored) | set(settings.ignored_names))
    patterns = keep_float_patterns(ov_model)
    if names or patterns:
        kwargs["ignored_scope"] = nncf.IgnoredScope(names=names, patterns=patterns, validate=False)
    with quiet():
        quantized = nncf.quantize(ov_model.clone(), nncf.Dataset(items), **kwargs)
    recipe = {
        "method": "nncf_ptq",
        "tool": "nncf.quantize",
        "model_type": model_type or "default (CNN)",
        "preset": "mixed (transformer default)" if model_type == "transformer" else "performance (default)",
        "calibration": {"samples": len(items), "batch": 1, "source": "the run's calibration images"},
        "fast_bias_correction": settings.fast_bias_correction,
        "ignored_scope": names,
        **({"ignored_patterns": patterns} if patterns else {}),
        "rest_precision": "the CPU's best (OpenVINO's default inference precision)",
    }
    return quantized, recipe


def quantize_kept(
    ov_model: Any,
    onnx_file: str | os.PathLike | None,
    calib_pixels: torch.Tensor,
    *,
    model_type: str | None,
    settings: OpenVinoSettings,
) -> tuple[Any, dict[str, Any]]:
    """Quantize as `quantize_int8` does; inside `int8_reuse.int8_reuse`, once per run for the same inputs.

    `onnx_file` is the file `ov_model` was converted from: with the calibration images NNCF reads, the model type
    and the settings it keys the build (`int8_reuse.kept_or_built`); None quantizes every time.
    """
    facts = {
        "model_type": model_type,
        "samples": settings.calibration_samples,
        "fast_bias_correction": settings.fast_bias_correction,
        "ignored": sorted(settings.ignored_names),
        "patterns": keep_float_patterns(ov_model),
    }
    return kept_or_built(
        onnx_file,
        calib_pixels[: settings.calibration_samples],
        facts,
        lambda: quantize_int8(ov_model, calib_pixels, model_type=model_type, settings=settings),
    )


def quantized_ops(ov_model: Any) -> set[str]:
    """Return the names of the IR operations that read a FakeQuantize output (the layers running in int8)."""
    names = set()
    for op in ov_model.get_ordered_ops():
        if op.get_type_name() not in ("MatMul", "Convolution", "GroupConvolution", "Add", "Multiply"):
            continue
        for value in op.input_values():
            producer = value.get_node()
            while producer.get_type_name() in ("Convert", "Reshape", "Transpose") and producer.inputs():
                producer = producer.input_value(0).get_node()
            if producer.get_type_name() == "FakeQuantize":
                names.add(op.get_friendly_name())
                break
    return names


def stable_names(ov_model: Any, tag: str) -> Any:
    """Rename the operations OpenVINO named from its process-wide counter by their order in the graph; return the model.

    OpenVINO names an operation nobody named `<type>_<instance id>` (`Constant_2464`; a constant folded from it keeps
    it: `Range_194`; a name made unique gains `_1`: `Constant_256_1`), the id counted over every node the process
    ever made: the same ONNX file converted twice in one process, or after other conversions, writes another IR
    (docs/facts.md). Each such name becomes
    `<type>_<tag><k>` (k counts them in topological order), which no longer looks counted, so a later call with
    another tag renames only the nodes added since (NNCF's, folded ones). Other names (the exporter's) stay.
    """
    renamed = 0
    for op in ov_model.get_ordered_ops():
        if counted := COUNTED_NAME.fullmatch(op.get_friendly_name()):
            op.set_friendly_name(f"{counted.group(1)}_{tag}{renamed}")
            renamed += 1
    return ov_model


def _save(ov_model: Any, folder: Path) -> None:
    import openvino as ov  # lazy: openvino; tools.runtimes.forms loads this module without it

    folder.mkdir(parents=True, exist_ok=True)
    ov.save_model(stable_names(ov_model, "s"), str(folder / OV_FILE), compress_to_fp16=False)


def build_ov_forms(
    onnx_path: str | os.PathLike | None,
    calib_pixels: torch.Tensor,
    checked: tuple[torch.Tensor, torch.Tensor],
    out_dir: str | os.PathLike,
    *,
    settings: OpenVinoSettings | None = None,
    threads: int | None = None,
    files: FormFiles | None = None,
) -> list[Variant]:
    """Build the OpenVINO forms of an FP32 classifier and check each against the torch logits.

    Args:
        onnx_path: The exported FP32 ONNX file (None or missing: every form fails with the reason).
        calib_pixels: Calibration images for NNCF's activation statistics.
        checked: The torch FP32 logits on the check images, and those images.
        out_dir: Parent folder; each form writes OUT/ov_<form>/.
        settings: Which forms and how.
        threads: OpenVINO inference threads (default: torch's).
        files: The transformers config (its model_type picks NNCF's model type; saved beside the IR with its
            labels), the image processor and the recipe's extra facts.

    Returns:
        One Variant per requested form, in order; failed or skipped ones carry the reason.
    """
    settings = settings or OpenVinoSettings()
    files = files or FormFiles()
    missing = openvino_missing()
    variants = planned_variants("ov", settings.forms, missing)
    if missing or not variants:
        return variants
    start = time.perf_counter()
    try:
        fp32_model, source = _convert(onnx_path)
    except Exception as exc:  # noqa: BLE001 - every form needs the conversion: all fail with its reason
        machine_fault(exc, failed_file(exc, out_dir), "could not convert to OpenVINO")
        for v in variants:
            v.error = f"OpenVINO conversion failed: {failure_reason(exc)}"
        return variants
    reference, check_pixels = checked
    build = _FormBuild(
        fp32_model,
        calib_pixels,
        (reference, check_pixels.detach().to("cpu", torch.float32)),
        Path(out_dir),
        settings,
        threads,
        files,
        time.perf_counter() - start,
        _recipe_base(source, check_pixels, files),
        Path(onnx_path) if onnx_path is not None else None,
    )
    fp32_error = ""
    for variant in variants:
        fp32_error = build.form(variant, fp32_error)
    return variants


def _convert(onnx_path: str | os.PathLike | None) -> tuple[Any, str]:
    """Convert the FP32 ONNX file to an `openvino.Model`; return it and how it was made."""
    import openvino as ov  # lazy: openvino; tools.runtimes.forms loads this module without it

    if onnx_path is None or not Path(onnx_path).is_file():
        raise RuntimeError("no FP32 ONNX file to convert (the ONNX export failed)")
    with quiet():
        return stable_names(ov.convert_model(str(onnx_path)), "c"), "openvino.convert_model(FP32 ONNX)"


def _recipe_base(source: str, check_pixels: torch.Tensor, files: FormFiles) -> dict[str, Any]:
    """Return the recipe fields every OpenVINO form of one model shares."""
    return {
        "format": OV_FORMAT,
        "format_version": OV_FORMAT_VERSION,
        "model_file": OV_FILE,
        "weights_file": OV_WEIGHTS,
        "input": {"name": "pixel_values", "shape": list(check_pixels.shape[1:]), "dynamic_batch": True},
        "output": "logits",
        "export": {"converter": source},
        "versions": versions("openvino", "nncf"),
        "extra": dict(files.extra or {}),
    }


@dataclass
class _FormBuild:
    """What building each OpenVINO form of one converted model needs."""

    fp32_model: Any
    calib_pixels: torch.Tensor
    checked: tuple[torch.Tensor, torch.Tensor]  # torch's logits, the check images (float32, CPU)
    out: Path
    settings: OpenVinoSettings
    threads: int | None
    files: FormFiles
    convert_seconds: float
    base: dict[str, Any]
    source: Path | None = None  # the ONNX file the FP32 IR was converted from (the INT8 build's key)

    def form(self, variant: Variant, fp32_error: str) -> str:
        """Build, check and write one form (failed or skipped with its reason); return the FP32 IR's error."""
        folder = self.out / variant.name
        shutil.rmtree(folder, ignore_errors=True)
        try:
            if variant.method == "bf16" and (reason := bf16_unsupported()):
                variant.status, variant.error = "skipped", reason
                return fp32_error
            if fp32_error and variant.method != "int8":
                raise RuntimeError(f"the FP32 IR is wrong ({fp32_error})")
            self._build(variant, folder)
        except Exception as exc:  # noqa: BLE001 - this form fails, the others and the run go on (not for a full disk)
            machine_fault(exc, failed_file(exc, folder), f"could not write the {variant.name} form")
            variant.status, variant.model, variant.error = "failed", None, failure_reason(exc)
            shutil.rmtree(folder, ignore_errors=True)
            logger.info("OpenVINO form %s failed: %s", variant.name, variant.error)
            return variant.error if variant.method == "fp32" else fp32_error
        return fp32_error

    def _build(self, variant: Variant, folder: Path) -> None:
        t0 = time.perf_counter()
        quant: dict[str, Any] | None = None
        precision = {"fp32": "f32", "bf16": "bf16", "int8": "default"}[variant.method]
        if variant.method == "int8":
            if missing_nncf := nncf_missing():
                raise RuntimeError(missing_nncf)
            model_type = nncf_model_type(getattr(self.files.config, "model_type", None))
            ov_model, quant = quantize_kept(  # the profile's build of the same file and images, when it made one
                self.fp32_model, self.source, self.calib_pixels, model_type=model_type, settings=self.settings
            )
            quant["quantized_ops"] = len(quantized_ops(ov_model))
            _save(ov_model, folder)
        elif variant.method == "bf16" and (self.out / "ov_fp32" / OV_FILE).is_file():  # the same IR, another hint
            folder.mkdir(parents=True, exist_ok=True)
            for name in (OV_FILE, OV_WEIGHTS):
                _link_or_copy(self.out / "ov_fp32" / name, folder / name)
        else:
            _save(self.fp32_model, folder)
        variant.model = OvClassifier(folder / OV_FILE, precision, self.threads)  # type: ignore[arg-type]
        variant.seconds = round(self.convert_seconds + time.perf_counter() - t0, 3)
        tolerance = self.settings.fp32_tolerance if variant.method == "fp32" else None
        runtime = {
            "name": "openvino",
            "precision_hint": precision,
            "compile_config": compile_config(precision, self.threads),  # type: ignore[arg-type]
        }
        recipe = {**self.base, "runtime": runtime, "quantization": quant}
        reference, check = self.checked
        finish_form(
            variant, folder / OV_WEIGHTS, (reference, check, tolerance), recipe, self.files.config, self.files.processor
        )
