"""Helpers shared by the nodes: run folders, progress events, history entries, model loading."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from langgraph.runtime import Runtime

from profiling_agent.state import ArtifactRef, Candidate, Context, HistoryEvent, State
from profiling_agent.tools import interrupt
from profiling_agent.tools.io import check_thread_id


def read_context(runtime: Runtime[Context] | None) -> Context:
    """Return the run context: the one the graph was invoked with (a dict is validated), or the defaults."""
    ctx = getattr(runtime, "context", None)
    if ctx is None:
        return Context()
    return Context.of(ctx) if isinstance(ctx, dict) else ctx


def apply_threads(ctx: Context) -> Context:
    """Set torch's thread count on the calling thread to the context's `threads` (None keeps it); return `ctx`.

    LangGraph runs nodes on pool threads, and a thread that has already run parallel torch work keeps its own
    OpenMP thread count whatever another thread sets: each node applies `threads` on the thread it runs on, so a
    resumed process (whose first node may run on a fresh thread) computes with the same count as the first one.
    """
    from profiling_agent.tools.device import set_threads  # lazy: torch; steps load without it

    set_threads(ctx.threads)
    return ctx


def context_of(runtime: Runtime[Context] | None) -> Context:
    """Read the run context and apply its thread count on this thread: the two steps a node starts with.

    `read_context`, then `apply_threads`: a node that computes with torch reads its context through this, so it
    runs on the thread count the context asks for.
    """
    return apply_threads(read_context(runtime))


def thread_id_of(runtime: Runtime[Context] | None) -> str:
    """Return the LangGraph thread id, or a time-based id when the graph runs without a checkpointer."""
    info = getattr(runtime, "execution_info", None)
    thread = getattr(info, "thread_id", None)
    return check_thread_id(str(thread)) if thread else time.strftime("run-%Y%m%d-%H%M%S")


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


def event(node: str, message: str, iteration: int = 0, **facts: Any) -> list[dict[str, Any]]:
    """Build a one-element history update; `facts` are HistoryEvent's optional fields (checked here)."""
    record = HistoryEvent(node=node, iteration=iteration, time=round(time.time(), 3), message=message, **facts)
    return [record.to_update()]


def emit(runtime: Runtime[Context] | None, **payload: Any) -> None:
    """Send a custom stream event (progress) when the caller streams `custom`; ignore otherwise.

    Progress is reported between the steps of long loops, so it is also where a requested stop (Ctrl-C) is raised.
    """
    interrupt.check()
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


def load_artifact_model(state: State, ref: ArtifactRef | None, device: str = "cpu"):
    """Load a run artifact (baseline or candidate) by its reference."""
    from profiling_agent.tools.models.artifact_load import load_artifact  # lazy: torch; steps load without it

    if ref is None:
        raise RuntimeError("no artifact to load: the step that saves it has not run")
    return load_artifact(absolute(state, ref.path), device=device)


def delivered_ref(cand: Candidate | None) -> ArtifactRef | None:
    """Return the folder of a candidate's delivered form: its variant folder, else its torch artifact."""
    if cand is None:
        return None
    return cand.delivered or cand.artifact


def load_delivered(state: State, cand: Candidate, threads: int | None = None):
    """Load a candidate in its delivered form: an ONNX Runtime session, an OpenVINO model or the torch model."""
    from profiling_agent.tools.models.artifact_load import load_run_form  # lazy: torch; steps load without it

    ref = delivered_ref(cand)
    if ref is None:
        raise RuntimeError("no artifact to load: the step that saves it has not run")
    return load_run_form(absolute(state, ref.path), threads)


def runs_on_cpu_only(cand: Candidate | None) -> bool:
    """Return True when a candidate's delivered form runs on the CPU only (torch dynamic quantization, ORT)."""
    from profiling_agent.tools.device import cpu_only  # lazy: torch; steps load without it

    if cand is None:
        return False
    name = cand.eval.delivered if cand.eval else "torch"
    return cpu_only([name], quantized=bool(cand.quantized) and name != "torch_fp32")


def artifact_ref(state: State, saved: dict[str, Any]) -> dict[str, Any]:
    """Turn save_artifact's result into an ArtifactRef with a run-relative path."""
    return {**saved, "path": rel(state, saved["path"])}


def input_chw(state: State) -> tuple[int, int, int]:
    """Return the resolved (channels, height, width)."""
    shape = state.input_shape
    if shape is None:
        raise RuntimeError("input_shape is not set: the resolve_input_shape node has not run")
    return shape.channels, shape.height, shape.width


def example_input(state: State, batch: int = 1):
    """Return a zero batch at the resolved input shape."""
    import torch  # lazy: torch; steps load without it

    return torch.zeros(batch, *input_chw(state))


def prepared(state: State, parts: tuple[str, ...] = ("eval", "calib")) -> dict[str, Any]:
    """Open the run's images and labels: validation and test streamed batch by batch, calibration as a tensor."""
    from profiling_agent.tools.data.stream import open_run_data  # lazy: torch; steps load without it
    from profiling_agent.tools.models.artifact_load import load_processor  # lazy: torch; steps load without it

    if state.data is None:
        raise RuntimeError("no prepared data: the prepare_data node has not run")
    processor = load_processor(absolute(state, state.baseline.path)) if state.baseline else None
    return open_run_data(
        run_dir(state),
        parts=parts,
        processor=processor,
        data_file=state.data.path,
        image_column=state.data.image_column,
    )


def allowed_ids(state: State) -> list[int] | None:
    """Return the model ids predictions are restricted to (the dataset's classes), or None for all."""
    return state.labels.allowed_ids if state.labels else None


def current_candidate(state: State) -> Candidate:
    """Return a copy of this iteration's in-progress candidate (a new one when none exists yet)."""
    return state.current.model_copy(deep=True) if state.current else Candidate(iteration=state.iteration)


def training_source(state: State):
    """Find the images recovery may train on (never a validation, test or calibration image), or None."""
    from profiling_agent.tools.data.train_stream import run_train_source  # lazy: torch; steps load without it

    assert state.labels is not None
    return run_train_source(run_dir(state), state.data, state.dataset, state.labels)
