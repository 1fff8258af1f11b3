"""Report agent: save the best model, write result.json and report.md, mark the run done."""

from __future__ import annotations

import shutil
from typing import Any

from langgraph.runtime import Runtime

from profiling_agent.nodes.common import absolute, event, run_dir, thread_id_of
from profiling_agent.state import Context, State


def report(state: State, runtime: Runtime[Context]) -> dict[str, Any]:
    """Copy the best candidate to RUN/best and write result.json and report.md."""
    from profiling_agent.tools.io import atomic_dir, write_json_atomic, write_text_atomic
    from profiling_agent.tools.report import build_result, render_markdown

    root = run_dir(state)
    if state.best and state.best.get("artifact"):
        with atomic_dir(root / "best") as tmp:
            shutil.copytree(absolute(state, state.best["artifact"]["path"]), tmp, dirs_exist_ok=True)
    final = state.model_dump()
    final["status"] = "done"
    result = build_result(final, thread_id_of(runtime) if not state.run_path else root.name)
    write_json_atomic(root / "result.json", result)
    write_text_atomic(root / "report.md", render_markdown(result, state.profile))
    best = result.get("best")
    message = (
        f"best: iteration {best['iteration']}, top-1 {best['accuracy']:.2f}%, {best['params']:,} params"
        if best
        else "no candidate finished"
    )
    return {
        "status": "done",
        "report": {"markdown": "report.md", "result": "result.json", "best": "best" if best else None},
        "history": event("report", message, state.iteration),
    }
