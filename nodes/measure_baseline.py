"""Baseline agent: measure the untouched model once (accuracy, latency, memory, size, params, MACs)."""

from __future__ import annotations

from typing import Any

from langgraph.runtime import Runtime

from profiling_agent.nodes.common import allowed_ids, context_of, emit, event, load_artifact_model, prepared
from profiling_agent.state import Context, EvalRecord, State


def measure_baseline(state: State, runtime: Runtime[Context]) -> dict[str, Any]:
    """Measure the baseline on the evaluation subset; every candidate is compared with this record."""
    from profiling_agent.tools.device import resolve_device, set_threads
    from profiling_agent.tools.evaluation.latency import measure_latency
    from profiling_agent.tools.evaluation.metrics import accuracy_batch, predict, top1
    from profiling_agent.tools.models.sizes import state_bytes

    assert state.baseline is not None  # saved by acquire
    ctx = context_of(runtime)
    threads = set_threads(ctx.threads)
    device = str(resolve_device(ctx.device))
    tensors = prepared(state)
    pixels, labels = tensors["eval_pixels"], tensors["eval_labels"]
    model = load_artifact_model(state, state.baseline).model.to(device)
    emit(runtime, kind="progress", task="measuring the baseline", done=0, total=2, label="accuracy")
    batch = accuracy_batch(ctx.eval_batch, device)  # on a GPU: large batches
    preds = predict(model, pixels, batch_size=batch, device=device, allowed_ids=allowed_ids(state))
    emit(runtime, kind="progress", task="measuring the baseline", done=1, total=2, label="latency")
    lat = measure_latency(
        {"baseline": model},
        pixels[: ctx.latency_batch],
        batch_size=ctx.latency_batch,
        warmup=ctx.latency_warmup,
        repeats=ctx.latency_repeats,
        device=device,
    )["baseline"]
    emit(runtime, kind="progress", task="measuring the baseline", done=2, total=2, label="")
    record = EvalRecord(
        name="baseline",
        accuracy=top1(preds, labels),
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
    )
    message = (
        f"baseline top-1 {record.accuracy:.2f}% on {record.n_samples} images, {record.latency_ms:.2f} ms batch-1 "
        f"on {device}, {record.params:,} params, {record.size_mb:.2f} MB"
    )
    return {"baseline_eval": record.model_dump(), "history": event("measure_baseline", message)}
