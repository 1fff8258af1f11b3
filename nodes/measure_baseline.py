"""Baseline agent: measure the untouched model once, in every deployable form (the quantization-only peer)."""

from __future__ import annotations

from typing import Any

from langgraph.runtime import Runtime

from profiling_agent.nodes.common import (
    allowed_ids,
    context_of,
    emit,
    event,
    load_artifact_model,
    prepared,
    rel,
    run_dir,
)
from profiling_agent.state import Context, EvalRecord, State

CHECK_IMAGES = 32  # validation images each form's logits are compared on against torch


def measure_baseline(state: State, runtime: Runtime[Context]) -> dict[str, Any]:
    """Measure the baseline and its ONNX Runtime / OpenVINO forms side by side; every candidate is compared with it."""
    from profiling_agent.tools.device import resolve_device
    from profiling_agent.tools.evaluation.delivery import quantization_only_peer
    from profiling_agent.tools.evaluation.form_eval import eval_threads, evaluate_forms
    from profiling_agent.tools.models.sizes import state_bytes
    from profiling_agent.tools.runtimes.forms import ALL_FORMS, forms_for_backend
    from profiling_agent.tools.runtimes.openvino_model import nncf_missing

    assert state.baseline is not None  # saved by acquire
    ctx = context_of(runtime)
    tensors = prepared(state)
    pixels, labels = tensors["eval_pixels"], tensors["eval_labels"]
    loaded = load_artifact_model(state, state.baseline)
    model = loaded.model
    forms = forms_for_backend(ctx.backend, ALL_FORMS)
    with eval_threads(ctx.threads) as threads:
        device = "cpu" if forms else str(resolve_device(ctx.device))
        emit(runtime, kind="progress", task="measuring the baseline", done=0, total=2, label="forms")
        out = evaluate_forms(
            {"baseline": model.to(device)},
            fp32=model,
            forms=forms,
            calib_pixels=tensors["calib_pixels"],
            pixels=pixels,
            labels=labels,
            out_dir=run_dir(state) / "baseline_forms",
            rel=lambda p: rel(state, str(p)),
            processor=loaded.processor,
            extra={
                "params": state.baseline.params,
                "macs": state.profile.totals.get("macs") if state.profile else None,
            },
            objective=state.objective,
            ctx=ctx,
            device=device,
            threads=threads,
            allowed_ids=allowed_ids(state),
            check_images=CHECK_IMAGES,
            torch_forms={"torch_fp32": ("baseline", state.baseline.size_bytes, state.baseline.path)},
        )
        emit(runtime, kind="progress", task="measuring the baseline", done=2, total=2, label="")
    lat = out["measured"]["baseline"]
    record = EvalRecord(
        name="baseline",
        accuracy=lat["accuracy"],
        agreement=100.0,
        n_samples=len(labels),
        latency_ms=lat["latency_ms"],
        latency_batch_ms=lat["latency_batch_ms"],
        batch_size=ctx.latency_batch,
        baseline_latency_ms=lat["latency_ms"],
        speedup=1.0,
        memory_bytes=state_bytes(model),
        size_mb=state.baseline.size_bytes / 1e6,
        params=state.baseline.params,
        macs=int(state.profile.totals.get("macs") or 0) if state.profile else 0,
        threads=threads,
        device=device,
        variants=out["variants"],
        timing=out["timing"],
    )
    base = record.model_dump()
    record.peer = quantization_only_peer(out["variants"], base, state.objective)
    message = (
        f"baseline top-1 {record.accuracy:.2f}% on {record.n_samples} images, {record.latency_ms:.2f} ms batch-1 "
        f"on {device} ({threads} thread{'s' if threads != 1 else ''}), {record.params:,} params, "
        f"{record.size_mb:.2f} MB"
    )
    if out["variants"][1:]:
        message += "; unpruned forms: " + out["line"]
    if record.peer:
        message += (
            f"; quantization only (no pruning): {record.peer['name']} {record.peer['speedup']:.2f}x, "
            f"{record.peer['accuracy']:.2f}%"
        )
    missing = nncf_missing() if any(f.startswith("ov_") for f in forms) else None
    if missing:  # said once: later rounds build only the forms that worked here
        message += f"; {missing}: the OpenVINO forms are left out of this run"
    message += out["notice"]
    return {"baseline_eval": record.model_dump(), "history": event("measure_baseline", message)}
