"""The final verdict's timing: the baseline, every finished candidate and every contending unpruned form, together."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from profiling_agent.state import ArtifactRef, Candidate, Context, EvalRecord, Objective
from profiling_agent.tools import run_layout
from profiling_agent.tools.device import cpu_only, measure_device
from profiling_agent.tools.evaluation import latency as latency_clock
from profiling_agent.tools.evaluation.contention import use_run
from profiling_agent.tools.evaluation.delivery import BASELINE_TORCH, PEER_PREFIX, final_peer
from profiling_agent.tools.evaluation.form_eval import eval_threads
from profiling_agent.tools.evaluation.latency import RUN_BUDGET_S, paired_ratio
from profiling_agent.tools.evaluation.selection import within_budget
from profiling_agent.tools.evaluation.ties import LATENCY_TIE, TIE_LEVEL
from profiling_agent.tools.io import read_json, write_json_atomic
from profiling_agent.tools.models.artifact_load import load_artifact, load_run_form
from profiling_agent.tools.runtimes.forms import load_form, round_contenders


def same_form_paths(candidates: Sequence[Candidate], base_eval: EvalRecord | None) -> dict[str, str]:
    """Return {form: path} of the unpruned model's forms that finished candidates deliver, other than the peer's.

    A latency target is measured against the unpruned model in the delivered form. The peer (the unpruned model's
    fastest form) is timed beside every round; any other delivered CPU form (say ort_fp32 when it beat ort_dynamic)
    has its unpruned twin timed in the final measurement too, so the outcome never rests on two speedups taken in
    different measurements (on a 0.1 ms model they disagreed by 30%).
    """
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


FINAL_FILE = "final_latency.json"  # the final side-by-side timing, in the run folder (the report reads it back)


FORM_SAMPLES = "form_samples_ms"  # the baseline record's timing key: form -> its per-repeat batch-1 samples


def cannot_win(base_eval: EvalRecord | None) -> dict[str, str]:
    """Return {form: why} of the unpruned forms that cannot be the quantization-only form: not timed at the end.

    The baseline's measurement is the one that timed every unpruned form beside the peer (a round times the peer
    only). A form cannot win when that measurement put it outside the forms a round builds
    (`forms.round_contenders`: the two fastest within the budget and every other within 1.5x of the fastest) and
    measurably slower than the peer: the paired 99% interval of its time over the peer's lies wholly above
    1 + LATENCY_TIE, the rule by which `ties.speed_tied` says two forms are not tied. The torch model is the
    baseline, timed anyway. Without the per-repeat samples (a run recorded before they were kept) none is left out.
    """
    if base_eval is None or not base_eval.peer:
        return {}
    samples = (base_eval.timing or {}).get(FORM_SAMPLES) or {}
    peer = str(base_eval.peer.get("name") or "")
    if not samples.get(peer):
        return {}
    rows = [v.model_dump() for v in base_eval.variants]
    keep = set(round_contenders(rows, base_eval.accuracy, float("inf")))  # speed only: the budget is checked apart
    out: dict[str, str] = {}
    for form in base_eval.variants:
        if form.name in (peer, BASELINE_TORCH) or form.name in keep or not samples.get(form.name):
            continue
        ratio = paired_ratio({"samples_ms": samples[form.name]}, {"samples_ms": samples[peer]}, level=TIE_LEVEL)
        if ratio is not None and float(ratio["ci"][0]) > 1.0 + LATENCY_TIE:
            low, high = ratio["ci"]
            out[form.name] = (
                f"cannot win: {ratio['ratio']:.2f}x the time of {peer} in the baseline's measurement "
                f"(paired 99% interval {low:.2f}-{high:.2f}x) and not among the forms a round builds"
            )
    return out


def unpruned_contenders(base_eval: EvalRecord | None, objective: Objective | None) -> dict[str, str]:
    """Return {form: path} of every CPU form of the unpruned model that kept the budget and can win (torch aside).

    Each could be the quantization-only form: the final timing times them all beside the candidates, and the
    peer is chosen from that measurement (`delivery.final_peer`), not from the baseline's measurement alone.
    A form that cannot win (`cannot_win`: measurably slower than the peer) is not timed again. Without an
    objective, only the baseline's recorded peer.
    """
    if base_eval is None:
        return {}
    out: dict[str, str] = {}
    peer = base_eval.peer or {}
    if peer.get("path") and cpu_only([str(peer.get("name", ""))]):
        out[str(peer["name"])] = str(peer["path"])
    if objective is None:
        return out
    slower = cannot_win(base_eval)
    for form in base_eval.variants:
        if form.name in slower:
            continue
        if form.status == "ok" and form.path and form.name != BASELINE_TORCH and cpu_only([form.name]):
            if form.accuracy is not None and within_budget(form, base_eval, objective):
                out[form.name] = str(form.path)
    return out


def kept_final(root: Path, keys: Sequence[str]) -> tuple[dict[str, dict[str, Any]], dict[str, Any]] | None:
    """Return the run's final timing kept in `FINAL_FILE` when it timed exactly these candidates, else None."""
    path = root / FINAL_FILE
    try:
        data = read_json(path) if path.exists() else None
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or sorted(data.get("candidates") or []) != sorted(keys):
        return None
    return dict(data["latency"]), dict(data["timing"])


def final_latency(
    candidates: Sequence[Candidate],
    baseline: ArtifactRef | None,
    base_eval: EvalRecord | None,
    ctx: Context,
    *,
    root: Path,
    images: Callable[[], Any] | None,
    objective: Objective | None = None,
) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """Time the baseline, the finished candidates and every contending unpruned form together, interleaved.

    Each candidate is timed in its delivered form; beside them every form of the unpruned model that kept the
    budget (`unpruned_contenders`; the recorded peer only, without an objective) and the unpruned model in every
    other delivered form (`same_form_paths`). With an objective, the quantization-only form is chosen from this
    measurement (`timing["final_peer"]`, `delivery.final_peer`). The result is kept in the run folder
    (`FINAL_FILE`): the held-out step times, the report reads it back (as does a resumed run).

    Args:
        candidates: The run's candidates (only finished ones are timed).
        baseline: The baseline artifact.
        base_eval: The baseline's record (its forms and quantization-only peer).
        ctx: Device, threads, latency settings and the `--backend` choice.
        root: The run folder (artifact paths are relative to it).
        images: Opens the validation images (the first `ctx.latency_batch` are timed); None without data.
        objective: The budget the contending forms kept (None: only the recorded peer is timed).

    Returns:
        The latencies by key ("baseline", "iter_NN", "unpruned_<form>", each with its per-repeat samples) and the
        timing facts (wall vs CPU time, busy and contended flags, re-measures, "contenders", "final_peer");
        both empty without a finished candidate.
    """
    ok = [c for c in candidates if c.status == "ok" and c.artifact]
    if not ok or baseline is None or images is None:
        return {}, {}
    keys = [run_layout.iteration_name(c.iteration) for c in ok]
    kept = kept_final(root, keys)
    if kept is not None:
        return kept
    use_run(root)
    with eval_threads(ctx.threads) as threads:
        models = {"baseline": load_artifact(root / baseline.path).model}
        for key, cand in zip(keys, ok, strict=True):  # each in its delivered form
            ref = cand.delivered or cand.artifact
            assert ref is not None
            models[key] = load_run_form(root / ref.path, threads)
        forms = [c.eval.delivered if c.eval else "torch" for c in ok]
        quantized = any(c.quantized and name != "torch_fp32" for c, name in zip(ok, forms, strict=True))
        contenders = {**unpruned_contenders(base_eval, objective), **same_form_paths(ok, base_eval)}
        for form, path in contenders.items():
            models[PEER_PREFIX + form] = load_form(root / path, threads)
            forms.append(form)
        device = measure_device(ctx.device, forms, quantized=quantized)
        latency, timing = latency_clock.measure_latency_checked(  # through the module: tests stand in for the clock
            {k: m.to(device) for k, m in models.items()},
            images()[: ctx.latency_batch],
            batch_size=ctx.latency_batch,
            warmup=ctx.latency_warmup,
            repeats=ctx.latency_repeats,
            device=device,
            budget_s=RUN_BUDGET_S,
        )
    timing["contenders"] = sorted(contenders)
    left_out = {k: why for k, why in cannot_win(base_eval).items() if k not in contenders}
    if left_out and objective is not None:
        timing["not_timed"] = left_out
    if objective is not None and base_eval is not None:
        timing["final_peer"] = final_peer(latency, base_eval, objective, ctx.backend)
    write_json_atomic(root / FINAL_FILE, {"candidates": keys, "latency": latency, "timing": timing})
    return latency, timing
