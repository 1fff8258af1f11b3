"""Rules that pick the best candidate and decide whether the objective is met."""

from __future__ import annotations

from collections.abc import Collection, Sequence

from profiling_agent.state import Best, Candidate, EvalRecord, Objective, VariantRecord
from profiling_agent.tools.evaluation.ties import LATENCY_TIE, Fastest, Samples, fastest_form


def same_form_latency(record: EvalRecord, baseline: EvalRecord) -> tuple[float, str, str]:
    """Return the latency reduction of a record against the unpruned model in the record's delivered form.

    The unpruned model in that form is read, in order of trust, from the peer timed beside the candidate (when
    the peer is that form); from the peer timed beside it scaled by the two forms' ratio in the baseline's
    measurement (ort_fp32 delivered, ort_dynamic the peer: both ratios come from runtime forms timed side by side);
    from the baseline's forms (both speedups over the torch baseline, whose own timing differed by 40% between two
    measurements of a 0.1 ms model); or it is the torch baseline itself (a torch delivery).

    Returns:
        (reduction, the delivered form, how the unpruned form's latency was obtained).
    """
    delivered = str(record.delivered or "torch")
    lat = float(record.latency_ms or 0.0)
    peer = record.peer or {}
    peer_lat = float(peer.get("latency_ms") or 0.0)
    if peer.get("name") == delivered and lat > 0 and peer_lat > 0:
        return 1.0 - lat / peer_lat, delivered, "timed beside it"
    speedup = float(record.speedup or 0.0)
    vs_torch = (1.0 - 1.0 / speedup if speedup > 0 else 0.0), delivered, "the torch baseline"
    if delivered in ("torch", "torch_fp32"):  # the torch baseline itself was timed beside it
        return vs_torch
    forms = {f.name: f for f in baseline.variants if f.status == "ok"}
    mine = forms.get(delivered)
    mine_ms = float(mine.latency_ms or 0.0) if mine else 0.0
    peer_form = forms.get(str(peer.get("name")))
    peer_base_ms = float(peer_form.latency_ms or 0.0) if peer_form else 0.0
    if lat > 0 and peer_lat > 0 and mine_ms > 0 and peer_base_ms > 0:
        unpruned = peer_lat * mine_ms / peer_base_ms
        return (
            1.0 - lat / unpruned,
            delivered,
            f"the {peer['name']} peer timed beside it, scaled by the baseline's forms",
        )
    if mine is not None and mine.speedup and speedup > 0:
        return 1.0 - float(mine.speedup) / speedup, delivered, "the baseline's forms"
    return vs_torch


def reduction(record: EvalRecord, baseline: EvalRecord, target: str) -> float:
    """Return the fractional reduction of `target` of an evaluation record against the baseline's.

    Latency is measured on the delivered form against the unpruned model in that same form
    (`same_form_latency`), from timings taken side by side, so neither quantization alone nor machine noise
    between rounds counts as a reduction.
    """
    if target == "latency":
        return same_form_latency(record, baseline)[0]
    key = {"params": "params", "macs": "macs", "size": "size_mb"}[target]
    base = float(getattr(baseline, key) or 0.0)
    if base <= 0:
        return 0.0
    return 1.0 - float(getattr(record, key) or 0.0) / base


def accuracy_drop(record: EvalRecord | VariantRecord, baseline: EvalRecord) -> float:
    """Return the top-1 drop in percentage points (negative when the candidate is more accurate)."""
    return float(baseline.accuracy) - float(record.accuracy or 0.0)


def within_budget(record: EvalRecord | VariantRecord, baseline: EvalRecord, objective: Objective) -> bool:
    """Return True when the candidate's accuracy drop is inside the objective's budget."""
    return accuracy_drop(record, baseline) <= objective.max_acc_drop + 1e-9


def _ok(candidates: Sequence[Candidate]) -> list[tuple[Candidate, EvalRecord]]:
    return [(c, c.eval) for c in candidates if c.status == "ok" and c.eval]


def select_best(candidates: Sequence[Candidate], baseline: EvalRecord, objective: Objective) -> Best | None:
    """Pick the best finished candidate by the objective's rule, or None when none finished.

    paper: highest accuracy, then fewer params, then lower latency (the paper's rule).
    budget: among candidates within max_acc_drop, the largest reduction of `objective.target` (ties: faster,
    then more accurate, then earlier); when none is within budget, the most accurate one, flagged.

    Returns:
        The candidate as a Best: with `rule`, `within_budget`, `reduction`, `accuracy_drop`, `ci_crosses_budget`.
    """
    pool = _ok(candidates)
    if not pool:
        return None
    if objective.select == "paper":
        best, ev = min(pool, key=lambda p: (-p[1].accuracy, p[1].params, p[1].latency_ms, p[0].iteration))
    else:
        fitting = [p for p in pool if within_budget(p[1], baseline, objective)]
        if fitting:
            best, ev = min(
                fitting,
                key=lambda p: (
                    -round(reduction(p[1], baseline, objective.target), 6),
                    -round(float(p[1].speedup or 0.0), 6),
                    -p[1].accuracy,
                    p[0].iteration,
                ),
            )
        else:
            best, ev = min(pool, key=lambda p: (-p[1].accuracy, p[0].iteration))
    fits = within_budget(ev, baseline, objective)
    return Best(
        **{name: getattr(best, name) for name in Candidate.model_fields},
        rule=objective.select,
        within_budget=fits,
        reduction=round(reduction(ev, baseline, objective.target), 6),
        accuracy_drop=round(accuracy_drop(ev, baseline), 6),
        ci_crosses_budget=fits and interval_crosses_budget(ev, objective),
    )


def interval_crosses_budget(record: EvalRecord, objective: Objective) -> bool:
    """Return True when the accuracy change's 95% interval reaches below -max_acc_drop (the point may not)."""
    ci = record.acc_delta_ci
    if not ci:
        return False
    return float(ci[0]) < -objective.max_acc_drop


def objective_met(best: Best | None, baseline: EvalRecord | None, objective: Objective) -> bool:
    """Return True when the best candidate is within budget and reaches the target reduction."""
    if not best or not baseline or not best.eval:
        return False
    return meets_objective(best.eval, baseline, objective)


def meets_objective(record: EvalRecord, baseline: EvalRecord, objective: Objective) -> bool:
    """Return True when an evaluation record is within the budget and reaches the target reduction."""
    return within_budget(record, baseline, objective) and (
        reduction(record, baseline, objective.target) >= objective.target_reduction
    )


QUANT_SLOWDOWN_TOLERANCE = 0.97  # quantization "made it slower" when it leaves under 97% of the pruned model's speed


def quantization_slowed(quant_speedup: float | None, quant_speedup_batch: float | None) -> bool:
    """Return True when dynamic quantization made the pruned model slower at batch 1 and at batch N.

    Args:
        quant_speedup: Pruned fp32 latency over quantized latency at batch 1, measured side by side.
        quant_speedup_batch: The same at the larger batch.
    """
    if quant_speedup is None or quant_speedup_batch is None:
        return False
    return quant_speedup < QUANT_SLOWDOWN_TOLERANCE and quant_speedup_batch < QUANT_SLOWDOWN_TOLERANCE


def quantization_cost_speed(best: Candidate | None, candidates: Sequence[Candidate], objective: Objective) -> bool:
    """Return True when the best candidate is slower than the baseline because of its dynamic quantization.

    Only while every candidate so far was quantized and size is not the target: the planner then drops
    quantization (it reads the same side-by-side measurement), so one more round can find a faster model.
    """
    if not best or not best.eval or objective.target == "size" or objective.quantize == "none":
        return False
    ev = best.eval
    if not torch_quantized_delivery(ev.delivered):  # another backend's form is delivered: torch's cost moot
        return False
    slowed = ev.speedup < 1.0 and quantization_slowed(ev.quant_speedup, ev.quant_speedup_batch)
    return slowed and all(c.quantized for c in candidates if c.status == "ok")


def choose_form(
    variants: Sequence[VariantRecord],
    baseline: EvalRecord,
    objective: Objective,
    eligible: Collection[str] | None = None,
    samples: Samples | None = None,
) -> Fastest | None:
    """Pick the form of a candidate to deliver, ties resolved by a fixed order (`ties.fastest_form`).

    The fastest variant within the accuracy budget at batch 1; forms within noise of the fastest (their paired
    interval reaches within LATENCY_TIE of it, or without samples their medians within LATENCY_TIE) are ranked by
    validation accuracy, then the simpler runtime, then the name, so timing noise cannot swap the delivered file.
    When the objective's target is size, the smallest within budget wins (sizes within LATENCY_TIE of the smallest
    tie, and the same speed rule decides between them). When no variant keeps the budget, the most accurate one is
    delivered (equally accurate ones: the same speed rule), so the candidate is still comparable.

    Args:
        variants: The measured forms (status, accuracy, latency_ms, size_mb, name).
        baseline: The baseline's EvalRecord (its accuracy is the budget's reference).
        objective: Budget (max_acc_drop) and target.
        eligible: Names that may be delivered (None: all).
        samples: Form name -> its per-repeat batch-1 samples of the timing the latencies come from (None: medians).

    Returns:
        The choice (`.chosen`, `.note()` when a tie decided), or None when no eligible variant was measured.
    """
    pool = [
        v
        for v in variants
        if v.status == "ok" and v.accuracy is not None and v.latency_ms and (eligible is None or v.name in eligible)
    ]
    if not pool:
        return None
    fitting = [v for v in pool if within_budget(v, baseline, objective)]
    if not fitting:
        top = max(float(v.accuracy or 0.0) for v in pool)
        return fastest_form([v for v in pool if float(v.accuracy or 0.0) == top], samples)
    if objective.target == "size":
        smallest = min(float(v.size_mb or 0.0) for v in fitting)
        fitting = [v for v in fitting if float(v.size_mb or 0.0) <= smallest * (1 + LATENCY_TIE)]
    return fastest_form(fitting, samples)


def torch_quantized_delivery(name: str | None) -> bool:
    """Return True when a delivered variant name is the plan's dynamically quantized torch model (or unknown)."""
    return not name or name == "torch" or (name.startswith("torch_") and name != "torch_fp32")


PUSH_HEADROOM = 0.5  # a met target is pushed past only while the best model lost at most this share of the budget


def met_at(candidates: Sequence[Candidate], baseline: EvalRecord, objective: Objective) -> int | None:
    """Return the first round whose candidate kept the budget and reached the target, or None."""
    return next((cand.iteration for cand, ev in _ok(candidates) if meets_objective(ev, baseline, objective)), None)


def push_due(
    best: Best | None,
    candidates: Sequence[Candidate],
    baseline: EvalRecord | None,
    objective: Objective,
    iteration: int,
) -> str:
    """Say why one more round pushes past the met target ('' to stop at it).

    A run may go on past a met target for `objective.beyond_target` rounds, within its iteration bound, while the
    best model lost at most PUSH_HEADROOM of the budget on validation (the budget is the user's, the target a floor);
    a push that missed the budget ends it. The deterministic planner then searches above the best goal by corrected
    trials (`planning.search.push_step`).
    """
    if best is None or baseline is None or objective.select != "budget" or iteration >= objective.iterations:
        return ""
    first = met_at(candidates, baseline, objective)
    if first is None:
        return ""
    pushed = [c for c in candidates if c.iteration > first]
    if len(pushed) >= objective.beyond_target:
        return ""
    last = pushed[-1] if pushed else None
    if last is not None and not (last.status == "ok" and last.eval and within_budget(last.eval, baseline, objective)):
        return ""
    if best.accuracy_drop > PUSH_HEADROOM * objective.max_acc_drop:
        return ""
    return (
        f"objective met at iteration {best.iteration} ({best.reduction:.1%} {objective.target} reduction with "
        f"{best.accuracy_drop:.2f} pp of the {objective.max_acc_drop:g} pp budget): pushing past the target "
        f"(round {len(pushed) + 1} of {objective.beyond_target} allowed; --beyond-target 0 stops at the target)"
    )


def stop_reason(
    best: Best | None,
    candidates: Sequence[Candidate],
    baseline: EvalRecord | None,
    objective: Objective,
    iteration: int,
    paired: str | None = None,
) -> tuple[str, str]:
    """Say why the loop stops after this round ("" to go on), with a note when one more round must run.

    Args:
        best: The best candidate after this round (`select_best`).
        candidates: Every candidate so far, this round's included.
        baseline: The baseline's EvalRecord.
        objective: Target, budget and iteration bound.
        iteration: This round.
        paired: An LLM run's own stop reason (`paired_stop`): it decides alone when given.

    Returns:
        (stop reason, note): the note says why a met objective does not stop the run (dynamic quantization made
        the best model slower: one more round without it; or the budget left room to push past the target).
    """
    if paired is not None:
        return paired, ""
    met = objective_met(best, baseline, objective)
    if met and quantization_cost_speed(best, candidates, objective) and iteration < objective.iterations:
        assert best is not None
        return "", (
            "objective met, but dynamic quantization made the best model slower than the baseline "
            f"({best.eval.speedup if best.eval else 0.0:.2f}x): one more round without it"
        )
    if met and (push := push_due(best, candidates, baseline, objective, iteration)):
        return "", push
    if met:
        assert best is not None
        return (
            f"objective met at iteration {best.iteration}: {best.reduction:.1%} {objective.target} reduction "
            f"with {best.accuracy_drop:.2f} pp accuracy drop (budget {objective.max_acc_drop} pp)"
        ), ""
    if iteration >= objective.iterations:
        return f"iteration bound reached ({objective.iterations})", ""
    return "", ""
