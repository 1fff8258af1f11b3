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


def evaluate(state: State, runtime: Runtime[Context]) -> dict[str, Any]:
    """Measure the candidate's forms (torch, ONNX Runtime, OpenVINO) beside the baseline and the unpruned peer."""
    from profiling_agent.tools.device import resolve_device
    from profiling_agent.tools.evaluation.bootstrap import correct, paired_delta_ci
    from profiling_agent.tools.evaluation.delivery import delivery_note, vs_peer
    from profiling_agent.tools.evaluation.form_eval import eval_threads, evaluate_forms
    from profiling_agent.tools.evaluation.selection import choose_variant, within_budget
    from profiling_agent.tools.io import sha256_path
    from profiling_agent.tools.models.sizes import state_bytes
    from profiling_agent.tools.runtimes.forms import eligible_forms, forms_for_backend, round_forms

    base_eval = state.baseline_eval
    current = current_candidate(state)
    assert base_eval is not None and current.artifact is not None  # measure_baseline and quantize ran
    ctx = context_of(runtime)
    backend = ctx.backend if ctx.backend in ("torch", "onnxruntime", "openvino", "auto") else "auto"
    it = state.iteration
    tensors = prepared(state)
    pixels, labels = tensors["eval_pixels"], tensors["eval_labels"]
    cand = load_artifact_model(state, current.artifact)
    torch_name = f"torch_{sorted(set(_dtypes(cand.recipe)))[0]}" if current.quantized else "torch_fp32"
    models = {"baseline": load_artifact_model(state, state.baseline).model, torch_name: cand.model}
    fp32 = cand.model
    fp32_ref = current.recovered or current.pruned  # the fp32 pruned model, after recovery when it ran
    torch_forms = {torch_name: (torch_name, current.artifact.size_bytes, current.artifact.path)}
    if current.quantized and fp32_ref:  # the fp32 pruned model: its own variant and what the runtimes convert
        fp32 = models["torch_fp32"] = load_artifact_model(state, fp32_ref).model
        torch_forms["torch_fp32"] = ("torch_fp32", fp32_ref.size_bytes, fp32_ref.path)
    if current.recovered and current.pruned:  # the one-shot weights: accuracy before recovery (not timed)
        models[UNRECOVERED] = load_artifact_model(state, current.pruned).model
    budget = state.objective.max_acc_drop
    base_variants = [v.model_dump() for v in base_eval.variants]
    forms = forms_for_backend(backend, round_forms(base_variants, base_eval.accuracy, budget))
    params = current.artifact.params  # what EvalRecord.params says
    emit(runtime, kind="progress", task=f"iteration {it}: evaluating", done=0, total=3, label="backends")
    with eval_threads(ctx.threads) as threads:
        # dynamically quantized torch models and the runtimes' forms run on the CPU only: then all are measured there
        device = "cpu" if current.quantized or forms else str(resolve_device(ctx.device))
        models = {name: m.to(device) for name, m in models.items()}
        out = evaluate_forms(
            models,
            fp32=fp32,
            forms=forms,
            calib_pixels=tensors["calib_pixels"],
            pixels=pixels,
            labels=labels,
            out_dir=iteration_dir(state, it) / "variants",
            rel=lambda p: rel(state, str(p)),
            objective=state.objective,
            ctx=ctx,
            device=device,
            threads=threads,
            torch_forms=torch_forms,
            processor=cand.processor,
            extra={"params": params, "macs": current.macs},
            allowed_ids=allowed_ids(state),
            check_images=CHECK_IMAGES,
            untimed=[UNRECOVERED],
            peer=base_eval.peer,
            peer_root=absolute(state, "."),
        )
    emit(runtime, kind="progress", task=f"iteration {it}: evaluating", done=3, total=3, label="")
    measured, variants, built = out["measured"], out["variants"], out["built"]
    base = base_eval.model_dump()
    eligible = eligible_forms(backend, [v.name for v in built], torch_name)
    chosen = choose_variant(variants, base, state.objective, eligible)
    failed = [f"{v.name}: {v.error}" for v in built if v.status == "failed"]
    note = delivery_note(chosen, bool(chosen) and within_budget(chosen, base, state.objective), failed, backend)
    if chosen is None:  # a runtime asked for but none of its forms works: the plan's torch model
        chosen = next(v for v in variants if v["name"] == torch_name)
        note = f"no {backend} form works; the plan's torch model is recorded" + (
            f" ({'; '.join(failed)})" if failed else ""
        )
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
        params=params,
        macs=int(current.macs or 0),
        threads=threads,
        device=device,
        variants=variants,
        delivered=name,
        delivery_note=note,
        timing=out["timing"],
    )
    peer_key = out["peer_key"]
    if base_eval.peer and (peer_key or base_eval.peer.get("name") == "torch_fp32"):
        p_lat = measured[peer_key or "baseline"]
        record.peer = {
            **base_eval.peer,
            "latency_ms": p_lat["latency_ms"],
            "latency_batch_ms": p_lat["latency_batch_ms"],
            "speedup": p_lat["speedup"],
        }
        record.peer["vs_peer"] = vs_peer(record.model_dump())
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
            params=params,
        )
    low, high = record.acc_delta_ci
    message = (
        f"{name}: validation top-1 {record.accuracy:.2f}% (baseline {base_eval.accuracy:.2f}%"
        + (
            f", {record.accuracy_before_recovery:.2f}% before recovery"
            if record.accuracy_before_recovery is not None
            else ""
        )
        + "; change "
        f"{record.accuracy - base_eval.accuracy:+.2f} pp, 95% CI [{low:+.2f}, {high:+.2f}]), "
        f"agreement {record.agreement:.1f}%, {record.speedup:.2f}x batch-1 speed"
        + (
            f" ({record.peer['vs_peer']:.2f}x quantization alone: {record.peer['name']} of the unpruned model)"
            if record.peer and record.peer.get("vs_peer")
            else ""
        )
        + f", {record.params:,} params, {record.size_mb:.2f} MB; forms: "
        + out["line"]
        + out["notice"]
    )
    return {"current": current.model_dump(), "history": event("evaluate", message, it)}


def _dtypes(recipe: dict[str, Any]) -> list[str]:
    schemes = recipe.get("quantization") or {}
    return [str(s.get("dtype", "qint8")) for s in schemes.values()] or ["qint8"]
