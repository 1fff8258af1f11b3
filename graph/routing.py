"""Pure routing functions: the conditional edges of the graph, with the loop bound enforced here."""

from __future__ import annotations

from typing import Literal

from profiling_agent.state import State


def after_analyze(state: State) -> Literal["prune", "report"]:
    """Go prune the new plan, unless the planner converged (nothing new to try)."""
    return "report" if state.stop_reason else "prune"


def after_prune(state: State) -> Literal["quantize", "evaluate"]:
    """Skip quantization when pruning failed; evaluate still records the baseline and the failure."""
    return "quantize" if (state.current or {}).get("status") == "ok" else "evaluate"


def after_iterate(state: State) -> Literal["analyze", "report"]:
    """Loop back to planning until a stop reason is set or the iteration bound is reached, whatever any planner says."""
    if state.stop_reason or state.iteration >= state.objective.iterations:
        return "report"
    return "analyze"
