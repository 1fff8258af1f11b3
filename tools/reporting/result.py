"""result.json from a finished run's records: the numbers a user decides by."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel

from profiling_agent.state import Best, Candidate, EvalRecord, HistoryEvent, LLMStep, PlannerMode, TestEval, TokenAxis
from profiling_agent.tools import run_layout
from profiling_agent.tools.reporting.outcome import target_outcome
from profiling_agent.tools.reporting.records import RunRecords
from profiling_agent.tools.versions import versions

METRIC_KEYS = (
    "accuracy",
    "agreement",
    "latency_ms",
    "latency_batch_ms",
    "speedup",
    "size_mb",
    "memory_bytes",
    "params",
    "macs",
    "batch_size",
    "threads",
    "device",
    "quant_speedup",
    "quant_speedup_batch",
    "pruned_latency_ms",
    "acc_delta_ci",
    "accuracy_before_recovery",
    "agreement_before_recovery",
    "before_recovery_note",
    "predicted_by",
    "delivered",
    "delivery_note",
    "variants",
    "peer",
    "timing",
)
Row = dict[str, Any]  # one JSON object of result.json
Timing = Mapping[str, Mapping[str, Any]]  # the final joint timing by key ("baseline", "iter_NN", "unpruned_<form>")


def _json(record: BaseModel | None) -> Row | None:
    """Return a record as result.json holds it (None stays None)."""
    return record.model_dump() if record is not None else None


def _metrics(record: EvalRecord | None) -> Row:
    """Return every metric key, None where not measured (a candidate rejected on its trial slice has no record)."""
    dumped = _json(record) or {}
    return {k: dumped.get(k) for k in METRIC_KEYS}


def _with_final_latency(metrics: Row, final: Mapping[str, Any] | None, base: Mapping[str, Any] | None) -> Row:
    """Replace per-round latency by the final joint measurement, keeping the round's numbers beside it."""
    if not final or not base or metrics.get("latency_ms") is None:
        return metrics
    out = {**metrics, "round_latency_ms": metrics.get("latency_ms"), "round_speedup": metrics.get("speedup")}
    out["latency_ms"], out["latency_batch_ms"] = final["latency_ms"], final["latency_batch_ms"]
    out["speedup"] = base["latency_ms"] / final["latency_ms"] if final["latency_ms"] > 0 else 0.0
    out["speedup_batch"] = base["latency_batch_ms"] / final["latency_batch_ms"] if final["latency_batch_ms"] else 0.0
    return out


def planner_facts(history: Sequence[HistoryEvent | Mapping[str, Any]]) -> Row:
    """Return how the planner choice resolved ("mode", "mode_note") and the LLM's transcripts and token usage.

    Read from the analyze events of the state history (checkpointed JSON is validated, old keys mapped); the last
    event of each iteration counts.
    """
    last: dict[int, tuple[PlannerMode, LLMStep | None]] = {}
    for item in history:
        event = item if isinstance(item, HistoryEvent) else HistoryEvent.model_validate(item)
        if event.node == "analyze" and event.planner_choice is not None:
            last[event.iteration] = (event.planner_choice, event.llm)
    if not last:
        return {"mode": None, "mode_note": None, "llm": None}
    steps = [(it, step) for it, (_, step) in sorted(last.items()) if step is not None]
    llm = None
    if steps:
        usage = {
            k: sum(int(s.usage.get(k) or 0) for _, s in steps)
            for k in ("calls", "input_tokens", "output_tokens", "total_tokens")
        }
        llm = {
            "model": steps[-1][1].model,
            "transcripts": [s.transcript for _, s in steps if s.transcript],
            "usage": usage,
            "tool_errors": [{**t, "iteration": it} for it, s in steps for t in s.tool_errors],
            "structured": [{**s.structured, "iteration": it} for it, s in steps],
        }
    choice = last[max(last)][0]
    return {"mode": choice.mode, "mode_note": choice.note, "llm": llm}


def _test_fields(test: TestEval | None, iteration: int) -> Row:
    """Return the held-out test numbers of the delivered candidate (None when it was not measured there)."""
    if test is None or test.best_iteration != iteration:
        return {"test_accuracy": None, "test_delta": None, "test_delta_ci": None, "test_agreement": None}
    return {
        "test_accuracy": test.best_accuracy,
        "test_delta": test.delta,
        "test_delta_ci": test.delta_ci,
        "test_agreement": test.agreement,
    }


def protocol(records: RunRecords) -> Row:
    """Say which images did what: validation selects, test reports, calibration probes (all disjoint)."""
    from profiling_agent.tools.data.subsets import (
        trial_size,
    )  # lazy: numpy; tools.reporting.finish loads this module without it

    data, test = records.data, records.test_eval
    split = records.dataset.split
    splits = (data.splits if data else None) or {  # older runs: what prepare_data's flags said
        "validation": split,
        "test": (test.split if test else None) or split,
        "calibration": "train" if data and data.calib_other_split else split,
    }
    n_eval = data.n_eval if data else None
    return {
        "has_splits": splits.get("validation") is not None,
        "validation": {"split": splits["validation"], "images": n_eval, "used_for": "planning and selection"},
        "test": {
            "split": splits["test"],
            "images": data.n_test if data else None,
            "device": test.device if test else None,
            "used_for": "reporting the baseline and the delivered model only",
        },
        "calibration": {
            "split": splits["calibration"],
            "images": data.n_calib if data else None,
            "used_for": "the sensitivity probe, the refits and int8 calibration",
        },
        "trial": {
            "split": splits["validation"],
            "images": trial_size(n_eval) if n_eval else None,
            "rows": "the trial slice of the validation rows, subsets.json `trial`",
            "used_for": "every plan trial, distillation's early stopping and the recovered candidate's check",
        },
        "subsets": data.subsets if data else None,
        "intervals": "paired bootstrap 95% intervals of accuracy changes against the baseline, same images",
        "baseline_predicted_by": records.baseline_eval.predicted_by if records.baseline_eval else None,
    }


def joint_latency(latency: Timing, best: Best | None) -> dict[str, Mapping[str, Any]]:
    """Return the final latencies result.json reports per candidate (quantization only: the peer's joint numbers)."""
    from profiling_agent.tools.evaluation.delivery import (
        PEER_PREFIX,
    )  # lazy: torch; tools.reporting.finish loads this module without it

    joint = {k: v for k, v in latency.items() if not k.startswith(PEER_PREFIX)}
    if best is not None and best.iteration == 0 and best.eval is not None:
        key = PEER_PREFIX + str(best.eval.delivered)
        if key in latency or "baseline" in latency:
            joint["iter_00"] = latency.get(key) or latency["baseline"]
    return joint


def token_facts(c: Candidate, axis: TokenAxis | None) -> Row | None:
    """Return a round's token merging: its entry, schedule, the latency its rate bought, and round 1's weighing.

    The latency bought is the profiled form's at that rate (measured at the profile step). None when the round
    neither merged nor weighed merging.
    """
    entry, weighed = c.plan.tokens, c.planner_meta.tokens
    if entry is None and weighed is None:
        return None
    facts: Row = {"entry": _json(entry), "schedule": c.token_schedule, "weighed": _json(weighed)}
    if entry is None or axis is None:
        return facts
    rate, schedule = entry.rate, entry.schedule
    row = next(
        (r for r in axis.rates if (r.rate == rate if rate is not None else r.schedule == schedule)),
        None,
    )
    if row is not None:
        facts["bought"] = {
            "form": axis.form,
            "batch": axis.batch,
            "base_ms": axis.base_ms,
            "latency_ms": row.latency_ms,
            "saved_share": row.saved_share,
        }
    return facts


def _path_and_sha(c: Candidate) -> tuple[str | None, str | None]:
    """Return the folder and sha256 of the candidate's delivered form (the torch artifact when that is it)."""
    artifact = c.delivered or c.artifact
    return (artifact.path, artifact.sha256) if artifact is not None else (None, None)


def _candidate_row(
    c: Candidate, final_latency: Timing, base_final: Mapping[str, Any] | None, axis: TokenAxis | None = None
) -> Row:
    """Return one candidate's entry of result.json (its round's metrics, or the final joint latency when taken)."""
    meta = c.planner_meta
    path, sha256 = _path_and_sha(c)
    tokens = token_facts(c, axis)
    final = final_latency.get(run_layout.iteration_name(c.iteration))
    return {
        "iteration": c.iteration,
        "status": c.status,
        **_with_final_latency(_metrics(c.eval), final, base_final),
        "plan": c.plan.model_dump(),
        "planner": c.planner,
        "llm": _json(meta.llm),
        "turn": meta.turn,
        "vs_proposal": _json(meta.vs_proposal),
        "block_trials": [b.model_dump() for b in meta.block_trials] if meta.block_trials is not None else None,
        "applied": [a.model_dump() for a in c.applied],
        "quantized": len(c.quantized),
        "recovery": _json(c.recovery),
        "check": _json(c.check),
        "prediction": {
            "predicted_drop": meta.predicted_drop,
            "predicted_interval": meta.predicted_interval,
            "expected_drop": meta.expected_drop,
            "expected_interval": meta.expected_interval,
            "correction": meta.correction,
        },
        "path": path,
        "sha256": sha256,
        "error": c.error,
        **({"tokens": tokens} if tokens is not None else {}),  # only a round that merged or weighed merging
    }


def _best_row(
    best: Best | None, test: TestEval | None, final_latency: Timing, base_final: Mapping[str, Any] | None
) -> Row | None:
    """Return result.json's "best" entry: the delivered candidate's metrics, selection facts and test numbers."""
    if best is None:
        return None
    final = final_latency.get(run_layout.iteration_name(best.iteration))
    fp32 = best.recovered or best.pruned  # after recovery
    return {
        "iteration": best.iteration,
        **_with_final_latency(_metrics(best.eval), final, base_final),
        "rule": best.rule,
        "within_budget": best.within_budget,
        "reduction": best.reduction,
        "accuracy_drop": best.accuracy_drop,
        "ci_crosses_budget": best.ci_crosses_budget,
        **_test_fields(test, best.iteration),
        "plan": best.plan.model_dump(),
        "path": "best",
        "source_path": _path_and_sha(best)[0],
        "pruned_path": fp32.path if fp32 is not None else None,
    }


def _baseline_eval(records: RunRecords, base_final: Mapping[str, Any] | None) -> EvalRecord | None:
    """Return the baseline's evaluation with the final joint latency in place of its round's, when one was taken."""
    baseline_eval = records.baseline_eval
    if baseline_eval is None or not base_final:
        return baseline_eval
    update = {"latency_ms": base_final["latency_ms"], "latency_batch_ms": base_final["latency_batch_ms"]}
    return baseline_eval.model_copy(update={**update, "speedup": 1.0})


def _planner_entry(records: RunRecords) -> Row:
    """Return result.json's "planner" entry: what was asked, what planned each round, fallbacks, LLM facts."""
    return {
        "requested": records.objective.planner,
        "used": sorted({c.planner for c in records.candidates if c.planner}),
        "fallbacks": [f.model_dump() for f in records.fallbacks],
        **planner_facts(records.history),
    }


def time_facts(history: Sequence[HistoryEvent], budget_minutes: float | None) -> Row:
    """Return result.json's "time": each step's spent and expected seconds, their sum, the budget and its cuts."""
    steps = [
        {"node": e.node, "iteration": e.iteration, "spent_s": e.spent_s, "expected_s": e.expected_s}
        for e in history
        if e.spent_s is not None
    ]
    plans = [e.budget for e in history if e.budget is not None]
    return {
        "budget_minutes": budget_minutes,
        "spent_s": round(sum(float(s["spent_s"] or 0.0) for s in steps), 3),
        "cuts": plans[-1].cuts if plans else [],
        "budget_plan": plans[-1].model_dump() if plans else None,
        "steps": steps,
    }


def build_result(records: RunRecords, joint_timing: Timing | None = None) -> Row:
    """Assemble result.json from the finished run's records.

    `joint_timing` is the side-by-side latency measurement taken at the end of the run: "baseline", "iter_NN"
    and the unpruned model's forms ("unpruned_<form>"). When given, its numbers (and the speedups computed from
    them) are the ones reported per candidate (`joint_latency`), and a latency target's outcome is measured in it
    (`outcome.target_outcome`).
    """
    final_latency = joint_latency(joint_timing or {}, records.best)
    base_final = final_latency.get("baseline")
    baseline_eval = _baseline_eval(records, base_final)
    best, labels, profile = records.best, records.labels, records.profile
    return {
        "thread_id": records.thread_id,
        "status": records.status,
        "stop_reason": records.stop_reason,
        "model": records.model.model_dump(),
        "dataset": records.dataset.model_dump(),
        "objective": records.objective.model_dump(),
        "family": records.family,
        "input_shape": _json(records.input_shape),
        "labels": {
            "method": labels.method if labels else None,
            "restricted": labels.restricted if labels else None,
            "allowed_ids": labels.allowed_ids if labels else None,
        },
        "planner": _planner_entry(records),
        "protocol": protocol(records),
        "baseline": {
            **_metrics(baseline_eval),
            "test_accuracy": records.test_eval.baseline_accuracy if records.test_eval else None,
            "path": records.baseline.path if records.baseline else None,
        },
        "best": _best_row(best, records.test_eval, final_latency, base_final),
        "outcome": target_outcome(best, baseline_eval, records.objective, joint_timing),
        "backend_profile": _json(profile.backend) if profile else None,
        "candidates": [_candidate_row(c, final_latency, base_final, records.token_axis) for c in records.candidates],
        **({"token_axis": records.token_axis.model_dump()} if records.token_axis else {}),  # ViT/DeiT, latency target
        "latency_method": (
            "final: baseline and all candidates measured together, interleaved, median of repeats"
            if final_latency
            else "per round: each candidate measured interleaved with the baseline"
        ),
        "time": time_facts(records.history, records.objective.time_budget),
        "versions": versions(),
    }
