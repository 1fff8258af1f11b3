"""Evaluation agent: every backend form of a candidate measured beside the baseline; the fastest is delivered."""

from __future__ import annotations

from typing import Any

from langgraph.runtime import Runtime

from profiling_agent.nodes.common import (
    absolute,
    allowed_ids,
    context_of,
    current_candidate,
    emit,
    event,
    iteration_dir,
    load_artifact_model,
    prepared,
    rel,
)
from profiling_agent.state import ArtifactRef, Context, EvalRecord, State

UNRECOVERED = "unrecovered"  # the one-shot pruned weights, predicted beside the forms for the before-recovery accuracy
CHECK_IMAGES = 32  # validation images each ONNX variant's logits are compared on against torch


def _ratio(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator > 0 else 0.0


def _build_ort(state: State, fp32: Any, processor: Any, tensors: dict[str, Any], backend: str, threads: int):
    """Export and quantize the pruned FP32 model with ONNX Runtime (nothing when the backend is torch)."""
    from profiling_agent.tools.compression.backends import build_ort_variants

    if backend == "torch":
        return []
    current = state.current
    params = current.artifact.params if current and current.artifact else None  # what EvalRecord.params says
    extra = {"params": params, "macs": current.macs if current else None}
    return build_ort_variants(
        fp32,
        tensors["calib_pixels"],
        tensors["eval_pixels"][:CHECK_IMAGES],
        iteration_dir(state, state.iteration) / "variants",
        threads=threads,
        processor=processor,
        extra=extra,
    )


def evaluate(state: State, runtime: Runtime[Context]) -> dict[str, Any]:
    """Measure the candidate's forms (torch FP32, torch quantized, ORT FP32/dynamic/static) beside the baseline."""
    from profiling_agent.tools.device import resolve_device, set_threads
    from profiling_agent.tools.evaluation.bootstrap import correct, paired_delta_ci
    from profiling_agent.tools.evaluation.metrics import concurrent_models
    from profiling_agent.tools.evaluation.selection import choose_variant
    from profiling_agent.tools.evaluation.variants import measure_forms, recipe_summary, variant_record
    from profiling_agent.tools.io import sha256_path
    from profiling_agent.tools.models.sizes import state_bytes

    base_eval = state.baseline_eval
    current = current_candidate(state)
    assert base_eval is not None and current.artifact is not None  # measure_baseline and quantize ran
    ctx = context_of(runtime)
    backend = ctx.backend if ctx.backend in ("torch", "onnxruntime", "auto") else "auto"
    threads = set_threads(ctx.threads)
    it = state.iteration
    tensors = prepared(state)
    pixels, labels = tensors["eval_pixels"], tensors["eval_labels"]
    cand = load_artifact_model(state, current.artifact)
    torch_name = f"torch_{sorted(set(_dtypes(cand.recipe)))[0]}" if current.quantized else "torch_fp32"
    models = {"baseline": load_artifact_model(state, state.baseline).model, torch_name: cand.model}
    fp32 = cand.model
    fp32_ref = current.recovered or current.pruned  # the fp32 pruned model, after recovery when it ran
    if current.quantized and fp32_ref:  # the fp32 pruned model: its own variant and what ORT exports
        fp32 = models["torch_fp32"] = load_artifact_model(state, fp32_ref).model
    if current.recovered and current.pruned:  # the one-shot weights: accuracy before recovery (not timed)
        models[UNRECOVERED] = load_artifact_model(state, current.pruned).model
    emit(runtime, kind="progress", task=f"iteration {it}: evaluating", done=0, total=3, label="backends")
    built = _build_ort(state, fp32, cand.processor, tensors, backend, threads)
    models.update({v.name: v.model for v in built if v.status == "ok"})
    # dynamically quantized torch models and ONNX Runtime run on the CPU only: then all are measured there
    device = "cpu" if current.quantized or built else str(resolve_device(ctx.device))
    models = {name: m.to(device) for name, m in models.items()}
    emit(runtime, kind="progress", task=f"iteration {it}: evaluating", done=1, total=3, label="accuracy and latency")
    measured = measure_forms(
        models,
        pixels,
        labels,
        batch_size=ctx.latency_batch,
        eval_batch=ctx.eval_batch,
        warmup=ctx.latency_warmup,
        repeats=ctx.latency_repeats,
        device=device,
        allowed_ids=allowed_ids(state),
        timed=[n for n in models if n != UNRECOVERED],
        parallel=concurrent_models(device, threads, len(models)),  # accuracy passes only; timing runs alone
    )
    emit(runtime, kind="progress", task=f"iteration {it}: evaluating", done=3, total=3, label="")
    sizes = {torch_name: current.artifact.size_bytes}
    if "torch_fp32" in models and fp32_ref and torch_name != "torch_fp32":
        sizes["torch_fp32"] = fp32_ref.size_bytes
    paths = {torch_name: current.artifact.path}
    if fp32_ref and torch_name != "torch_fp32":
        paths["torch_fp32"] = fp32_ref.path
    variants = [variant_record(n, measured[n], size_bytes=sizes[n], path=paths.get(n)) for n in sizes]
    for v in built:
        variants.append(
            variant_record(
                v.name,
                measured.get(v.name) if v.status == "ok" else None,
                size_bytes=v.size_bytes,
                path=rel(state, v.path) if v.path else None,
                error=v.error,
                max_abs_diff=v.max_abs_diff,
                recipe=recipe_summary(v.recipe),
            )
        )
    base = base_eval.model_dump()
    eligible = {"torch": [torch_name], "onnxruntime": [v.name for v in built], "auto": None}[backend]
    chosen = choose_variant(variants, base, state.objective, eligible)
    note = _delivery_note(backend, built, chosen)
    if chosen is None:  # onnxruntime asked for but no ORT variant works: the plan's torch model
        chosen = next(v for v in variants if v["name"] == torch_name)
    name = chosen["name"]
    delivered_model = models[name]
    b_lat, c_lat = measured["baseline"], measured[name]
    record = EvalRecord(
        name=f"iter_{it:02d}",
        accuracy=c_lat["accuracy"],
        agreement=c_lat["agreement"],
        n_samples=len(labels),
        latency_ms=c_lat["latency_ms"],
        latency_batch_ms=c_lat["latency_batch_ms"],
        batch_size=ctx.latency_batch,
        baseline_latency_ms=b_lat["latency_ms"],
        speedup=c_lat["speedup"],
        memory_bytes=state_bytes(delivered_model) or int((chosen["size_mb"] or 0) * 1e6),
        size_mb=chosen["size_mb"] or current.artifact.size_bytes / 1e6,
        params=current.artifact.params,
        macs=int(current.macs or 0),
        threads=threads,
        device=device,
        variants=variants,
        delivered=name,
        delivery_note=note,
    )
    if "torch_fp32" in measured and torch_name != "torch_fp32":  # the speed of torch quantization itself
        p_lat, q_lat = measured["torch_fp32"], measured[torch_name]
        record.pruned_latency_ms = p_lat["latency_ms"]
        record.pruned_latency_batch_ms = p_lat["latency_batch_ms"]
        record.quant_speedup = _ratio(p_lat["latency_ms"], q_lat["latency_ms"])
        record.quant_speedup_batch = _ratio(p_lat["latency_batch_ms"], q_lat["latency_batch_ms"])
    record.acc_delta_ci = list(
        paired_delta_ci(
            correct(measured[name]["preds"], labels),
            correct(measured["baseline"]["preds"], labels),
            seed=state.dataset.seed,
        )
    )
    if UNRECOVERED in measured:
        before = measured[UNRECOVERED]
        record.accuracy_before_recovery, record.agreement_before_recovery = before["accuracy"], before["agreement"]
    current.eval = record
    current.delivered = None
    if name != torch_name and chosen["path"]:
        current.delivered = ArtifactRef(
            path=chosen["path"],
            sha256=sha256_path(absolute(state, chosen["path"])),
            size_bytes=int((chosen["size_mb"] or 0) * 1e6),
            params=current.artifact.params,
        )
    low, high = record.acc_delta_ci
    message = (
        f"delivered {name}: validation top-1 {record.accuracy:.2f}% (baseline {base_eval.accuracy:.2f}%"
        + (
            f", {record.accuracy_before_recovery:.2f}% before recovery"
            if record.accuracy_before_recovery is not None
            else ""
        )
        + "; change "
        f"{record.accuracy - base_eval.accuracy:+.2f} pp, 95% CI [{low:+.2f}, {high:+.2f}]), "
        f"agreement {record.agreement:.1f}%, {record.speedup:.2f}x batch-1 speed, {record.params:,} params, "
        f"{record.size_mb:.2f} MB; " + _variants_line(variants)
    )
    return {"current": current.model_dump(), "history": event("evaluate", message, it)}


def _dtypes(recipe: dict[str, Any]) -> list[str]:
    schemes = recipe.get("quantization") or {}
    return [str(s.get("dtype", "qint8")) for s in schemes.values()] or ["qint8"]


def _delivery_note(backend: str, built: list[Any], chosen: dict[str, Any] | None) -> str:
    """Say why the delivered variant was delivered, and why ONNX Runtime was not when it failed."""
    failed = [f"{v.name}: {v.error}" for v in built if v.status != "ok"]
    if backend == "torch":
        return "backend torch: the plan's torch model"
    if chosen is None:
        return "no ONNX Runtime variant works; the plan's torch model is delivered (" + "; ".join(failed) + ")"
    why = f"fastest measured form within the accuracy budget ({backend})"
    return why + (f"; failed: {'; '.join(failed)}" if failed else "")


def _variants_line(variants: list[dict[str, Any]]) -> str:
    parts = []
    for v in variants:
        if v["status"] == "ok":
            parts.append(f"{v['name']} {v['speedup']:.2f}x {v['accuracy']:.1f}%")
        else:
            parts.append(f"{v['name']} failed")
    return "variants: " + ", ".join(parts)
