"""Measure the untouched model once, in every deployable form: the record every candidate is compared with."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from safetensors import safe_open
from safetensors.torch import save

from profiling_agent.state import ArtifactRef, Context, EvalRecord, Objective
from profiling_agent.tools import run_layout
from profiling_agent.tools.device import measure_device
from profiling_agent.tools.evaluation.delivery import quantization_only_peer
from profiling_agent.tools.evaluation.final_latency import FORM_SAMPLES
from profiling_agent.tools.evaluation.form_eval import eval_threads, evaluate_forms
from profiling_agent.tools.evaluation.records import EvalImages, FormsMeasurement, FormsPlan, MeasureSettings
from profiling_agent.tools.io import write_bytes_atomic
from profiling_agent.tools.models.artifact_load import load_artifact
from profiling_agent.tools.models.sizes import state_bytes
from profiling_agent.tools.runtimes.forms import ALL_FORMS, eligible_forms, forms_for_backend
from profiling_agent.tools.runtimes.int8_reuse import int8_reuse
from profiling_agent.tools.runtimes.openvino_model import nncf_missing

CHECK_IMAGES = 32  # validation images each form's logits are compared on against torch
BACKEND_SOURCE = (  # a form the run's backend cannot deliver, built because the others convert its file
    "built as the source of the other forms only: --backend {backend} cannot deliver it (neither timed nor scored)"
)
PREDICTIONS_FILE = "baseline_forms/predictions.safetensors"  # the baseline's validation predictions, run-relative


def save_baseline_predictions(root: Path, preds: Any, labels: Any, device: str) -> None:
    """Keep the baseline's validation predictions, so later rounds time the baseline without predicting again."""
    path = root / PREDICTIONS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = {"preds": preds.detach().cpu().contiguous(), "labels": labels.detach().cpu().contiguous()}
    write_bytes_atomic(path, save(tensors, metadata={"device": device}))  # readable as the umask allows, as run files


def baseline_predictions(root: Path, labels: Any, device: str) -> Any | None:
    """Return the baseline's saved validation predictions when they were made on these labels and this device.

    None when there are none (an older run) or they do not match: the round then predicts the baseline again.
    """
    path = root / PREDICTIONS_FILE
    if not path.is_file():
        return None
    with safe_open(str(path), framework="pt") as f:
        if (f.metadata() or {}).get("device") != device:
            return None
        saved_labels, preds = f.get_tensor("labels"), f.get_tensor("preds").clone()  # not a view of the file
    if saved_labels.shape != labels.shape or not bool((saved_labels == labels.cpu()).all()):
        return None
    return preds


def baseline_message(record: EvalRecord, out: FormsMeasurement, forms: list[str]) -> str:
    """Say in one line what the baseline measured: accuracy, speed, size, its forms and the quantization-only peer."""
    threads = record.threads
    by = record.predicted_by
    message = (
        f"baseline top-1 {record.accuracy:.2f}% on {record.n_samples} images"
        + (f" (predicted by its {by} form: faster, logits checked against torch's)" if by else "")
        + f", {record.latency_ms:.2f} ms batch-1 "
        f"on {record.device} ({threads} thread{'s' if threads != 1 else ''}), {record.params:,} params, "
        f"{record.size_mb:.2f} MB"
    )
    if out.variants[1:]:
        message += "; unpruned forms: " + out.line
    if record.peer:
        message += (
            f"; quantization only (no pruning): {record.peer['name']} {record.peer['speedup']:.2f}x, "
            f"{record.peer['accuracy']:.2f}%"
        )
    missing = nncf_missing() if any(f.startswith("ov_") for f in forms) else None
    if missing:  # said once: later rounds build only the forms that worked here
        message += f"; {missing}: the OpenVINO forms are left out of this run"
    return message + out.notice


def measure_unpruned(
    baseline: ArtifactRef,
    objective: Objective,
    ctx: Context,
    *,
    root: Path,
    tensors: dict[str, Any],
    macs: float | None,
    allowed_ids: list[int] | None = None,
    progress: Callable[[int, int, str], None] | None = None,
) -> tuple[EvalRecord, str]:
    """Measure the baseline and its ONNX Runtime / OpenVINO forms side by side.

    Args:
        baseline: The baseline artifact (paths relative to `root`).
        objective: Budget and target (the quantization-only peer is the fastest form within the budget).
        ctx: Backend, device, threads and latency settings.
        root: The run folder.
        tensors: The run's validation and calibration images.
        macs: One image's MACs from the profile (None when not profiled).
        allowed_ids: Model ids predictions are restricted to.
        progress: Called with (done, total, label) before and after the measurement.

    Returns:
        The baseline's EvalRecord (with its forms and peer) and its one-line summary.
    """
    report = progress or (lambda done, total, label: None)
    pixels, labels = tensors["eval_pixels"], tensors["eval_labels"]
    loaded = load_artifact(root / baseline.path)
    model = loaded.model
    forms = forms_for_backend(ctx.backend, ALL_FORMS)
    eligible = eligible_forms(ctx.backend, forms, "baseline")
    sources = [f for f in forms if eligible is not None and f not in eligible]  # the others start from their file
    with eval_threads(ctx.threads) as threads:
        device = measure_device(ctx.device, forms)
        report(0, 2, "forms")
        plan = FormsPlan(
            fp32=model,
            forms=forms,
            images=EvalImages(pixels, labels, tensors["calib_pixels"]),
            out_dir=root / run_layout.BASELINE_FORMS,
            rel=lambda p: str(Path(p).resolve().relative_to(root.resolve())),
            objective=objective,
            torch_forms={"torch_fp32": ("baseline", baseline.size_bytes, baseline.path)},
            processor=loaded.processor,
            extra={"params": baseline.params, "macs": macs},
            check_images=CHECK_IMAGES,
            run=root,
            model_paths={"baseline": root / baseline.path},
            eligible=eligible,
            sources=sources,
            source_note=BACKEND_SOURCE.format(backend=ctx.backend) if sources else None,
        )
        settings = MeasureSettings.of(ctx, device, threads, allowed_ids)
        with int8_reuse(root / run_layout.INT8_REUSE, tensors["calib_pixels"], drop_after=True):  # the profile's
            out = evaluate_forms({"baseline": model.to(device)}, plan, settings)
        save_baseline_predictions(root, out.measured["baseline"]["preds"], labels, device)
        report(2, 2, "")
    record = baseline_record(baseline, out, model, settings, macs)
    record.timing = {**(record.timing or {}), FORM_SAMPLES: out.samples}  # the final timing's `cannot_win` reads them
    record.peer = quantization_only_peer(out.variants, record, objective, ctx.backend, out.samples)
    return record, baseline_message(record, out, forms)


def baseline_record(
    baseline: ArtifactRef, out: FormsMeasurement, model: Any, settings: MeasureSettings, macs: float | None
) -> EvalRecord:
    """Build the baseline's EvalRecord from its measurement (its own speed-up 1, agreement 100%)."""
    lat = out.measured["baseline"]
    return EvalRecord(
        name="baseline",
        accuracy=lat["accuracy"],
        agreement=100.0,
        n_samples=len(lat["preds"]),
        latency_ms=lat["latency_ms"],
        latency_batch_ms=lat["latency_batch_ms"],
        batch_size=settings.latency_batch,
        baseline_latency_ms=lat["latency_ms"],
        speedup=1.0,
        memory_bytes=state_bytes(model),
        size_mb=baseline.size_bytes / 1e6,
        params=baseline.params,
        macs=int(macs or 0),
        threads=settings.threads,
        device=settings.device,
        variants=out.variants,
        timing=out.timing,
        predicted_by=(out.timing.get("predicted_by") or {}).get("baseline"),
    )
