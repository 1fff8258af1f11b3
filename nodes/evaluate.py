"""Evaluation agent: accuracy, agreement, latency, memory, size, params and MACs, side by side with the baseline."""

from __future__ import annotations

from typing import Any

from langgraph.runtime import Runtime

from profiling_agent.nodes.common import context_of, emit, event, load_artifact_model, run_dir
from profiling_agent.state import Context, EvalRecord, State


def _record(name: str, **values: Any) -> dict[str, Any]:
    return EvalRecord(name=name, **values).model_dump()


def evaluate(state: State, runtime: Runtime[Context]) -> dict[str, Any]:
    """Evaluate this iteration's candidate and the baseline on the same subset, latency measured interleaved."""
    from profiling_agent.tools.data.prepare import load_prepared
    from profiling_agent.tools.device import resolve_device, set_threads
    from profiling_agent.tools.evaluation.latency import measure_latency
    from profiling_agent.tools.evaluation.metrics import agreement, predict, top1
    from profiling_agent.tools.models.sizes import state_bytes

    ctx = context_of(runtime)
    threads = set_threads(ctx.threads)
    it = state.iteration
    current = dict(state.current or {})
    tensors = load_prepared(run_dir(state) / state.data["path"])
    pixels, labels = tensors["eval_pixels"], tensors["eval_labels"]
    allowed = (state.labels or {}).get("allowed_ids")
    failed = current.get("status") != "ok"
    models = {"baseline": load_artifact_model(state, state.baseline).model}
    if not failed:
        models["candidate"] = load_artifact_model(state, current["artifact"]).model
        if current.get("quantized"):  # fp32 pruned model too, so the effect of quantization is measured
            models["pruned"] = load_artifact_model(state, current["pruned"]).model
    # dynamically quantized torch models run on the CPU only: then both are measured there
    device = "cpu" if current.get("quantized") else str(resolve_device(ctx.device))
    models = {name: m.to(device) for name, m in models.items()}
    emit(runtime, kind="progress", task=f"iteration {it}: evaluating", done=0, total=2, label="accuracy")
    kw = {"batch_size": ctx.eval_batch, "device": device, "allowed_ids": allowed}
    preds = {name: predict(m, pixels, **kw) for name, m in models.items() if name != "pruned"}
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
    b_lat, base_preds = lat["baseline"], preds["baseline"]
    common = {"n_samples": len(labels), "batch_size": ctx.latency_batch, "threads": threads}
    update: dict[str, Any] = {}
    if state.baseline_eval is None:
        update["baseline_eval"] = _record(
            "baseline",
            accuracy=top1(base_preds, labels),
            agreement=100.0,
            latency_ms=b_lat["latency_ms"],
            latency_batch_ms=b_lat["latency_batch_ms"],
            baseline_latency_ms=b_lat["latency_ms"],
            speedup=1.0,
            memory_bytes=state_bytes(models["baseline"]),
            size_mb=state.baseline["size_bytes"] / 1e6,
            params=int(state.baseline["params"]),
            macs=int((state.profile or {}).get("totals", {}).get("macs", 0)),
            **common,
        )
    if failed:
        update["history"] = event("evaluate", f"candidate failed, nothing to evaluate: {current.get('error')}", it)
        return update
    c_lat, cand_preds = lat["candidate"], preds["candidate"]
    record = _record(
        f"iter_{it:02d}",
        accuracy=top1(cand_preds, labels),
        agreement=agreement(cand_preds, base_preds),
        latency_ms=c_lat["latency_ms"],
        latency_batch_ms=c_lat["latency_batch_ms"],
        baseline_latency_ms=b_lat["latency_ms"],
        speedup=b_lat["latency_ms"] / c_lat["latency_ms"] if c_lat["latency_ms"] > 0 else 0.0,
        memory_bytes=state_bytes(models["candidate"]),
        size_mb=current["artifact"]["size_bytes"] / 1e6,
        params=int(current["artifact"]["params"]),
        macs=int(current.get("macs", 0)),
        **common,
    )
    record["device"] = device
    if "pruned" in lat:  # batch-1 and batch-N speed of quantization itself, measured side by side
        p_lat = lat["pruned"]
        record["pruned_latency_ms"] = p_lat["latency_ms"]
        record["pruned_latency_batch_ms"] = p_lat["latency_batch_ms"]
        record["quant_speedup"] = p_lat["latency_ms"] / c_lat["latency_ms"] if c_lat["latency_ms"] > 0 else 0.0
        record["quant_speedup_batch"] = (
            p_lat["latency_batch_ms"] / c_lat["latency_batch_ms"] if c_lat["latency_batch_ms"] > 0 else 0.0
        )
    current["eval"] = record
    base_acc = (update.get("baseline_eval") or state.baseline_eval)["accuracy"]
    message = (
        f"top-1 {record['accuracy']:.2f}% (baseline {base_acc:.2f}%), agreement {record['agreement']:.1f}%, "
        f"{record['speedup']:.2f}x batch-1 speed, {record['params']:,} params, {record['size_mb']:.2f} MB"
    )
    update.update({"current": current, "history": event("evaluate", message, it)})
    return update
