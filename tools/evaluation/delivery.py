"""The run's delivery policy: what goes into best/, and how it compares with quantizing the unpruned model alone.

Every run measures the unpruned baseline in every form (`measure_baseline`); the fastest of those within the
accuracy budget is the *quantization-only peer*: what a user gets without pruning and without its accuracy risk.
Each round times the peer beside its candidate's forms; at the end the delivered model is the best pruned
candidate only when it keeps the budget and pruning bought something over the peer, else the peer itself.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from profiling_agent.state import ArtifactRef, Best, EvalRecord, Objective, VariantRecord
from profiling_agent.tools import run_layout
from profiling_agent.tools.evaluation.contention import flag_reason, flagged
from profiling_agent.tools.evaluation.latency import measurably_different, paired_ratio
from profiling_agent.tools.evaluation.selection import LATENCY_TIE, choose_form, reduction, within_budget
from profiling_agent.tools.evaluation.ties import Samples
from profiling_agent.tools.runtimes.forms import eligible_forms

PEER_PREFIX = "unpruned_"  # models named so in a round's timing are the peer (the unpruned model's fastest form)
BASELINE_TORCH = "torch_fp32"  # the untouched torch model among the baseline's forms


def quantization_only_peer(
    variants: Sequence[VariantRecord],
    baseline: EvalRecord,
    objective: Objective,
    backend: str = "auto",
    samples: Samples | None = None,
) -> dict[str, Any] | None:
    """Return the unpruned model's fastest form within the budget that `backend` may deliver, or None.

    The peer is what the user could deploy instead with the same `--backend` choice (its torch model counts):
    under `--backend openvino` an ONNX Runtime form, built only as OpenVINO's source, is not one. Forms within
    noise of the fastest are ranked by the fixed order (`ties.fastest_form`); its "tie" says when that decided.

    Args:
        variants: The baseline's forms (torch_fp32 and the ONNX Runtime / OpenVINO forms).
        baseline: The baseline's EvalRecord (its accuracy is the budget's reference).
        objective: Budget and target.
        backend: The run's `--backend` choice.
        samples: Form name -> its per-repeat batch-1 samples of the timing `variants` come from (None: medians).
    """
    allowed = eligible_forms(backend, [v.name for v in variants], BASELINE_TORCH)
    fitting = [
        v
        for v in variants
        if v.status == "ok"
        and (allowed is None or v.name in allowed or v.name == BASELINE_TORCH)
        and within_budget(v, baseline, objective)
    ]
    if not fitting:
        return None
    choice = choose_form(fitting, baseline, objective.model_copy(update={"target": "latency"}), samples=samples)
    if choice is None:
        return None
    keys = ("name", "backend", "path", "accuracy", "latency_ms", "latency_batch_ms", "speedup", "size_mb")
    return {**{k: getattr(choice.chosen, k) for k in keys}, **({"tie": choice.note()} if choice.tie_decided else {})}


def final_peer(
    latency: Mapping[str, Mapping[str, Any]], baseline: EvalRecord, objective: Objective, backend: str = "auto"
) -> dict[str, Any] | None:
    """Return the quantization-only form chosen from the final side-by-side timing, or None.

    The same rule as `quantization_only_peer` (the fastest unpruned form within the budget that `backend` may
    deliver; forms within noise of it ranked by the fixed order, judged on the final timing's paired repeats), on
    the latencies of the final timing: every form that kept the budget was timed there ("unpruned_<form>"; the
    torch model is "baseline"). Forms the final timing did not time are not chosen. None when it timed none.
    """
    timed, samples = [], {}
    for form in baseline.variants:
        row = latency.get(peer_key(form.name)) or {}
        if form.status == "ok" and row.get("latency_ms"):
            update = {"latency_ms": row["latency_ms"], "latency_batch_ms": row.get("latency_batch_ms")}
            timed.append(form.model_copy(update=update))
            samples[form.name] = list(row.get("samples_ms") or [])
    chosen = quantization_only_peer(timed, baseline, objective, backend, samples) if timed else None
    return {**chosen, "chosen_from": "final side-by-side timing"} if chosen else None


def delivery_note(
    chosen: VariantRecord | None, within: bool, failed: Sequence[str], backend: str, tie: str = ""
) -> str:
    """Say truthfully why a candidate's form was chosen: fastest within the budget (or a tie), or none kept it."""
    if chosen is None:
        return "no measured form of this candidate works; the plan's torch model is recorded"
    if not within:
        why = (
            f"no form of this candidate kept the accuracy budget; {chosen.name} is recorded as its most accurate "
            "form (the run does not deliver a candidate outside the budget)"
        )
    else:
        why = f"fastest measured form within the accuracy budget ({backend})"
    return why + (f"; {tie}" if tie else "") + (f"; failed: {'; '.join(failed)}" if failed else "")


def vs_peer(record: EvalRecord) -> float | None:
    """Return how many times faster a candidate's delivered form ran than the peer, timed side by side."""
    return peer_ratio(float((record.peer or {}).get("latency_ms") or 0.0), float(record.latency_ms or 0.0))


def peer_ratio(peer_lat: float, lat: float) -> float | None:
    """Return the peer's latency over the delivered form's, rounded (None when either is unknown)."""
    return round(peer_lat / lat, 4) if lat > 0 and peer_lat > 0 else None


def pruning_verdict(
    best: Best | None, objective: Objective, final: Mapping[str, Mapping[str, Any]] | None = None
) -> tuple[bool, str]:
    """Decide whether the best pruned candidate is delivered (True) or the quantization-only peer (False).

    The candidate is delivered when it keeps the budget and either runs faster than the peer (beyond the
    LATENCY_TIE noise band) or, for a params/MACs/size target, reduces what the user asked to reduce. Under a
    latency target, a final timing whose paired 95% interval of that speed-up reaches down to 1.0 delivers the
    peer: the pruned model is not measurably faster, so the unpruned model's accuracy is kept (and two runs of the
    same seed do not flip between the two on timing noise). With the
    final side-by-side timing (`final_latency`: its latencies, and the peer chosen from them under
    "final_peer"), the speed over the peer is read there (the paired median, `latency.paired_ratio`, the figure
    whose interval decides; the ratio of the two medians without paired repeats); else from the candidate's round.
    """
    if not best or not best.eval:
        return False, "no pruned candidate finished"
    paired = final_paired(best, final) if final else None
    ratio = paired["ratio"] if paired else final_ratio(best, final) if final else None
    if ratio is None:
        ratio = vs_peer(best.eval)
    keep, why = verdict(best.within_budget, best.accuracy_drop, best.reduction, ratio, objective)
    if keep and objective.target == "latency" and paired is not None and paired["ci"][0] <= 1.0:
        low, high = paired["ci"]  # a latency target asked for speed that noise cannot explain
        return False, (
            f"pruning added no measurable speed: {ratio:.2f}x quantizing the unpruned model alone, the median of "
            f"{paired['repeats']} paired repeats (95% interval {low:.2f}-{high:.2f})"
        )
    return keep, why


def final_paired(best: Best, final: Mapping[str, Mapping[str, Any]]) -> dict[str, Any] | None:
    """Return the best candidate's paired speed ratio over the final peer with its interval (None: not timed so)."""
    theirs, mine = final_rows(best, final)
    return paired_ratio(theirs, mine) if mine and theirs else None


def peer_key(name: str | None) -> str:
    """Return the key of the unpruned model's form `name` in a side-by-side timing (its torch model: "baseline")."""
    return "baseline" if name == BASELINE_TORCH else PEER_PREFIX + str(name)


def final_rows(best: Best, final: Mapping[str, Mapping[str, Any]]) -> tuple[Mapping[str, Any], Mapping[str, Any]]:
    """Return the final timing's rows of the chosen peer and of the best candidate ({} where one was not timed)."""
    peer = (final.get("final_peer") or {}) if isinstance(final.get("final_peer"), Mapping) else {}
    mine = final.get(run_layout.iteration_name(best.iteration)) or {}
    theirs = final.get(peer_key(peer.get("name"))) or {} if peer else {}
    return theirs, mine


def final_ratio(best: Best, final: Mapping[str, Mapping[str, Any]]) -> float | None:
    """Return the final timing's peer latency over the best candidate's (None when either was not timed there)."""
    theirs, mine = final_rows(best, final)
    return peer_ratio(float(theirs.get("latency_ms") or 0.0), float(mine.get("latency_ms") or 0.0))


def verdict(within: bool, drop: float, reduced: float, ratio: float | None, objective: Objective) -> tuple[bool, str]:
    """`pruning_verdict` on its numbers: budget kept, points lost, target reduction, speed over the peer."""
    if not within:
        return False, f"the best pruned candidate lost {drop:.2f} pp, past the budget"
    if ratio is None:
        return True, "no quantization-only peer was timed beside it"
    if ratio > 1 + LATENCY_TIE:
        return True, f"pruning made it {ratio:.2f}x faster than quantizing the unpruned model alone"
    if objective.target != "latency" and reduced > 0.0:
        return True, (
            f"it is {ratio:.2f}x the speed of quantizing the unpruned model alone, but is what the {objective.target} "
            f"target asks for ({reduced:.1%} smaller within the budget)"
        )
    return False, f"pruning added no speed: {ratio:.2f}x the speed of quantizing the unpruned model alone"


def peer_best(baseline_eval: EvalRecord, baseline_ref: ArtifactRef, objective: Objective, why: str = "") -> Best:
    """Return a Best (iteration 0, no plan) for the quantization-only peer, for delivery in best/."""
    peer = dict(baseline_eval.peer or {})
    name = str(peer.get("name") or BASELINE_TORCH)
    base_lat = float(baseline_eval.latency_ms or 0.0)
    lat = float(peer.get("latency_ms") or base_lat)
    size_mb = float(peer.get("size_mb") or baseline_eval.size_mb or 0.0)
    record = baseline_eval.model_copy(
        update={
            "name": "unpruned",
            "accuracy": float(peer["accuracy"] if peer.get("accuracy") is not None else baseline_eval.accuracy),
            "latency_ms": lat,
            "latency_batch_ms": float(peer.get("latency_batch_ms") or baseline_eval.latency_batch_ms or 0.0),
            "speedup": base_lat / lat if lat > 0 else 1.0,
            "size_mb": size_mb,
            "delivered": name,
            "delivery_note": "quantization only: the unpruned model's fastest form within the budget"
            + (f" ({why})" if why else "")
            + (f"; {peer['tie']}" if peer.get("tie") else ""),
            "peer": {**peer, "vs_peer": 1.0},
        },
        deep=True,
    )
    delivered = None
    if name != BASELINE_TORCH and peer.get("path"):
        delivered = ArtifactRef(path=peer["path"], sha256="", size_bytes=int(size_mb * 1e6), params=baseline_ref.params)
    drop = float(baseline_eval.accuracy) - record.accuracy
    return Best(
        iteration=0,
        status="ok",
        planner="none (quantization only)",
        artifact=baseline_ref.model_copy(),
        delivered=delivered,
        eval=record,
        rule=objective.select,
        within_budget=drop <= objective.max_acc_drop + 1e-9,
        reduction=round(reduction(record, baseline_eval, objective.target), 6),
        accuracy_drop=round(drop, 6),
    )


def choose_delivery(
    best: Best | None,
    baseline_eval: EvalRecord | None,
    baseline_ref: ArtifactRef | None,
    objective: Objective,
    final: tuple[Mapping[str, Mapping[str, Any]], Mapping[str, Any]] | None = None,
) -> tuple[Best | None, str]:
    """Return what best/ holds (the pruned best, or the quantization-only peer as an iteration-0 Best) and why.

    With the final side-by-side timing (`final_latency`'s latencies and timing facts), the peer is the one chosen
    from it (`timing["final_peer"]`, the fastest unpruned form within the budget there) and the speed over it is
    read there; the delivered thing keeps the budget either way.
    """
    latency, timing = final or ({}, {})
    chosen_peer = timing.get("final_peer") if isinstance(timing.get("final_peer"), Mapping) else None
    keep, why = pruning_verdict(best, objective, {**latency, "final_peer": chosen_peer} if chosen_peer else None)
    if keep or not baseline_eval or not baseline_ref:
        return best, why
    if chosen_peer:
        baseline_eval = baseline_eval.model_copy(update={"peer": dict(chosen_peer)})
    return peer_best(baseline_eval, baseline_ref, objective, why), why + "; the quantization-only form is delivered"


def delivery_summary(
    best: Mapping[str, Any] | None,
    baseline: Mapping[str, Any],
    objective: Objective,
    final_latency: Mapping[str, Mapping[str, Any]] | None = None,
    timing: Mapping[str, Any] | None = None,
) -> dict[str, Any] | None:
    """Say what best/ holds and how fast it is against the original torch model and against quantization alone.

    Args:
        best: result.json's best (iteration 0: the quantization-only form was delivered).
        baseline: result.json's baseline (its `peer` is the quantization-only form of the baseline's measurement).
        objective: Budget and target.
        final_latency: The final side-by-side timing (keys "baseline", "iter_NN", "unpruned_<form>"); its ratios
            are the medians of the interleaved repeats' paired ratios, stored beside their 95% interval from the
            same repeats (`latency.paired_ratio`), so each lies inside its own interval.
        timing: Its timing facts (busy and contended flags; "final_peer": the quantization-only form chosen there).
    """
    if not best:
        return None
    final, facts = dict(final_latency or {}), dict(timing or {})
    chosen = facts.get("final_peer") if isinstance(facts.get("final_peer"), Mapping) else None
    peer = dict(chosen or baseline.get("peer") or {})
    quant_only = int(best.get("iteration") or 0) == 0
    base_lat = float((final.get("baseline") or {}).get("latency_ms") or baseline.get("latency_ms") or 0.0)
    lat = float(best.get("latency_ms") or 0.0)
    theirs = final.get(peer_key(peer.get("name"))) if peer else None
    if theirs and theirs.get("latency_ms") and not quant_only:
        peer_lat = float(theirs["latency_ms"])
    elif peer.get("name") == BASELINE_TORCH:
        peer_lat = base_lat
    else:
        peer_lat = float(((best.get("peer") or {}).get("latency_ms")) or peer.get("latency_ms") or 0.0)
    mine = final.get(
        peer_key(peer.get("name")) if quant_only else run_layout.iteration_name(int(best.get("iteration") or 0))
    )
    torch_ci = paired_ratio(final["baseline"], mine) if mine and final.get("baseline") else None
    quant_ci = paired_ratio(theirs, mine) if mine and theirs and not quant_only else None
    # one measurement per claim: with paired repeats the stated ratio is their median, the one its interval is of
    vs_torch = torch_ci["ratio"] if torch_ci else (round(base_lat / lat, 4) if lat > 0 else None)
    vs_quant = 1.0 if quant_only else quant_ci["ratio"] if quant_ci else peer_ratio(peer_lat, lat)
    if quant_only:
        why = str(best.get("delivery_note") or "quantization only")
    else:
        within, drop = bool(best.get("within_budget")), float(best.get("accuracy_drop", 0) or 0.0)
        why = hedged(verdict(within, drop, float(best.get("reduction") or 0.0), vs_quant, objective)[1], quant_ci)
    is_flagged = flagged(facts) or flagged(best.get("timing"))
    return {
        "delivered": f"{best.get('delivered')} of the unpruned model"
        if quant_only
        else f"{best.get('delivered')} of iteration {best.get('iteration')}",
        "pruning_added": not quant_only,
        "verdict": why,
        "vs_original_torch": vs_torch,
        "vs_quantization_only": vs_quant,
        # paired 95% intervals of those ratios, from the final timing's interleaved repeats (None: not timed there)
        "vs_original_torch_ci": torch_ci,
        "vs_quantization_only_ci": quant_ci,
        # its latency is the one the ratio above divides (the final joint timing's, when it timed the peer)
        "quantization_only": {
            "name": peer.get("name"),
            "accuracy": peer.get("accuracy"),
            "latency_ms": peer_lat or None,
            "chosen_from": "final side-by-side timing" if chosen else "the baseline's measurement",
        }
        if peer
        else None,
        "timing": facts,
        "timings_flagged": is_flagged,
        "flag_reason": (flag_reason(facts) or flag_reason(best.get("timing"))) if is_flagged else "",
    }


def hedged(why: str, ratio_ci: Mapping[str, Any] | None) -> str:
    """Turn a "faster than quantizing alone" claim whose paired interval holds 1.0 into "no measurable difference".

    The figure stated is the paired median (`latency.paired_ratio`), the one the interval is of.
    """
    if ratio_ci is None or measurably_different(ratio_ci) is not False or "faster than quantizing" not in why:
        return why
    low, high = ratio_ci["ci"]
    return (
        f"no measurable difference from quantizing the unpruned model alone: {ratio_ci['ratio']:.2f}x, the median "
        f"of {ratio_ci['repeats']} paired repeats (95% interval {low:.2f}-{high:.2f})"
    )


def summary_line(summary: Mapping[str, Any] | None) -> str:
    """One console/report line: the delivered form's speed against the original model and quantization alone."""
    if not summary:
        return ""
    line = f"delivered {summary['delivered']}"
    if summary.get("vs_original_torch"):
        line += f": {summary['vs_original_torch']:.2f}x the original torch model" + interval(
            summary.get("vs_original_torch_ci")
        )
    quant = summary.get("quantization_only") or {}
    if summary.get("vs_quantization_only") and quant:
        line += (
            f", {summary['vs_quantization_only']:.2f}x quantization only ({quant.get('name')} of the unpruned model)"
            + interval(summary.get("vs_quantization_only_ci"))
        )
    line += f"; {summary['verdict']}"
    if summary.get("timings_flagged"):
        line += f"; TIMINGS FLAGGED: {summary.get('flag_reason') or flag_reason(summary.get('timing'))}"
    return line


def interval(ratio_ci: Mapping[str, Any] | None) -> str:
    """Return " (95% interval LOW-HIGH)" for a paired ratio, "" when there is none."""
    if not ratio_ci or not ratio_ci.get("ci"):
        return ""
    low, high = ratio_ci["ci"]
    return f" (95% interval {float(low):.2f}-{float(high):.2f})"
