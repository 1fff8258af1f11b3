"""Evaluate one candidate: every backend form measured beside the baseline, the fastest within budget delivered."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from profiling_agent.state import ArtifactRef, Candidate, Context, EvalRecord, Objective, VariantRecord
from profiling_agent.tools import run_layout
from profiling_agent.tools.device import measure_device
from profiling_agent.tools.evaluation import scoring
from profiling_agent.tools.evaluation.baseline_eval import baseline_predictions
from profiling_agent.tools.evaluation.bootstrap import correct, paired_delta_ci
from profiling_agent.tools.evaluation.delivery import delivery_note, vs_peer
from profiling_agent.tools.evaluation.form_eval import eval_threads, evaluate_forms
from profiling_agent.tools.evaluation.records import (
    CandidateModels,
    CandidateRound,
    EvalImages,
    FormsMeasurement,
    FormsPlan,
    MeasureSettings,
)
from profiling_agent.tools.evaluation.selection import choose_form, within_budget
from profiling_agent.tools.evaluation.variants import ratio
from profiling_agent.tools.io import sha256_path
from profiling_agent.tools.models.artifact_load import load_artifact
from profiling_agent.tools.models.sizes import state_bytes
from profiling_agent.tools.runtimes.forms import eligible_forms, forms_for_backend, round_contenders, round_forms
from profiling_agent.tools.settings import Backend, backend_or_default

UNRECOVERED = "unrecovered"  # the one-shot pruned weights, predicted beside the forms for the before-recovery accuracy
CHECK_IMAGES = 32  # validation images each form's logits are compared on against torch


def quantized_dtypes(recipe: dict[str, Any]) -> list[str]:
    """Return the dtypes of a recipe's dynamic quantization schemes (qint8 when none says)."""
    schemes = recipe.get("quantization") or {}
    return [str(s.get("dtype", "qint8")) for s in schemes.values()] or ["qint8"]


def run_backend(ctx: Context) -> Backend:
    """Return the backend the run delivers in (an unknown setting means auto)."""
    return backend_or_default(ctx.backend)


def before_recovery_cost(current: Candidate, base_eval: EvalRecord, n_images: int) -> float:
    """Estimate the seconds of the one-shot weights' accuracy pass on `n_images`, from the baseline's torch timing.

    The baseline's batch latency scaled by the candidate's share of its MACs (0 when either is unknown).
    """
    if not base_eval.macs or not current.macs or not base_eval.batch_size:
        return 0.0
    per_image = base_eval.latency_batch_ms / 1e3 / base_eval.batch_size
    return per_image * current.macs / base_eval.macs * n_images


def candidate_models(current: Candidate, baseline: ArtifactRef, root: Path, *, before: bool = True) -> CandidateModels:
    """Load what one round measures: the baseline, the candidate's torch forms and the one-shot weights.

    `before` False leaves the one-shot weights out (their accuracy before recovery is not measured).
    """
    assert current.artifact is not None  # quantize ran
    cand = load_artifact(root / current.artifact.path)
    torch_name = f"torch_{sorted(set(quantized_dtypes(cand.recipe)))[0]}" if current.quantized else "torch_fp32"
    models = {"baseline": load_artifact(root / baseline.path).model, torch_name: cand.model}
    paths = {"baseline": root / baseline.path, torch_name: root / current.artifact.path}
    fp32 = cand.model
    fp32_ref = current.recovered or current.pruned  # the fp32 pruned model, after recovery when it ran
    torch_forms: dict[str, tuple[str, int, str | None]] = {
        torch_name: (torch_name, current.artifact.size_bytes, current.artifact.path)
    }
    if current.quantized and fp32_ref:  # the fp32 pruned model: its own variant and what the runtimes convert
        fp32 = models["torch_fp32"] = load_artifact(root / fp32_ref.path).model
        paths["torch_fp32"] = root / fp32_ref.path
        torch_forms["torch_fp32"] = ("torch_fp32", fp32_ref.size_bytes, fp32_ref.path)
    if before and current.recovered and current.pruned:  # the one-shot weights: accuracy before recovery (not timed)
        models[UNRECOVERED] = load_artifact(root / current.pruned.path).model
        paths[UNRECOVERED] = root / current.pruned.path
    return CandidateModels(
        models=models,
        paths=paths,
        fp32=fp32,
        torch_name=torch_name,
        torch_forms=torch_forms,
        processor=cand.processor,
    )


def pick_delivered(
    out: FormsMeasurement, base_eval: EvalRecord, objective: Objective, backend: str, torch_name: str
) -> tuple[VariantRecord, str]:
    """Choose the delivered form among the measured variants and say why (the delivery policy)."""
    variants, built = out.variants, out.built
    eligible = eligible_forms(backend, [v.name for v in built], torch_name)
    choice = choose_form(variants, base_eval, objective, eligible, out.samples)
    chosen = choice.chosen if choice is not None else None
    failed = [f"{v.name}: {v.error}" for v in built if v.status == "failed"]
    within = chosen is not None and within_budget(chosen, base_eval, objective)
    note = delivery_note(chosen, within, failed, backend, choice.note() if choice is not None else "")
    if chosen is None:  # a runtime asked for but none of its forms works: the plan's torch model
        chosen = next(v for v in variants if v.name == torch_name)
        note = f"no {backend} form works; the plan's torch model is recorded" + (
            f" ({'; '.join(failed)})" if failed else ""
        )
    return chosen, note


def add_comparisons(
    record: EvalRecord,
    measured: Mapping[str, Mapping[str, Any]],
    peer: Mapping[str, Any] | None,
    peer_key: str | None,
    torch_name: str,
) -> None:
    """Fill the record's comparisons: the quantization-only peer and the speed of torch quantization itself."""
    if peer and (peer_key or peer.get("name") == "torch_fp32"):
        p_lat = measured[peer_key or "baseline"]
        record.peer = {
            **peer,
            "latency_ms": p_lat["latency_ms"],
            "latency_batch_ms": p_lat["latency_batch_ms"],
            "speedup": p_lat["speedup"],
        }
        record.peer["vs_peer"] = vs_peer(record)
    if "torch_fp32" in measured and torch_name != "torch_fp32":  # the speed of torch quantization itself
        p_lat, q_lat = measured["torch_fp32"], measured[torch_name]
        record.pruned_latency_ms = p_lat["latency_ms"]
        record.pruned_latency_batch_ms = p_lat["latency_batch_ms"]
        record.quant_speedup = ratio(p_lat["latency_ms"], q_lat["latency_ms"])
        record.quant_speedup_batch = ratio(p_lat["latency_batch_ms"], q_lat["latency_batch_ms"])


def eval_record(
    current: Candidate,
    out: FormsMeasurement,
    chosen: VariantRecord,
    delivered_model: Any,
    *,
    name: str,
    n_samples: int,
    settings: MeasureSettings,
    note: str,
) -> EvalRecord:
    """Build the candidate's EvalRecord from the measurement and the chosen form.

    Args:
        current: The candidate (its artifact's params and size, its MACs).
        out: The round's measurement.
        chosen: The delivered form's record.
        delivered_model: The delivered form's model (its parameter and buffer bytes).
        name: The record's name ("iter_NN").
        n_samples: Validation images measured.
        settings: The latency batch, threads and device the numbers were taken with.
        note: Why the form was delivered.
    """
    assert current.artifact is not None
    b_lat, c_lat = out.measured["baseline"], out.measured[chosen.name]
    return EvalRecord(
        name=name,
        accuracy=c_lat["accuracy"],
        agreement=c_lat["agreement"],
        n_samples=n_samples,
        latency_ms=c_lat["latency_ms"],
        latency_batch_ms=c_lat["latency_batch_ms"],
        batch_size=settings.latency_batch,
        baseline_latency_ms=b_lat["latency_ms"],
        baseline_latency_batch_ms=b_lat["latency_batch_ms"],
        speedup=c_lat["speedup"],
        memory_bytes=state_bytes(delivered_model) or int((chosen.size_mb or 0) * 1e6),
        size_mb=chosen.size_mb or current.artifact.size_bytes / 1e6,
        params=current.artifact.params,
        macs=int(current.macs or 0),
        threads=settings.threads,
        device=settings.device,
        variants=out.variants,
        delivered=chosen.name,
        delivery_note=note,
        timing=out.timing,
    )


def eval_message(record: EvalRecord, base_eval: EvalRecord, out: FormsMeasurement) -> str:
    """Say in one line what a round measured: accuracy with its CI, agreement, speed, size and every form."""
    low, high = record.acc_delta_ci or [0.0, 0.0]
    before = record.accuracy_before_recovery
    peer = record.peer
    return (
        f"{record.delivered}: validation top-1 {record.accuracy:.2f}% (baseline {base_eval.accuracy:.2f}%"
        + (f", {before:.2f}% before recovery" if before is not None else "")
        + (" (before recovery: not measured, a slow pass)" if record.before_recovery_note else "")
        + "; change "
        f"{record.accuracy - base_eval.accuracy:+.2f} pp, 95% CI [{low:+.2f}, {high:+.2f}]), "
        f"agreement {record.agreement:.1f}%, {record.speedup:.2f}x batch-1 speed"
        + (
            f" ({peer['vs_peer']:.2f}x quantization alone: {peer['name']} of the unpruned model)"
            if peer and peer.get("vs_peer")
            else ""
        )
        + f", {record.params:,} params, {record.size_mb:.2f} MB; forms: "
        + out.line
        + out.notice
    )


def evaluate_candidate(
    current: Candidate,
    base_eval: EvalRecord,
    baseline: ArtifactRef,
    objective: Objective,
    ctx: Context,
    where: CandidateRound,
) -> tuple[Candidate, str]:
    """Measure a candidate's forms (torch, ONNX Runtime, OpenVINO) beside the baseline and the unpruned peer.

    Stages: choose the forms the round builds, measure them (`measure_candidate`), record the delivered form and
    the comparisons (`candidate_record`), and hand back the candidate with its record (`evaluated_candidate`).

    Args:
        current: This round's candidate (pruned, recovered and quantized artifacts saved).
        base_eval: The baseline's measurement (its forms and the quantization-only peer).
        baseline: The baseline artifact.
        objective: Budget and target: which form is delivered.
        ctx: Backend, device, threads, latency settings.
        where: The run folder, the images, the round, the bootstrap seed, the label restriction and progress.

    Returns:
        The candidate with its EvalRecord and delivered form, and the round's one-line summary.
    """
    assert current.artifact is not None  # quantize ran
    report = where.progress or (lambda done, total, label: None)
    labels = where.tensors["eval_labels"]
    before_s = before_recovery_cost(current, base_eval, len(labels)) if current.recovered else 0.0
    loaded = candidate_models(current, baseline, where.root, before=before_s < scoring.MIN_PASS_S)
    report(0, 3, "backends")
    out, settings, models = measure_candidate(current, base_eval, objective, ctx, where, loaded)
    report(3, 3, "")
    chosen, note = pick_delivered(out, base_eval, objective, run_backend(ctx), loaded.torch_name)
    record = eval_record(
        current,
        out,
        chosen,
        models[chosen.name],
        name=run_layout.iteration_name(where.iteration),
        n_samples=len(labels),
        settings=settings,
        note=note,
    )
    add_comparisons(record, out.measured, base_eval.peer, out.peer_key, loaded.torch_name)
    add_accuracy_facts(record, out.measured, labels, seed=where.seed, before_s=before_s)
    done = evaluated_candidate(current, record, chosen, loaded.torch_name, where.root)
    return done, eval_message(record, base_eval, out)


def measure_candidate(
    current: Candidate,
    base_eval: EvalRecord,
    objective: Objective,
    ctx: Context,
    where: CandidateRound,
    loaded: CandidateModels,
) -> tuple[FormsMeasurement, MeasureSettings, dict[str, Any]]:
    """Build the round's forms of the candidate and measure them beside its torch forms, the baseline and the peer.

    Returns:
        The measurement, the settings it was taken with, and the measured models (key -> model).
    """
    assert current.artifact is not None
    root, tensors, backend = where.root, where.tensors, run_backend(ctx)
    base_variants = [v.model_dump() for v in base_eval.variants]
    forms = forms_for_backend(backend, round_forms(base_variants, base_eval.accuracy, objective.max_acc_drop))
    contenders = round_contenders(base_variants, base_eval.accuracy, objective.max_acc_drop)
    with eval_threads(ctx.threads) as threads:
        device = measure_device(ctx.device, forms, quantized=bool(current.quantized))
        settings = MeasureSettings.of(ctx, device, threads, where.allowed_ids)
        models = {name: m.to(device) for name, m in loaded.models.items()}
        known = baseline_predictions(root, tensors["eval_labels"], device)
        plan = FormsPlan(
            fp32=loaded.fp32,
            forms=forms,
            images=EvalImages(tensors["eval_pixels"], tensors["eval_labels"], tensors["calib_pixels"]),
            out_dir=run_layout.iteration_dir(root, where.iteration) / run_layout.VARIANTS,
            rel=lambda p: str(Path(p).resolve().relative_to(root.resolve())),
            objective=objective,
            torch_forms=loaded.torch_forms,
            processor=loaded.processor,
            extra={"params": current.artifact.params, "macs": current.macs},
            check_images=CHECK_IMAGES,
            untimed=[UNRECOVERED],
            peer=base_eval.peer,
            peer_root=root,
            run=root,
            model_paths=loaded.paths,
            known={"baseline": known} if known is not None else None,
            eligible=eligible_forms(backend, [*forms, *loaded.torch_forms], loaded.torch_name),
            sources=[f for f in forms if f not in contenders],  # built only because the contenders start from it
        )
        out = evaluate_forms(models, plan, settings)
    return out, settings, models


def add_accuracy_facts(
    record: EvalRecord, measured: Mapping[str, Mapping[str, Any]], labels: Any, *, seed: int, before_s: float
) -> None:
    """Fill the record's paired-bootstrap interval and its accuracy before recovery (or why it is missing)."""
    mine, base = measured[record.delivered]["preds"], measured["baseline"]["preds"]
    record.acc_delta_ci = list(paired_delta_ci(correct(mine, labels), correct(base, labels), seed=seed))
    if UNRECOVERED in measured:
        before = measured[UNRECOVERED]
        record.accuracy_before_recovery, record.agreement_before_recovery = before["accuracy"], before["agreement"]
    elif before_s >= scoring.MIN_PASS_S:
        record.before_recovery_note = (
            f"accuracy before recovery not measured: a torch pass of the one-shot weights of about {before_s:.0f} s "
            "(it cannot change what ships; the recovery record has the calibration agreement before and after)"
        )


def evaluated_candidate(
    current: Candidate, record: EvalRecord, chosen: VariantRecord, torch_name: str, root: Path
) -> Candidate:
    """Return the candidate with its record and, when a runtime form ships, that form as its delivered artifact."""
    assert current.artifact is not None
    done = current.model_copy(deep=True)
    done.eval, done.delivered = record, None
    if chosen.name != torch_name and chosen.path:
        done.delivered = ArtifactRef(
            path=chosen.path,
            sha256=sha256_path(root / chosen.path),
            size_bytes=int((chosen.size_mb or 0) * 1e6),
            params=current.artifact.params,
        )
    return done
