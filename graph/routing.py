"""Pure routing functions: the conditional edges of the graph, with the loop bound enforced here."""

from __future__ import annotations

from typing import Literal

from profiling_agent.state import State


def after_analyze(state: State) -> Literal["approve", "prune", "report"]:
    """Go prune the new plan (through human approval when the run asks for it), unless the planner converged."""
    if state.stop_reason:
        return "report"
    return "approve" if state.objective.approve else "prune"


def after_approve(state: State) -> Literal["prune", "evaluate", "iterate"]:
    """Apply an approved or edited plan; a rejected one is skipped (evaluate still measures the baseline once)."""
    if (state.current or {}).get("status") != "rejected":
        return "prune"
    return "iterate" if state.baseline_eval else "evaluate"


def after_prune(state: State) -> Literal["quantize", "evaluate"]:
    """Skip quantization when pruning failed; evaluate still records the baseline and the failure."""
    return "quantize" if (state.current or {}).get("status") == "ok" else "evaluate"


def after_iterate(state: State) -> Literal["analyze", "report"]:
    """Loop back to planning until a stop reason is set or the iteration bound is reached, whatever any planner says."""
    if state.stop_reason or state.iteration >= state.objective.iterations:
        return "report"
    return "analyze"
