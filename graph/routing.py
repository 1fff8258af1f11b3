"""Pure routing functions: the conditional edges of the graph, with the loop bound enforced here."""

from __future__ import annotations

from typing import Literal

from profiling_agent.state import State


def after_analyze(state: State) -> Literal["approve", "prune", "iterate", "evaluate_held_out"]:
    """Go prune the new plan (through human approval when the run asks for it), unless the planner converged.

    A paired round whose plan was measured before arrives finished (`paired.repeated_round`): it is only recorded.
    """
    if state.stop_reason:
        return "evaluate_held_out"
    if state.current is not None and state.current.status in ("ok", "rejected"):
        return "iterate"
    return "approve" if state.objective.approve else "prune"


def after_approve(state: State) -> Literal["prune", "iterate"]:
    """Apply an approved or edited plan; a rejected one is recorded and skipped."""
    return "iterate" if state.current and state.current.status == "rejected" else "prune"


def after_prune(state: State) -> Literal["recover", "iterate"]:
    """Recover (then quantize) a pruned candidate; a plan the engine could not apply is recorded as failed."""
    return "recover" if state.current and state.current.status == "ok" else "iterate"


def after_quantize(state: State) -> Literal["evaluate", "iterate"]:
    """Evaluate a finished candidate; one whose quantization failed is recorded as failed."""
    return "evaluate" if state.current and state.current.status == "ok" else "iterate"


def after_iterate(state: State) -> Literal["analyze", "evaluate_held_out"]:
    """Loop back to planning until a stop reason is set or the iteration bound is reached, whatever any planner says."""
    from profiling_agent.tools.planning.paired import (
        round_bound,
    )  # lazy: torch; graph.builder loads this module without it

    if state.stop_reason or state.iteration >= round_bound(state.objective, state.candidates):
        return "evaluate_held_out"
    return "analyze"
