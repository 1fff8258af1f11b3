"""Baseline agent: measure the untouched model once, in every deployable form (the quantization-only peer)."""

from __future__ import annotations

from typing import Any

from langgraph.runtime import Runtime

from profiling_agent.nodes.common import allowed_ids, context_of, event, prepared, progress_callback, run_dir
from profiling_agent.state import Context, State


def measure_baseline(state: State, runtime: Runtime[Context]) -> dict[str, Any]:
    """Measure the baseline and its ONNX Runtime / OpenVINO forms side by side; every candidate is compared with it."""
    from profiling_agent.tools.evaluation.baseline_eval import measure_unpruned  # lazy: torch; steps load without it

    assert state.baseline is not None  # saved by acquire
    record, message = measure_unpruned(
        state.baseline,
        state.objective,
        context_of(runtime),
        root=run_dir(state),
        tensors=prepared(state),
        macs=state.profile.totals.get("macs") if state.profile else None,
        allowed_ids=allowed_ids(state),
        progress=progress_callback(runtime, "measuring the baseline"),
    )
    return {"baseline_eval": record.model_dump(), "history": event("measure_baseline", message)}
