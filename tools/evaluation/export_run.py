"""Export a finished run's best model to ONNX on demand: the `profiling-agent export` command's work."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any, Literal

from profiling_agent.tools.io import atomic_dir, read_json

ExportQuantize = Literal["dynamic", "static", "none"]
CHECK_IMAGES = 32


class ExportError(ValueError):
    """The run folder cannot be exported (no result.json, no finished best model, missing files): one line."""


def _pruned_folder(run: Path, best: dict[str, Any]) -> Path:
    """Return the best candidate's FP32 pruned artifact, after recovery (what ONNX Runtime exports and quantizes)."""
    recorded = best.get("pruned_path")
    iteration = run / f"iter_{int(best['iteration']):02d}"
    fallback = iteration / "recovered" if (iteration / "recovered" / "recipe.json").is_file() else iteration / "pruned"
    folder = run / recorded if recorded else fallback
    if not (folder / "recipe.json").is_file():
        raise ExportError(f"{folder} (the best candidate's FP32 pruned model) is missing")
    return folder


def export_run(
    run_path: str | Path,
    *,
    quantize: ExportQuantize = "none",
    out: str | Path | None = None,
    threads: int | None = None,
) -> dict[str, Any]:
    """Export RUN/THREAD's best candidate (its FP32 pruned model) to an ONNX folder, quantized as asked.

    The folder holds model.onnx, recipe.json, config.json and the image processor, like a delivered `best/`.
    The file is checked against the torch model's logits on the run's validation images and its accuracy on
    them is measured, so it can be compared with result.json.

    Args:
        run_path: The finished run's folder (RUN_DIR/THREAD_ID).
        quantize: none (FP32), dynamic (QInt8 MatMul/Gemm) or static (int8 QDQ calibrated on the run's
            calibration images).
        out: Destination folder (default RUN/THREAD/export/onnx-<quantize>); replaced when it exists.
        threads: ONNX Runtime threads.

    Returns:
        {"path", "method", "size_bytes", "max_abs_diff", "logit_agreement", "accuracy", "n_samples", "recipe"}.

    Raises:
        ExportError: Bad run folder; RuntimeError: the export or quantization failed (with the reason).
    """
    from profiling_agent.tools.compression.backends import BackendSettings, build_ort_variants
    from profiling_agent.tools.data.stream import open_run_data
    from profiling_agent.tools.evaluation.metrics import predict, top1
    from profiling_agent.tools.models.artifact_load import load_artifact

    run = Path(run_path)
    if not (run / "result.json").is_file():
        raise ExportError(f"{run / 'result.json'} not found: give a finished run's folder RUN_DIR/THREAD_ID")
    result = read_json(run / "result.json")
    best = result.get("best")
    if not best:
        raise ExportError(f"run {run} has no finished candidate to export")
    loaded = load_artifact(_pruned_folder(run, best))
    tensors = open_run_data(run)  # validation streamed, calibration in memory
    method = {"none": "fp32", "dynamic": "dynamic", "static": "static"}[quantize]
    settings = BackendSettings(methods=(method,))
    target = Path(out) if out else run / "export" / f"onnx-{quantize}"
    with tempfile.TemporaryDirectory() as tmp:
        (variant,) = build_ort_variants(
            loaded.model,
            tensors["calib_pixels"],
            tensors["eval_pixels"][:CHECK_IMAGES],
            tmp,
            settings=settings,
            threads=threads,
            processor=loaded.processor,
            extra={
                "params": best.get("params"),
                "macs": best.get("macs"),
                "run": str(run),
                "iteration": best["iteration"],
            },
        )
        if variant.status != "ok" or variant.model is None:
            raise RuntimeError(f"ONNX export ({method}) failed: {variant.error}")
        allowed = (result.get("labels") or {}).get("allowed_ids")
        preds = predict(variant.model, tensors["eval_pixels"], allowed_ids=allowed)
        accuracy = top1(preds, tensors["eval_labels"])
        variant.model = None
        with atomic_dir(target) as staged:
            shutil.copytree(variant.path, staged, dirs_exist_ok=True)
    return {
        "path": str(target),
        "method": method,
        "size_bytes": variant.size_bytes,
        "max_abs_diff": variant.max_abs_diff,
        "logit_agreement": variant.logit_agreement,
        "accuracy": accuracy,
        "n_samples": int(len(tensors["eval_labels"])),
        "recipe": variant.recipe,
    }
