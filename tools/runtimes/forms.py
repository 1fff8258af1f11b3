"""Every deployable form of one FP32 model (ONNX Runtime and OpenVINO), built, checked and chosen between.

`build_forms` makes the backend forms of any FP32 classifier (a candidate or the unpruned baseline) in one
folder; `round_forms` decides which of them a pruning round builds, from how the unpruned model's forms ranked;
`accuracy_controlled_int8` rebuilds an INT8 form that lost more than the budget with its most sensitive layers in
float; `choose_delivery` is the run's delivery policy. Issue 20's per-layer profiler can build and time any
model's form through `build_forms` and `tools.evaluation.latency`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from torch import nn

from profiling_agent.tools import interrupt
from profiling_agent.tools.io import failed_file, machine_fault, write_json_atomic
from profiling_agent.tools.runtimes.form_folder import is_form_folder
from profiling_agent.tools.runtimes.forward import forward_logits
from profiling_agent.tools.runtimes.onnx_forms import (
    ORT_METHODS,
    BackendSettings,
    FormFiles,
    Variant,
    build_ort_variants,
    failure_reason,
)
from profiling_agent.tools.runtimes.onnx_model import ONNX_FILE, ONNX_FOLDER, load_onnx_folder
from profiling_agent.tools.runtimes.onnx_runtime import quiet
from profiling_agent.tools.runtimes.openvino_forms import (
    OV_FORMS,
    OpenVinoSettings,
    build_ov_forms,
    keep_float_patterns,
    nncf_model_type,
    quantized_ops,
    stable_names,
)
from profiling_agent.tools.runtimes.openvino_model import (
    OV_FILE,
    OV_FOLDER,
    OV_RECIPE,
    OV_WEIGHTS,
    OvClassifier,
    load_openvino_folder,
    shared_core,
)

logger = logging.getLogger(__name__)

FormSource = Literal["onnx", "openvino"]  # the kinds of form folder

ALL_FORMS = tuple(f"ort_{m}" for m in ORT_METHODS) + tuple(f"ov_{f}" for f in OV_FORMS)
SOURCE_CHECK_IMAGES = 2  # check images of an ort_fp32 built only as the other forms' source
ROUND_KEEP = 2  # a pruning round builds the unpruned model's this-many fastest forms (within budget) ...
ROUND_TIE = 1.5  # ... and every other form within this factor of the fastest one's batch-1 latency
FP32_REFERENCES = ("ov_fp32", "ort_fp32", "torch_fp32", "baseline")  # an int8 form's "own FP32 form", first found


def form_source(path: str | os.PathLike) -> FormSource | None:
    """Return which kind of form folder `path` is ("onnx", "openvino"), or None when it is neither."""
    if is_form_folder(path, ONNX_FOLDER):
        return "onnx"
    if is_form_folder(path, OV_FOLDER):
        return "openvino"
    return None


def load_form(path: str | os.PathLike, threads: int | None = None) -> nn.Module:
    """Open a delivered form's folder: an ONNX Runtime file or an OpenVINO IR (raises when it is neither)."""
    source = form_source(path)
    if source == "onnx":
        return load_onnx_folder(path, threads)
    if source == "openvino":
        return load_openvino_folder(path, threads)
    raise ValueError(f"{path} holds neither an OpenVINO nor an ONNX form")


def build_forms(
    model: nn.Module,
    calib_pixels: torch.Tensor,
    check_pixels: torch.Tensor,
    out_dir: str | os.PathLike,
    *,
    forms: Sequence[str] = ALL_FORMS,
    threads: int | None = None,
    files: FormFiles | None = None,
    ort: BackendSettings | None = None,
) -> list[Variant]:
    """Build the requested ONNX Runtime and OpenVINO forms of an FP32 classifier, each checked against torch.

    The FP32 ONNX export (ort_fp32) is always made when any form is asked for: every other form starts from it.

    Args:
        model: The FP32 torch classifier (pruned or not).
        calib_pixels: Calibration images (static ORT ranges, NNCF statistics).
        check_pixels: Images each form's logits are compared on against torch.
        out_dir: Parent folder of OUT/ort_*/ and OUT/ov_*/.
        forms: Names from ALL_FORMS.
        threads: Intra-op threads of every runtime.
        files: What each folder holds beside the model: the image processor and the recipe's JSON facts (the
            config defaults to the model's own).
        ort: How the ONNX Runtime forms are built and checked (its methods are the requested forms'):
            `static_on_transformers` builds ort_static for ViT, DeiT and Swin too (an explicit export asks for it),
            `source_check` checks an ort_fp32 built only as the others' source on fewer images (`source_settings`).

    Returns:
        The built forms in ALL_FORMS order (ok, failed or skipped, each with its reason).
    """
    wanted = [f for f in ALL_FORMS if f in forms]
    if not wanted:
        return []
    methods = tuple(m for m in ORT_METHODS if f"ort_{m}" in wanted or m == "fp32")
    config = getattr(model, "config", None)
    check = check_pixels.detach().to("cpu", torch.float32)
    with torch.inference_mode():  # torch's logits on the check images, computed once for every form's check
        reference = forward_logits(model.eval().to("cpu"), check).float()
    files = FormFiles(
        config=config if files is None or files.config is None else files.config,
        processor=None if files is None else files.processor,
        extra=None if files is None else files.extra,
    )
    onnx = build_ort_variants(
        model,
        calib_pixels,
        check_pixels,
        out_dir,
        settings=replace(ort or BackendSettings(), methods=methods),
        threads=threads,
        files=files,
        reference=reference,
    )
    ov_forms = tuple(f for f in OV_FORMS if f"ov_{f}" in wanted)
    if not ov_forms:
        return onnx
    fp32 = onnx[0]
    onnx_path = Path(fp32.path) / ONNX_FILE if fp32.status == "ok" and fp32.path else None
    settings = OpenVinoSettings(forms=ov_forms)
    ov = build_ov_forms(
        onnx_path, calib_pixels, (reference, check), out_dir, settings=settings, threads=threads, files=files
    )
    return onnx + ov


def source_settings(sources: Collection[str]) -> BackendSettings:
    """Return the ONNX Runtime settings of a build whose `sources` are built only as the other forms' source.

    An ort_fp32 among them is checked against torch on SOURCE_CHECK_IMAGES images, not all: a wrong export (what
    the check is for: the forms it feeds are converted from it) is wrong on every image, so two catch it, and the
    forms that are measured keep their own checks (on a full-size ViT-B/16 the ONNX Runtime FP32 pass over 32 check
    images costs about 19 s on one core).
    """
    return BackendSettings(source_check=SOURCE_CHECK_IMAGES if "ort_fp32" in sources else 0)


def round_contenders(
    baseline_variants: Sequence[Mapping[str, Any]], baseline_accuracy: float, budget: float
) -> list[str]:
    """Return the forms that can win a pruning round: the unpruned model's fastest ones within the budget.

    Pruning narrows layers but keeps their kinds, so the order of the backends on the unpruned model predicts their
    order on its pruned candidates: its ROUND_KEEP fastest forms within the budget and every other within ROUND_TIE
    of the fastest. Without baseline forms (backend torch, a resumed old run) every form is a contender.
    """
    ok = [
        v
        for v in baseline_variants
        if v.get("status") == "ok"
        and v.get("latency_ms")
        and v.get("name") in ALL_FORMS
        and float(v.get("accuracy") or 0.0) >= baseline_accuracy - budget - 1e-9
    ]
    if not ok:
        return list(ALL_FORMS)
    ok.sort(key=lambda v: float(v["latency_ms"]))
    fastest = float(ok[0]["latency_ms"])
    keep = {v["name"] for i, v in enumerate(ok) if i < ROUND_KEEP or float(v["latency_ms"]) <= fastest * ROUND_TIE}
    return [f for f in ALL_FORMS if f in keep]


def round_forms(baseline_variants: Sequence[Mapping[str, Any]], baseline_accuracy: float, budget: float) -> list[str]:
    """Return the forms a pruning round builds: the contenders (`round_contenders`) and ort_fp32.

    ort_fp32 is always built: every other form starts from its file. Building only the contenders keeps each round
    at a few conversions; a round times and scores only the contenders (ort_fp32 built only as their source is
    neither).
    """
    keep = round_contenders(baseline_variants, baseline_accuracy, budget)
    return [f for f in ALL_FORMS if f in keep or f == "ort_fp32"]


def forms_for_backend(backend: str, forms: Sequence[str]) -> list[str]:
    """Return the forms a `--backend` choice builds (openvino also builds ort_fp32: the ONNX file it converts)."""
    if backend == "torch":
        return []
    if backend == "onnxruntime":
        return [f for f in forms if f.startswith("ort_")]
    if backend == "openvino":
        return [f for f in forms if f.startswith("ov_") or f == "ort_fp32"]
    return list(forms)


def eligible_forms(backend: str, names: Sequence[str], torch_name: str) -> list[str] | None:
    """Return the form names `--backend` may deliver (None: every measured form)."""
    if backend == "torch":
        return [torch_name]
    if backend == "onnxruntime":
        return [n for n in names if n.startswith("ort_")]
    if backend == "openvino":
        return [n for n in names if n.startswith("ov_")]
    return None


def fp32_reference(accuracies: Mapping[str, float]) -> str | None:
    """Return the name of the FP32 form an INT8 form is judged against (its own runtime's FP32 first)."""
    return next((n for n in FP32_REFERENCES if n in accuracies), None)


def _validation_fn(allowed: torch.Tensor | None):
    def validate(compiled: Any, data: Any) -> float:
        hits, total = 0, 0
        for pixels, label in data:
            logits = torch.from_numpy(np.asarray(next(iter(compiled(pixels, share_inputs=False).values())))).float()
            if allowed is not None:
                pred = allowed[logits[:, allowed].argmax(1)]
            else:
                pred = logits.argmax(1)
            hits += int((pred == torch.as_tensor(label)).sum())
            total += len(pred)
        return 100.0 * hits / max(total, 1)

    return validate


def accuracy_controlled_int8(
    fp32_ir: str | os.PathLike,
    int8_ir: str | os.PathLike,
    calib_pixels: torch.Tensor,
    validation: tuple[torch.Tensor, torch.Tensor],
    *,
    budget: float,
    model_type: str | None,
    allowed_ids: Sequence[int] | None = None,
    max_layers: int = 16,
) -> tuple[Any, dict[str, Any]]:
    """Quantize the FP32 IR again with NNCF's accuracy control: the most sensitive layers stay in float.

    NNCF quantizes, ranks the quantized layers by how much reverting each one to float restores the metric on
    the given images, and reverts them one by one until the INT8 model is within `budget` points of its own FP32
    model (or `max_layers` were reverted).

    Args:
        fp32_ir: The FP32 IR (openvino_model.xml of ov_fp32).
        int8_ir: The plain INT8 IR (to name the layers that stayed in float).
        calib_pixels: Calibration images (NNCF statistics).
        validation: Labelled images the accuracy is controlled on, and their labels (model ids).
        budget: Largest top-1 drop allowed against the FP32 model, percentage points.
        model_type: The transformers model_type (NNCF's transformer scheme for ViT, DeiT, Swin).
        allowed_ids: Model ids predictions are restricted to.
        max_layers: Most layers reverted to float.

    Returns:
        The quantized `openvino.Model` and the facts: kept layers (names), their count, images, NNCF settings.
    """
    import nncf  # lazy: NNCF takes seconds to import and only INT8 accuracy control needs it

    core = shared_core()
    fp32 = core.read_model(str(fp32_ir))
    plain = quantized_ops(core.read_model(str(int8_ir)))
    calib = [calib_pixels[i : i + 1].contiguous().numpy() for i in range(len(calib_pixels))]
    val_pixels, val_labels = validation
    val = [(val_pixels[i : i + 1].contiguous().numpy(), val_labels[i : i + 1]) for i in range(len(val_pixels))]
    allowed = None if allowed_ids is None else torch.as_tensor(list(allowed_ids), dtype=torch.long)
    kwargs: dict[str, Any] = {}
    if nncf_model_type(model_type) == "transformer":
        kwargs["model_type"] = nncf.ModelType.TRANSFORMER
    if patterns := keep_float_patterns(fp32):  # e.g. token matching: its int8 form would merge other tokens
        kwargs["ignored_scope"] = nncf.IgnoredScope(patterns=patterns, validate=False)
    params = nncf.quantization.advanced_parameters.AdvancedAccuracyRestorerParameters(
        max_num_iterations=max_layers, ranking_subset_size=min(len(val), 300)
    )
    with quiet():
        quantized = nncf.quantize_with_accuracy_control(
            fp32,
            nncf.Dataset(calib),
            nncf.Dataset(val),
            validation_fn=_validation_fn(allowed),
            max_drop=float(budget),
            drop_type=nncf.DropType.ABSOLUTE,
            subset_size=len(calib),
            advanced_accuracy_restorer_parameters=params,
            **kwargs,
        )
    kept = sorted(plain - quantized_ops(quantized))
    facts = {
        "tool": "nncf.quantize_with_accuracy_control",
        "max_drop_pp": float(budget),
        "images": len(val),
        "max_reverted": max_layers,
        "kept_in_float": kept,
        "kept_count": len(kept),
    }
    return quantized, facts


def accuracy_control_job(job: dict[str, Any], arrays: tuple[Any, Any, Any]) -> dict[str, Any]:
    """Run `accuracy_controlled_int8` and save its IR to job["out"] (the body of the child process)."""
    import openvino as ov  # lazy: only the child process that runs accuracy control needs openvino

    calib, val, labels = (torch.from_numpy(a) for a in arrays)
    quantized, facts = accuracy_controlled_int8(
        job["fp32_ir"],
        job["int8_ir"],
        calib,
        (val, labels),
        budget=job["budget"],
        model_type=job["model_type"],
        allowed_ids=job["allowed_ids"],
    )
    ov.save_model(stable_names(quantized, "a"), job["out"], compress_to_fp16=False)
    return facts


def _in_child(job: dict[str, Any], arrays: tuple[Any, Any, Any]) -> dict[str, Any]:
    """Run the accuracy-controlled quantization in a spawned child process and return its facts.

    NNCF's accuracy control left the calling process to crash (segmentation fault) at interpreter exit after a
    long test session; a throwaway process keeps it from the run's own process, which only reads the saved IR.
    """
    return interrupt.run_in_child(accuracy_control_job, job, arrays)


@dataclass(frozen=True)
class AccuracyControl:
    """Why and how an INT8 form is quantized again: its budget, the drop it had, NNCF's model type, the classes."""

    budget: float  # accuracy points the INT8 form may lose against its FP32 form
    drop: float  # the points the plain INT8 form lost
    model_type: str | None  # NNCF's model type ("transformer" or None)
    allowed_ids: Sequence[int] | None = None  # the class ids the accuracy is read over (None: every class)


def rebuild_int8(
    variant: Variant,
    fp32_file: str | os.PathLike,
    calib_pixels: torch.Tensor,
    validation: tuple[torch.Tensor, torch.Tensor],
    *,
    control: AccuracyControl,
    threads: int | None = None,
) -> Variant:
    """Replace an ov_int8 form's IR by the accuracy-controlled one; record the first drop and the kept layers.

    `fp32_file` is the FP32 model NNCF starts from (ov_fp32's IR, or the exported FP32 ONNX file); `validation`
    holds the images and labels the accuracy is read on. The new IR is written beside the old one and moved over
    it (new files: the old compiled model keeps its mapped weights). A failure leaves the form as it was, with the
    reason in its recipe.
    """
    assert variant.path is not None
    folder = Path(variant.path)
    val_pixels, val_labels = validation
    budget, allowed_ids = control.budget, control.allowed_ids
    retry: dict[str, Any] = {"reason": f"lost {control.drop:.2f} pp against its FP32 form (budget {budget:g} pp)"}
    try:
        staged = folder / "accuracy_control"
        job = {
            "fp32_ir": str(fp32_file),
            "int8_ir": str(folder / OV_FILE),
            "out": str(staged / OV_FILE),
            "budget": float(budget),
            "model_type": control.model_type,
            "allowed_ids": None if allowed_ids is None else list(allowed_ids),
        }
        arrays = (calib_pixels.numpy(), val_pixels.numpy(), val_labels.numpy())
        facts = _in_child(job, arrays)
        for name in (OV_FILE, OV_WEIGHTS):
            os.replace(staged / name, folder / name)
        staged.rmdir()
        variant.model = OvClassifier(folder / OV_FILE, "default", threads)
        variant.size_bytes = (folder / OV_WEIGHTS).stat().st_size
        retry.update(facts)
    except Exception as exc:  # noqa: BLE001 - the plain INT8 form stays, with the reason (not for a full disk)
        interrupt.check()  # a child ended by Ctrl-C: the run stops, nothing failed
        machine_fault(exc, failed_file(exc, folder), f"could not write the {variant.name} form")
        retry["error"] = failure_reason(exc)
        logger.info("accuracy-controlled INT8 failed: %s", retry["error"])
    variant.recipe = {**variant.recipe, "accuracy_control": retry}
    write_json_atomic(folder / OV_RECIPE, variant.recipe)
    return variant
