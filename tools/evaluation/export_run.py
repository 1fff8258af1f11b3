"""Export a finished run's delivered model on demand: the `profiling-agent export` command's work.

ONNX (`--quantize none|dynamic|static`: an ONNX Runtime folder) or OpenVINO (`--quantize none|int8`: an IR
folder that `openvino.Core().read_model` opens alone). When the run already built and checked that form of the
delivered model, its folder is copied (same file, the accuracy result.json recorded); otherwise it is built from the
FP32 model. Work happens in `RUN/export/.FOLDER.building`, swept at the start of every export, so an export that
was killed leaves nothing behind after the next one; the destination is replaced whole or not at all.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from profiling_agent.tools import run_layout
from profiling_agent.tools.io import atomic_dir, read_json

ExportFormat = Literal["onnx", "openvino"]
ExportQuantize = Literal["dynamic", "static", "int8", "none"]
CHECK_IMAGES = 32
EVAL_BATCH = 64  # the runs' default accuracy batch (dynamic quantization's accuracy depends on it: recorded)
FORMS = {
    ("onnx", "none"): "ort_fp32",
    ("onnx", "dynamic"): "ort_dynamic",
    ("onnx", "static"): "ort_static",
    ("openvino", "none"): "ov_fp32",
    ("openvino", "int8"): "ov_int8",
}


class ExportError(ValueError):
    """The run folder cannot be exported (no result.json, no finished best model, missing files): one line."""


def _fp32_folder(run: Path, result: dict[str, Any], best: dict[str, Any]) -> Path:
    """Return the delivered model's FP32 torch artifact: the pruned (recovered) model, or the unpruned baseline."""
    if int(best.get("iteration") or 0) == 0:  # quantization only: the unpruned model was delivered
        folder = run / str((result.get("baseline") or {}).get("path") or "baseline")
    else:
        recorded = best.get("pruned_path")
        iteration = run_layout.iteration_dir(run, best["iteration"])
        recovered = iteration / run_layout.RECOVERED
        fallback = recovered if (recovered / "recipe.json").is_file() else iteration / run_layout.PRUNED
        folder = run / recorded if recorded else fallback
    if not (folder / "recipe.json").is_file():
        raise ExportError(f"{folder} (the delivered model's FP32 torch artifact) is missing")
    return folder


def _recorded_form(run: Path, result: dict[str, Any], best: dict[str, Any], form: str) -> dict[str, Any] | None:
    """Return the record of `form` the run built and checked for the delivered model, when it is still on disk."""
    base = result.get("baseline") or {}
    variants = base.get("variants") if int(best.get("iteration") or 0) == 0 else best.get("variants")
    for v in variants or []:
        if v.get("name") == form and v.get("status") == "ok" and v.get("path") and (run / v["path"]).is_dir():
            return v
    return None


def sweep_leftovers(target: Path) -> list[Path]:
    """Remove what an export killed mid-way left beside `target` (its scratch and atomic temp folders)."""
    gone = []
    if target.parent.is_dir():
        for stale in target.parent.glob(f".{target.name}.*"):
            shutil.rmtree(stale, ignore_errors=True)
            gone.append(stale)
    return gone


def export_run(
    run_path: str | Path,
    *,
    fmt: ExportFormat = "onnx",
    quantize: ExportQuantize = "none",
    out: str | Path | None = None,
    threads: int | None = None,
) -> dict[str, Any]:
    """Export RUN/THREAD's delivered model as an ONNX Runtime or OpenVINO folder, quantized as asked.

    The folder holds the model file(s), recipe.json, config.json and the image processor, like a delivered `best/`.
    It is checked against the torch model's logits and its accuracy on the run's validation images is measured
    (at the batch the run measured the form with, else EVAL_BATCH; recorded: dynamic quantization's activation
    scales depend on the batch).

    Args:
        run_path: The finished run's folder (RUN_DIR/THREAD_ID).
        fmt: onnx or openvino.
        quantize: onnx: none (FP32), dynamic (QInt8 MatMul/Gemm) or static (int8 QDQ on the calibration images);
            openvino: none (FP32) or int8 (NNCF on the calibration images).
        out: Destination folder (default RUN/THREAD/export/<fmt>-<quantize>); replaced when it exists.
        threads: Runtime threads.

    Returns:
        {"path", "format", "form", "method", "size_bytes", "max_abs_diff", "logit_agreement", "accuracy",
        "n_samples", "eval_batch", "source", "recipe"}.

    Raises:
        ExportError: Bad run folder or format/quantize pair; RuntimeError: the export or quantization failed.
    """
    from profiling_agent.tools.data.stream import (
        open_run_data,
    )  # lazy: torch; graph.cli.export loads this module without it
    from profiling_agent.tools.evaluation.metrics import (
        predict,
        top1,
    )  # lazy: torch; graph.cli.export loads this module without it

    form, run, result, best = export_inputs(run_path, fmt, quantize)
    fp32_folder = _fp32_folder(run, result, best)
    target = Path(out) if out else run / "export" / f"{fmt}-{quantize}"
    sweep_leftovers(target)
    scratch = target.parent / f".{target.name}.building"
    tensors = open_run_data(run)  # validation streamed, calibration in memory
    try:
        recorded = _recorded_form(run, result, best, form)
        eval_batch = int((recorded or {}).get("recipe", {}).get("eval_batch") or EVAL_BATCH)  # as the run measured it
        if recorded is not None:
            made = copy_recorded(run, recorded, scratch / form, threads)
        else:
            made = build_export(run, best, fp32_folder, tensors, scratch, form, threads)
        allowed_ids = (result.get("labels") or {}).get("allowed_ids")
        preds = predict(made.model, tensors["eval_pixels"], batch_size=eval_batch, allowed_ids=allowed_ids)
        accuracy = top1(preds, tensors["eval_labels"])
        del made.model
        with atomic_dir(target) as staged:
            shutil.copytree(scratch / form, staged, dirs_exist_ok=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return {
        "path": str(target),
        "format": fmt,
        "form": form,
        "method": made.recipe.get("method"),
        "size_bytes": made.size,
        "max_abs_diff": made.diff,
        "logit_agreement": made.agreement,
        "accuracy": accuracy,
        "n_samples": int(len(tensors["eval_labels"])),
        "eval_batch": eval_batch,
        "source": made.source,
        "recipe": made.recipe,
    }


@dataclass
class ExportedForm:
    """The exported form in the scratch folder: its model, recipe, size, check against torch and where it came from."""

    model: Any
    recipe: dict[str, Any]
    size: int
    diff: float | None
    agreement: float | None
    source: str


def export_inputs(
    run_path: str | Path, fmt: ExportFormat, quantize: ExportQuantize
) -> tuple[str, Path, dict[str, Any], dict[str, Any]]:
    """Check the format/quantize pair and the run folder; return the form, the run, its result.json and its best.

    Raises:
        ExportError: A pair the format does not take, no result.json, or no finished candidate.
    """
    form = FORMS.get((fmt, quantize))
    if form is None:
        allowed = ", ".join(q for f, q in FORMS if f == fmt)
        raise ExportError(f"--format {fmt} takes --quantize {allowed}, not {quantize}")
    run = Path(run_path)
    if not (run / run_layout.RESULT).is_file():
        raise ExportError(f"{run / 'result.json'} not found: give a finished run's folder RUN_DIR/THREAD_ID")
    result = read_json(run / run_layout.RESULT)
    best = result.get("best")
    if not best:
        raise ExportError(f"run {run} has no finished candidate to export")
    return form, run, result, best


def copy_recorded(run: Path, recorded: dict[str, Any], dest: Path, threads: int | None) -> ExportedForm:
    """Copy the form the run built and checked into `dest` and open it (its recipe holds its check)."""
    from profiling_agent.tools.runtimes.forms import (
        load_form,
    )  # lazy: torch; graph.cli.export loads this module without it

    shutil.copytree(run / recorded["path"], dest)
    model = load_form(dest, threads)
    recipe: dict[str, Any] = dict(getattr(model, "recipe", {}))  # ORT and OpenVINO forms carry their recipe
    check = recipe.get("check") or {}
    return ExportedForm(
        model=model,
        recipe=recipe,
        size=_size(dest),
        diff=check.get("max_abs_diff"),
        agreement=check.get("agreement"),
        source=f"the form the run built and checked ({recorded['path']})",
    )


def build_export(
    run: Path,
    best: dict[str, Any],
    fp32_folder: Path,
    tensors: dict[str, Any],
    scratch: Path,
    form: str,
    threads: int | None,
) -> ExportedForm:
    """Build `form` from the delivered model's FP32 torch artifact into `scratch`, checked against its logits.

    Raises:
        RuntimeError: The export or quantization failed.
    """
    from profiling_agent.tools.models.artifact_load import (
        load_artifact,
    )  # lazy: torch; graph.cli.export loads this module without it
    from profiling_agent.tools.runtimes.forms import (
        build_forms,
    )  # lazy: torch; graph.cli.export loads this module without it
    from profiling_agent.tools.runtimes.onnx_forms import (
        BackendSettings,
        FormFiles,
    )  # lazy: torch; graph.cli.export loads this module without it

    loaded = load_artifact(fp32_folder)
    extra = {"params": best.get("params"), "macs": best.get("macs"), "run": str(run), "iteration": best["iteration"]}
    built = build_forms(
        loaded.model,
        tensors["calib_pixels"],
        tensors["eval_pixels"][:CHECK_IMAGES],
        scratch,
        forms=[form],
        threads=threads,
        files=FormFiles(processor=loaded.processor, extra=extra),
        ort=BackendSettings(static_on_transformers=True),
    )
    variant = next(v for v in built if v.name == form)
    if variant.status != "ok" or variant.model is None:
        fmt = next(f for (f, _), name in FORMS.items() if name == form)
        raise RuntimeError(f"{fmt} export ({form}) failed: {variant.error}")
    return ExportedForm(
        model=variant.model,
        recipe=variant.recipe,
        size=variant.size_bytes,
        diff=variant.max_abs_diff,
        agreement=variant.logit_agreement,
        source=f"built from {fp32_folder.relative_to(run)}",
    )


def _size(folder: Path) -> int:
    files = list(folder.glob("*.onnx")) + list(folder.glob("*.bin"))
    return sum(f.stat().st_size for f in files)
