"""Evaluation agent: every backend form of a candidate measured beside the baseline; the fastest is delivered."""

from __future__ import annotations

from typing import Any

from langgraph.runtime import Runtime

from profiling_agent.nodes.common import (
    allowed_ids,
    context_of,
    current_candidate,
    event,
    prepared,
    progress_callback,
    run_dir,
)
from profiling_agent.state import Context, State


def evaluate(state: State, runtime: Runtime[Context]) -> dict[str, Any]:
    """Measure the candidate's forms (torch, ONNX Runtime, OpenVINO) beside the baseline and the unpruned peer."""
    from profiling_agent.tools.evaluation.candidate_eval import evaluate_candidate  # lazy: torch; steps load without it
    from profiling_agent.tools.evaluation.records import CandidateRound  # lazy: torch; steps load without it

    assert state.baseline_eval is not None and state.baseline is not None  # measure_baseline ran
    it = state.iteration
    where = CandidateRound(
        root=run_dir(state),
        tensors=prepared(state),
        iteration=it,
        seed=state.dataset.seed,
        allowed_ids=allowed_ids(state),
        progress=progress_callback(runtime, f"iteration {it}: evaluating"),
    )
    current, message = evaluate_candidate(
        current_candidate(state), state.baseline_eval, state.baseline, state.objective, context_of(runtime), where
    )
    return {"current": current.model_dump(), "history": event("evaluate", message, it)}
