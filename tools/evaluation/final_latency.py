"""The final latency: the baseline, every finished candidate and the unpruned model's forms timed together."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from profiling_agent.state import ArtifactRef, Candidate, Context, EvalRecord
from profiling_agent.tools import run_layout


def round_as_final(
    candidates: Sequence[Candidate], base_eval: EvalRecord | None
) -> tuple[dict[str, dict[str, Any]], dict[str, Any]] | None:
    """Return a lone finished candidate's round measurement in `final_latency`'s shape, or None.

    With one finished candidate, its round already timed the baseline, its delivered form and the quantization-only
    peer side by side, interleaved, with the same images and settings; timing them again would only repeat that
    measurement (for a full-size ViT-B/16 about 80 CPU-s). None when the record lacks a number (older runs), so
    the models are timed again.
    """
    from profiling_agent.tools.evaluation.delivery import PEER_PREFIX

    ok = [c for c in candidates if c.status == "ok" and c.artifact]
    record = ok[0].eval if len(ok) == 1 else None
    if record is None or record.baseline_latency_batch_ms is None or record.timing is None:
        return None
    if same_form_paths(ok, base_eval):  # the unpruned model in the delivered form was not timed beside it
        return None
    latency: dict[str, dict[str, Any]] = {
        "baseline": {"latency_ms": record.baseline_latency_ms, "latency_batch_ms": record.baseline_latency_batch_ms},
        run_layout.iteration_name(ok[0].iteration): {
            "latency_ms": record.latency_ms,
            "latency_batch_ms": record.latency_batch_ms,
        },
    }
    peer = base_eval.peer if base_eval else None
    if peer and peer.get("path"):  # the peer was timed beside the round's forms
        timed = record.peer or {}
        if timed.get("latency_ms") is None or timed.get("latency_batch_ms") is None:
            return None
        latency[PEER_PREFIX + str(peer["name"])] = {k: timed[k] for k in ("latency_ms", "latency_batch_ms")}
    note = f"round {ok[0].iteration}'s side-by-side measurement (the only finished candidate: not timed again)"
    return latency, {**record.timing, "reused": note}


def same_form_paths(candidates: Sequence[Candidate], base_eval: EvalRecord | None) -> dict[str, str]:
    """Return {form: path} of the unpruned model's forms that finished candidates deliver, other than the peer's.

    A latency target is measured against the unpruned model in the delivered form. The peer (the unpruned model's
    fastest form) is timed beside every round; any other delivered CPU form (say ort_fp32 when it beat ort_dynamic)
    has its unpruned twin timed in the final measurement too, so the outcome never rests on two speedups taken in
    different measurements (on a 0.1 ms model they disagreed by 30%).
    """
    from profiling_agent.tools.device import cpu_only

    if base_eval is None:
        return {}
    peer = str((base_eval.peer or {}).get("name") or "")
    paths = {v.name: v.path for v in base_eval.variants if v.status == "ok" and v.path}
    out: dict[str, str] = {}
    for cand in candidates:
        form = cand.eval.delivered if cand.eval else None
        if form and form != peer and form in paths and cpu_only([form]) and cand.delivered is not None:
            out[form] = str(paths[form])
    return out


def final_latency(
    candidates: Sequence[Candidate],
    baseline: ArtifactRef | None,
    base_eval: EvalRecord | None,
    ctx: Context,
    *,
    root: Path,
    images: Callable[[], Any] | None,
) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """Measure the baseline, the finished candidates and the unpruned model's forms together, interleaved.

    Each candidate is timed in its delivered form; beside them the peer and the unpruned model in every other
    delivered form (`same_form_paths`).

    A lone finished candidate's round measurement is that already (`round_as_final`) and is returned instead.

    Args:
        candidates: The run's candidates (only finished ones are timed).
        baseline: The baseline artifact.
        base_eval: The baseline's record (its quantization-only peer is timed too).
        ctx: Device, threads and latency settings.
        root: The run folder (artifact paths are relative to it).
        images: Opens the validation images (the first `ctx.latency_batch` are timed); None without data.

    Returns:
        The latencies by key ("baseline", "iter_NN", "unpruned_<form>") and the timing facts (wall vs CPU time,
        busy flag, re-measures); both empty without a finished candidate.
    """
    from profiling_agent.tools.device import cpu_only, measure_device
    from profiling_agent.tools.evaluation.delivery import PEER_PREFIX
    from profiling_agent.tools.evaluation.form_eval import eval_threads
    from profiling_agent.tools.evaluation.latency import RUN_BUDGET_S, measure_latency_checked
    from profiling_agent.tools.models.artifact_load import load_artifact, load_run_form
    from profiling_agent.tools.runtimes.forms import load_form

    ok = [c for c in candidates if c.status == "ok" and c.artifact]
    if not ok or baseline is None or images is None:
        return {}, {}
    reused = round_as_final(ok, base_eval)
    if reused is not None:
        return reused
    with eval_threads(ctx.threads) as threads:
        models = {"baseline": load_artifact(root / baseline.path).model}
        for cand in ok:  # each in its delivered form
            ref = cand.delivered or cand.artifact
            assert ref is not None
            models[run_layout.iteration_name(cand.iteration)] = load_run_form(root / ref.path, threads)
        forms = [c.eval.delivered if c.eval else "torch" for c in ok]
        quantized = any(c.quantized and name != "torch_fp32" for c, name in zip(ok, forms, strict=True))
        peer = base_eval.peer if base_eval else None
        if peer and peer.get("path") and cpu_only([str(peer.get("name", ""))]):
            models[PEER_PREFIX + str(peer["name"])] = load_form(root / str(peer["path"]), threads)
            forms.append(str(peer["name"]))
        for form, path in same_form_paths(ok, base_eval).items():
            models[PEER_PREFIX + form] = load_form(root / path, threads)
            forms.append(form)
        device = measure_device(ctx.device, forms, quantized=quantized)
        return measure_latency_checked(
            {k: m.to(device) for k, m in models.items()},
            images()[: ctx.latency_batch],
            batch_size=ctx.latency_batch,
            warmup=ctx.latency_warmup,
            repeats=ctx.latency_repeats,
            device=device,
            budget_s=RUN_BUDGET_S,
        )
