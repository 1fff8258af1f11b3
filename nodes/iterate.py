"""Iterative pruning agent's bookkeeping: record the candidate, keep the best, decide whether to go on."""

from __future__ import annotations

from typing import Any

from langgraph.runtime import Runtime

from profiling_agent.nodes.common import event
from profiling_agent.state import Candidate, Context, State


def finished_candidate(state: State) -> dict[str, Any]:
    """Turn the in-progress `current` dict into a Candidate record."""
    current = dict(state.current or {})
    status = current.get("status")
    record = Candidate(
        iteration=state.iteration,
        status="rejected" if status == "rejected" else "ok" if status == "ok" and current.get("eval") else "failed",
        plan=state.plan or {},
        planner=state.planner_used or "deterministic",
        applied=current.get("applied", []),
        quantized=current.get("quantized", []),
        artifact=current.get("artifact"),
        eval=current.get("eval"),
        error=current.get("error"),
    ).model_dump()
    record["planner_meta"] = current.get("planner_meta", {})
    if current.get("review"):  # the human decision on the plan (objective.approve)
        record["review"] = current["review"]
    return record


def iterate(state: State, runtime: Runtime[Context]) -> dict[str, Any]:
    """Append this iteration's candidate, re-select the best by the objective's rule, set the stop reason."""
    from profiling_agent.tools.evaluation.selection import objective_met, quantization_cost_speed, select_best

    cand = finished_candidate(state)
    candidates = [*state.candidates, cand]
    objective = state.objective
    best = select_best(candidates, state.baseline_eval, objective) if state.baseline_eval else None
    stop = ""
    if objective_met(best, state.baseline_eval, objective) and quantization_cost_speed(best, candidates, objective):
        if state.iteration < objective.iterations:
            note = (
                "objective met, but dynamic quantization made the best model slower than the baseline "
                f"({best['eval']['speedup']:.2f}x): one more round without it"
            )
            return {
                "candidates": [cand],
                "best": best,
                "stop_reason": "",
                "current": None,
                "history": event("iterate", f"candidate {state.iteration} recorded; {note}", state.iteration),
            }
    if objective_met(best, state.baseline_eval, objective):
        stop = (
            f"objective met at iteration {best['iteration']}: {best['reduction']:.1%} {objective.target} reduction "
            f"with {best['accuracy_drop']:.2f} pp accuracy drop (budget {objective.max_acc_drop} pp)"
        )
    elif state.iteration >= objective.iterations:
        stop = f"iteration bound reached ({objective.iterations})"
    if cand["status"] == "ok":
        message = f"candidate {state.iteration} recorded; best is iteration {best['iteration'] if best else '-'}"
    elif cand["status"] == "rejected":
        message = f"candidate {state.iteration} skipped: {cand['error']}"
    else:
        message = f"candidate {state.iteration} failed: {cand['error']}"
    return {
        "candidates": [cand],
        "best": best,
        "stop_reason": stop,
        "current": None,
        "history": event("iterate", message + (f"; stopping: {stop}" if stop else ""), state.iteration),
    }
