"""Helpers shared by the nodes: run folders, progress events, history entries, model loading."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

from langgraph.runtime import Runtime

from profiling_agent.state import Context, State


def context_of(runtime: Runtime[Context] | None) -> Context:
    """Return the run context, or the defaults when the graph was invoked without one."""
    ctx = getattr(runtime, "context", None)
    if ctx is None:
        return Context()
    if isinstance(ctx, dict):
        names = {f.name for f in dataclasses.fields(Context)}
        return Context(**{k: v for k, v in ctx.items() if k in names})
    return ctx


def thread_id_of(runtime: Runtime[Context] | None) -> str:
    """Return the LangGraph thread id, or a time-based id when the graph runs without a checkpointer."""
    info = getattr(runtime, "execution_info", None)
    thread = getattr(info, "thread_id", None)
    return str(thread) if thread else time.strftime("run-%Y%m%d-%H%M%S")


def run_dir(state: State) -> Path:
    """Return the run folder recorded by the acquire node."""
    if not state.run_path:
        raise RuntimeError("run_path is not set: the acquire node has not run")
    return Path(state.run_path)


def rel(state: State, path: str | Path) -> str:
    """Return `path` relative to the run folder (artifact references are relative)."""
    return str(Path(path).resolve().relative_to(run_dir(state).resolve()))


def absolute(state: State, path: str) -> Path:
    """Resolve a run-relative artifact path."""
    return run_dir(state) / path


def iteration_dir(state: State, iteration: int) -> Path:
    """Return the folder of one iteration's files (derived from thread and iteration, so re-runs overwrite)."""
    return run_dir(state) / f"iter_{iteration:02d}"


def event(node: str, message: str, iteration: int = 0, **data: Any) -> list[dict[str, Any]]:
    """Build a one-element history update."""
    return [{"node": node, "iteration": iteration, "time": round(time.time(), 3), "message": message, **data}]


def emit(runtime: Runtime[Context] | None, **payload: Any) -> None:
    """Send a custom stream event (progress) when the caller streams `custom`; ignore otherwise."""
    writer = getattr(runtime, "stream_writer", None)
    if writer is None:
        return
    try:
        writer(payload)
    except Exception:  # a stream writer outside a streaming run must never break a node
        pass


def progress_callback(runtime: Runtime[Context] | None, task: str):
    """Return a `progress(done, total, label)` callable that emits progress events for `task`."""

    def progress(done: int, total: int, label: str = "") -> None:
        emit(runtime, kind="progress", task=task, done=done, total=total, label=label)

    return progress


def load_artifact_model(state: State, ref: dict[str, Any], device: str = "cpu"):
    """Load a run artifact (baseline or candidate) by its reference."""
    from profiling_agent.tools.models.artifact_load import load_artifact

    return load_artifact(absolute(state, ref["path"]), device=device)


def artifact_ref(state: State, saved: dict[str, Any]) -> dict[str, Any]:
    """Turn save_artifact's result into an ArtifactRef with a run-relative path."""
    return {**saved, "path": rel(state, saved["path"])}


def example_input(state: State, batch: int = 1):
    """Return a zero batch at the resolved input shape."""
    import torch

    shape = state.input_shape or {}
    return torch.zeros(batch, int(shape["channels"]), int(shape["height"]), int(shape["width"]))
