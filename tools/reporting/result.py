"""result.json from a finished run's state: the numbers a user decides by."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from profiling_agent.state import HistoryEvent, LLMStep, PlannerMode
from profiling_agent.tools import run_layout
from profiling_agent.tools.reporting.outcome import target_outcome
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


def _metrics(record: dict[str, Any] | None) -> dict[str, Any]:
    """Return every metric key, None where not measured (a candidate rejected on its trial slice has no record)."""
    return {k: (record or {}).get(k) for k in METRIC_KEYS}


def _with_final_latency(metrics: dict[str, Any], final: dict[str, Any] | None, base: dict[str, Any] | None):
    """Replace per-round latency by the final joint measurement, keeping the round's numbers beside it."""
    if not final or not base or metrics.get("latency_ms") is None:
        return metrics
    out = {**metrics, "round_latency_ms": metrics.get("latency_ms"), "round_speedup": metrics.get("speedup")}
    out["latency_ms"], out["latency_batch_ms"] = final["latency_ms"], final["latency_batch_ms"]
    out["speedup"] = base["latency_ms"] / final["latency_ms"] if final["latency_ms"] > 0 else 0.0
    out["speedup_batch"] = base["latency_batch_ms"] / final["latency_batch_ms"] if final["latency_batch_ms"] else 0.0
    return out


def planner_facts(history: Sequence[HistoryEvent | Mapping[str, Any]]) -> dict[str, Any]:
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


def _test_fields(test: dict[str, Any], iteration: int) -> dict[str, Any]:
    """Return the held-out test numbers of the delivered candidate (None when it was not measured there)."""
    if not test or test.get("best_iteration") != iteration:
        return {"test_accuracy": None, "test_delta": None, "test_delta_ci": None, "test_agreement": None}
    return {
        "test_accuracy": test.get("best_accuracy"),
        "test_delta": test.get("delta"),
        "test_delta_ci": test.get("delta_ci"),
        "test_agreement": test.get("agreement"),
    }


def protocol(state: dict[str, Any]) -> dict[str, Any]:
    """Say which images did what: validation selects, test reports, calibration probes (all disjoint)."""
    from profiling_agent.tools.data.subsets import trial_size

    data, test = state.get("data") or {}, state.get("test_eval") or {}
    split = (state.get("dataset") or {}).get("split")
    splits = data.get("splits") or {  # older runs: what prepare_data's flags said
        "validation": split,
        "test": test.get("split") or split,
        "calibration": "train" if data.get("calib_other_split") else split,
    }
    return {
        "has_splits": splits.get("validation") is not None,
        "validation": {
            "split": splits["validation"],
            "images": data.get("n_eval"),
            "used_for": "planning and selection",
        },
        "test": {
            "split": splits["test"],
            "images": data.get("n_test"),
            "device": test.get("device"),
            "used_for": "reporting the baseline and the delivered model only",
        },
        "calibration": {
            "split": splits["calibration"],
            "images": data.get("n_calib"),
            "used_for": "the sensitivity probe, the refits and int8 calibration",
        },
        "trial": {
            "split": splits["validation"],
            "images": trial_size(int(data["n_eval"])) if data.get("n_eval") else None,
            "rows": "the trial slice of the validation rows, subsets.json `trial`",
            "used_for": "every plan trial, distillation's early stopping and the recovered candidate's check",
        },
        "subsets": data.get("subsets"),
        "intervals": "paired bootstrap 95% intervals of accuracy changes against the baseline, same images",
        "baseline_predicted_by": (state.get("baseline_eval") or {}).get("predicted_by"),
    }


def joint_latency(latency: Mapping[str, Any], best: Mapping[str, Any] | None) -> dict[str, Any]:
    """Return the final latencies result.json reports per candidate (quantization only: the peer's joint numbers)."""
    from profiling_agent.tools.evaluation.delivery import PEER_PREFIX

    joint = {k: v for k, v in latency.items() if not k.startswith(PEER_PREFIX)}
    if best and best.get("iteration") == 0 and best.get("eval"):
        key = PEER_PREFIX + str(best["eval"]["delivered"])
        if key in latency or "baseline" in latency:
            joint["iter_00"] = latency.get(key) or latency["baseline"]
    return joint


def token_facts(c: Mapping[str, Any], axis: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """Return a round's token merging: its entry, schedule, the latency its rate bought, and round 1's weighing.

    The latency bought is the profiled form's at that rate (measured at the profile step). None when the round
    neither merged nor weighed merging.
    """
    entry = (c.get("plan") or {}).get("tokens")
    weighed = (c.get("planner_meta") or {}).get("tokens")
    if entry is None and weighed is None:
        return None
    facts: dict[str, Any] = {"entry": entry, "schedule": c.get("token_schedule"), "weighed": weighed}
    rate, schedule = (entry or {}).get("rate"), (entry or {}).get("schedule")
    row = next(
        (
            r
            for r in (axis or {}).get("rates", [])
            if entry and ((rate is not None and r["rate"] == rate) or (rate is None and r["schedule"] == schedule))
        ),
        None,
    )
    if row is not None and axis is not None:
        facts["bought"] = {
            "form": axis["form"],
            "batch": axis["batch"],
            "base_ms": axis["base_ms"],
            "latency_ms": row["latency_ms"],
            "saved_share": row["saved_share"],
        }
    return facts


def _candidate_row(
    c: dict[str, Any],
    final_latency: Mapping[str, Any],
    base_final: dict[str, Any] | None,
    axis: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Return one candidate's entry of result.json (its round's metrics, or the final joint latency when taken)."""
    meta = c.get("planner_meta") or {}
    artifact = c.get("delivered") or c.get("artifact") or {}
    tokens = token_facts(c, axis)
    return {
        "iteration": c["iteration"],
        "status": c["status"],
        **_with_final_latency(
            _metrics(c.get("eval")), final_latency.get(run_layout.iteration_name(c["iteration"])), base_final
        ),
        "plan": c.get("plan"),
        "planner": c.get("planner"),
        "llm": meta.get("llm"),
        "turn": meta.get("turn"),
        "vs_proposal": meta.get("vs_proposal"),
        "block_trials": meta.get("block_trials"),
        "applied": c.get("applied"),
        "quantized": len(c.get("quantized") or []),
        "recovery": c.get("recovery"),
        "check": c.get("check"),
        "prediction": {
            k: meta.get(k)
            for k in ("predicted_drop", "predicted_interval", "expected_drop", "expected_interval", "correction")
        },
        "path": artifact.get("path"),
        "sha256": artifact.get("sha256"),
        "error": c.get("error"),
        **({"tokens": tokens} if tokens is not None else {}),  # only a round that merged or weighed merging
    }


def _best_row(
    best: dict[str, Any] | None,
    test: dict[str, Any],
    final_latency: Mapping[str, Any],
    base_final: dict[str, Any] | None,
) -> dict[str, Any] | None:
    """Return result.json's "best" entry: the delivered candidate's metrics, selection facts and test numbers."""
    if not best:
        return None
    return {
        "iteration": best["iteration"],
        **_with_final_latency(
            _metrics(best.get("eval")), final_latency.get(run_layout.iteration_name(best["iteration"])), base_final
        ),
        "rule": best.get("rule"),
        "within_budget": best.get("within_budget"),
        "reduction": best.get("reduction"),
        "accuracy_drop": best.get("accuracy_drop"),
        "ci_crosses_budget": best.get("ci_crosses_budget", False),
        **_test_fields(test, best["iteration"]),
        "plan": best.get("plan"),
        "path": "best",
        "source_path": (best.get("delivered") or best.get("artifact") or {}).get("path"),
        "pruned_path": (best.get("recovered") or best.get("pruned") or {}).get("path"),  # fp32, after recovery
    }


def _baseline_eval(state: dict[str, Any], base_final: dict[str, Any] | None) -> dict[str, Any] | None:
    """Return the baseline's evaluation with the final joint latency in place of its round's, when one was taken."""
    baseline_eval = state.get("baseline_eval")
    if not baseline_eval or not base_final:
        return baseline_eval
    return {
        **baseline_eval,
        "latency_ms": base_final["latency_ms"],
        "latency_batch_ms": base_final["latency_batch_ms"],
        "speedup": 1.0,
    }


def _planner_entry(state: dict[str, Any], objective: Mapping[str, Any]) -> dict[str, Any]:
    """Return result.json's "planner" entry: what was asked, what planned each round, fallbacks, LLM facts."""
    return {
        "requested": objective.get("planner"),
        "used": sorted({c.get("planner") for c in state.get("candidates", []) if c.get("planner")}),
        "fallbacks": state.get("fallbacks", []),
        **planner_facts(state.get("history") or []),
    }


def build_result(
    state: dict[str, Any], thread_id: str, joint_timing: dict[str, dict[str, Any]] | None = None
) -> dict[str, Any]:
    """Assemble result.json from the final state (a dict of the graph state's fields).

    `joint_timing` is the side-by-side latency measurement taken at the end of the run: "baseline", "iter_NN"
    and the unpruned model's forms ("unpruned_<form>"). When given, its numbers (and the speedups computed from
    them) are the ones reported per candidate (`joint_latency`), and a latency target's outcome is measured in it
    (`outcome.target_outcome`).
    """
    final_latency = joint_latency(joint_timing or {}, state.get("best"))
    base_final = final_latency.get("baseline")
    test = state.get("test_eval") or {}
    baseline_eval = _baseline_eval(state, base_final)
    best = state.get("best")
    objective = state.get("objective") or {}
    return {
        "thread_id": thread_id,
        "status": state.get("status"),
        "stop_reason": state.get("stop_reason"),
        "model": state.get("model"),
        "dataset": state.get("dataset"),
        "objective": objective,
        "family": state.get("family"),
        "input_shape": state.get("input_shape"),
        "labels": {k: (state.get("labels") or {}).get(k) for k in ("method", "restricted", "allowed_ids")},
        "planner": _planner_entry(state, objective),
        "protocol": protocol(state),
        "baseline": {
            **_metrics(baseline_eval),
            "test_accuracy": test.get("baseline_accuracy"),
            "path": (state.get("baseline") or {}).get("path"),
        },
        "best": _best_row(best, test, final_latency, base_final),
        "outcome": target_outcome(best, baseline_eval, objective, joint_timing),
        "backend_profile": (state.get("profile") or {}).get("backend"),
        "candidates": [
            _candidate_row(c, final_latency, base_final, state.get("token_axis")) for c in state.get("candidates", [])
        ],
        **({"token_axis": state["token_axis"]} if state.get("token_axis") else {}),  # ViT/DeiT, latency target
        "latency_method": (
            "final: baseline and all candidates measured together, interleaved, median of repeats"
            if final_latency
            else "per round: each candidate measured interleaved with the baseline"
        ),
        "versions": versions(),
    }
