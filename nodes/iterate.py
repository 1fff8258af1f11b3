"""Iterative pruning agent's bookkeeping: record the candidate, keep the best, decide whether to go on."""

from __future__ import annotations

from typing import Any

from langgraph.runtime import Runtime

from profiling_agent.nodes.common import current_candidate, event
from profiling_agent.state import Candidate, CompressionPlan, Context, State
from profiling_agent.tools.planning.round_check import check_message, round_check


def finished_candidate(state: State) -> Candidate:
    """Turn this iteration's in-progress candidate into its final record (ok only when it was evaluated)."""
    current = current_candidate(state)
    status = current.status
    final = "rejected" if status == "rejected" else "ok" if status == "ok" and current.eval else "failed"
    return current.model_copy(
        update={
            "iteration": state.iteration,
            "status": final,
            "plan": state.plan or CompressionPlan(),
            "planner": state.planner_used or "deterministic",
        }
    )


def iterate(state: State, runtime: Runtime[Context]) -> dict[str, Any]:
    """Append this iteration's candidate, re-select the best by the objective's rule, set the stop reason."""
    from profiling_agent.tools.evaluation.selection import (
        select_best,
        stop_reason,
    )  # lazy: torch; steps load without it
    from profiling_agent.tools.planning.paired import is_paired, paired_stop  # lazy: torch; steps load without it

    base, objective = state.baseline_eval, state.objective
    finished_one = finished_candidate(state)
    check = round_check(finished_one, base, objective.target)
    cand = finished_one.model_copy(update={"check": check})
    candidates = [*state.candidates, cand]
    best = select_best(candidates, base, objective) if base else None
    # an LLM run stops when the deterministic sequence would (tools/planning/paired.py)
    paired = paired_stop(candidates, base, objective)[0] if is_paired(candidates) else None
    stop, note = stop_reason(best, candidates, base, objective, state.iteration, paired)
    if cand.status == "ok":
        message = f"candidate {state.iteration} recorded; best is iteration {best.iteration if best else '-'}"
        message += check_message(check)
    elif cand.status == "rejected":
        message = f"candidate {state.iteration} skipped: {cand.error}"
    else:
        message = f"candidate {state.iteration} failed: {cand.error}"
    message += f"; {note}" if note else ""
    return {
        "candidates": [cand.model_dump()],
        "best": best.model_dump() if best else None,
        "stop_reason": stop,
        "current": None,
        "history": event("iterate", message + (f"; stopping: {stop}" if stop else ""), state.iteration),
    }
