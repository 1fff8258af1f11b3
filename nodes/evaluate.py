"""Evaluation agent: accuracy, agreement, latency, memory, size, params and MACs, side by side with the baseline."""

from __future__ import annotations

from typing import Any

from langgraph.runtime import Runtime

from profiling_agent.nodes.common import (
    allowed_ids,
    context_of,
    current_candidate,
    emit,
    event,
    load_artifact_model,
    prepared,
)
from profiling_agent.state import Context, EvalRecord, State


def _ratio(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator > 0 else 0.0


def evaluate(state: State, runtime: Runtime[Context]) -> dict[str, Any]:
    """Evaluate this iteration's candidate on the baseline's subset, latency measured interleaved with the baseline."""
    from profiling_agent.tools.device import resolve_device, set_threads
    from profiling_agent.tools.evaluation.bootstrap import correct, paired_delta_ci
    from profiling_agent.tools.evaluation.latency import measure_latency
    from profiling_agent.tools.evaluation.metrics import agreement, predict, top1
    from profiling_agent.tools.models.sizes import state_bytes

    base_eval = state.baseline_eval
    current = current_candidate(state)
    assert base_eval is not None and current.artifact is not None  # measure_baseline and quantize ran
    ctx = context_of(runtime)
    threads = set_threads(ctx.threads)
    it = state.iteration
    tensors = prepared(state)
    pixels, labels = tensors["eval_pixels"], tensors["eval_labels"]
    models = {
        "baseline": load_artifact_model(state, state.baseline).model,
        "candidate": load_artifact_model(state, current.artifact).model,
    }
    fp32 = current.recovered or current.pruned
    if current.quantized and fp32:  # fp32 pruned model too, so the effect of quantization is measured
        models["pruned"] = load_artifact_model(state, fp32).model
    if current.recovered and current.pruned:  # the one-shot pruned weights: accuracy before recovery
        models["unrecovered"] = load_artifact_model(state, current.pruned).model
    # dynamically quantized torch models run on the CPU only: then both are measured there
    device = "cpu" if current.quantized else str(resolve_device(ctx.device))
    models = {name: m.to(device) for name, m in models.items()}
    emit(runtime, kind="progress", task=f"iteration {it}: evaluating", done=0, total=2, label="accuracy")
    kw = {"batch_size": ctx.eval_batch, "device": device, "allowed_ids": allowed_ids(state)}
    preds = {
        name: predict(models[name], pixels, **kw) for name in ("baseline", "candidate", "unrecovered") if name in models
    }
    models.pop("unrecovered", None)  # its latency is the recovered model's
    emit(runtime, kind="progress", task=f"iteration {it}: evaluating", done=1, total=2, label="latency")
    lat = measure_latency(
        models,
        pixels[: ctx.latency_batch],
        batch_size=ctx.latency_batch,
        warmup=ctx.latency_warmup,
        repeats=ctx.latency_repeats,
        device=device,
    )
    emit(runtime, kind="progress", task=f"iteration {it}: evaluating", done=2, total=2, label="")
    b_lat, c_lat = lat["baseline"], lat["candidate"]
    record = EvalRecord(
        name=f"iter_{it:02d}",
        accuracy=top1(preds["candidate"], labels),
        agreement=agreement(preds["candidate"], preds["baseline"]),
        n_samples=len(labels),
        latency_ms=c_lat["latency_ms"],
        latency_batch_ms=c_lat["latency_batch_ms"],
        batch_size=ctx.latency_batch,
        baseline_latency_ms=b_lat["latency_ms"],
        speedup=_ratio(b_lat["latency_ms"], c_lat["latency_ms"]),
        memory_bytes=state_bytes(models["candidate"]),
        size_mb=current.artifact.size_bytes / 1e6,
        params=current.artifact.params,
        macs=int(current.macs or 0),
        threads=threads,
        device=device,
    )
    if "pruned" in lat:  # batch-1 and batch-N speed of quantization itself, measured side by side
        p_lat = lat["pruned"]
        record.pruned_latency_ms = p_lat["latency_ms"]
        record.pruned_latency_batch_ms = p_lat["latency_batch_ms"]
        record.quant_speedup = _ratio(p_lat["latency_ms"], c_lat["latency_ms"])
        record.quant_speedup_batch = _ratio(p_lat["latency_batch_ms"], c_lat["latency_batch_ms"])
    record.acc_delta_ci = list(
        paired_delta_ci(
            correct(preds["candidate"], labels), correct(preds["baseline"], labels), seed=state.dataset.seed
        )
    )
    if "unrecovered" in preds:
        record.accuracy_before_recovery = top1(preds["unrecovered"], labels)
        record.agreement_before_recovery = agreement(preds["unrecovered"], preds["baseline"])
    current.eval = record
    low, high = record.acc_delta_ci
    message = (
        f"validation top-1 {record.accuracy:.2f}% (baseline {base_eval.accuracy:.2f}%"
        + (
            f", {record.accuracy_before_recovery:.2f}% before recovery"
            if record.accuracy_before_recovery is not None
            else ""
        )
        + "; change "
        f"{record.accuracy - base_eval.accuracy:+.2f} pp, 95% CI [{low:+.2f}, {high:+.2f}]), "
        f"agreement {record.agreement:.1f}%, "
        f"{record.speedup:.2f}x batch-1 speed, {record.params:,} params, {record.size_mb:.2f} MB"
    )
    return {"current": current.model_dump(), "history": event("evaluate", message, it)}
