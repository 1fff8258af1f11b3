"""Report agent: save the best model, write result.json, plots, report.md and report.html, mark the run done."""

from __future__ import annotations

import shutil
from typing import Any

from langgraph.runtime import Runtime

from profiling_agent.nodes.common import absolute, context_of, delivered_ref, emit, event, prepared, run_dir
from profiling_agent.state import Context, State
from profiling_agent.tools import run_layout
from profiling_agent.tools.io import atomic_dir
from profiling_agent.tools.reporting.finish import write_run_report
from profiling_agent.tools.reporting.records import RunRecords


def run_records(state: State, thread_id: str) -> RunRecords:
    """Return the records of the finished run the report is built from (status done)."""
    return RunRecords(
        thread_id=thread_id,
        status="done",
        stop_reason=state.stop_reason,
        model=state.model,
        dataset=state.dataset,
        objective=state.objective,
        family=state.family,
        input_shape=state.input_shape,
        labels=state.labels,
        data=state.data,
        profile=state.profile,
        token_axis=state.token_axis,
        baseline=state.baseline,
        baseline_eval=state.baseline_eval,
        test_eval=state.test_eval,
        candidates=state.candidates,
        best=state.best,
        fallbacks=state.fallbacks,
        history=state.history,
    )


def report(state: State, runtime: Runtime[Context]) -> dict[str, Any]:
    """Copy the best candidate to RUN/best and write result.json, plots/, report.md and report.html."""
    from profiling_agent.tools.evaluation.delivery import summary_line  # lazy: torch; steps load without it
    from profiling_agent.tools.evaluation.final_latency import final_latency  # lazy: torch; steps load without it

    root = run_dir(state)
    task = "final latency (all models side by side)"
    emit(runtime, kind="progress", task=task, done=0, total=2, label="")
    images = (lambda: prepared(state)["eval_pixels"]) if state.data else None
    latency, timing = final_latency(
        state.candidates, state.baseline, state.baseline_eval, context_of(runtime), root=root, images=images
    )
    emit(runtime, kind="progress", task=task, done=2, total=2, label="")
    delivered = delivered_ref(state.best)
    if delivered is not None:  # the delivered form: an ONNX folder (model.onnx + recipe.json) or the torch artifact
        with atomic_dir(root / run_layout.BEST) as tmp:
            shutil.copytree(absolute(state, delivered.path), tmp, dirs_exist_ok=True)
    thread = getattr(getattr(runtime, "execution_info", None), "thread_id", None) or root.name  # forks: RUN/T/forks/
    records = run_records(state, str(thread))
    result, files, trouble = write_run_report(root, records, latency, timing, plots=context_of(runtime).plots)
    best = result.get("best")
    message = (
        f"best: iteration {best['iteration']}, top-1 {best['accuracy']:.2f}%, {best['params']:,} params"
        if best
        else "no candidate finished"
    ) + trouble
    if result.get("delivery"):
        message += "; " + summary_line(result["delivery"])
    return {
        "status": "done",
        "report": {
            "markdown": files["markdown"],
            "html": files["html"],
            "plots": sorted(files["plots"].values()),
            "result": run_layout.RESULT,
            "best": run_layout.BEST if best else None,
        },
        "history": event("report", message, state.iteration),
    }
