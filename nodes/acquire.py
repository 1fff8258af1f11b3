"""Acquisition agent: load the model and the dataset, map labels, save the untouched baseline."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from langgraph.runtime import Runtime

from profiling_agent.nodes.common import artifact_ref, context_of, event, thread_id_of
from profiling_agent.state import STATE_FORMAT, Context, State
from profiling_agent.tools import run_layout


def acquire(state: State, runtime: Runtime[Context]) -> dict[str, Any]:
    """Load model and processor, check the dataset and its labels, and write the baseline artifact."""
    from profiling_agent.tools.compression.families import adapter_for  # lazy: torch; steps load without it
    from profiling_agent.tools.data.roles import dataset_labels  # lazy: numpy; steps load without it
    from profiling_agent.tools.data.sources import has_splits, load_split  # lazy: numpy; steps load without it
    from profiling_agent.tools.models.artifacts import save_artifact  # lazy: torch; steps load without it
    from profiling_agent.tools.models.loading import load_model  # lazy: torch; steps load without it

    ctx = context_of(runtime)
    run_path = (Path(ctx.run_root) / thread_id_of(runtime)).resolve()
    run_path.mkdir(parents=True, exist_ok=True)
    here = state.model_copy(update={"run_path": str(run_path)})

    loaded = load_model(state.model.ref, revision=state.model.revision, trust_remote_code=state.model.trust_remote_code)
    adapter = adapter_for(loaded.model)
    dataset = load_split(state.dataset.ref, state.dataset.split)
    labels, weak = dataset_labels(dataset, loaded.model.config, state.dataset)  # one class: refused here
    saved = save_artifact(
        loaded.model,
        run_path / run_layout.BASELINE,
        processor=loaded.processor,
        extra={"source": state.model.ref, "role": "baseline"},
    )
    where = f"{state.dataset.ref}:{state.dataset.split}" if has_splits(state.dataset.ref) else state.dataset.ref
    message = (
        f"loaded {type(loaded.model).__name__} ({adapter.name} adapter) from {state.model.ref}; "
        f"{len(dataset)} images in {where}; labels mapped by {labels['method']}"
        + (" (predictions restricted to the dataset's classes)" if labels.get("restricted") else "")
        + (f". {weak}" if weak else "")
        + (
            ""
            if adapter.safe
            else f". WARNING: no family adapter for {type(loaded.model).__name__}: the generic fallback prunes only "
            "simple MLP/conv groups and checks every prune numerically against masking"
        )
    )
    return {
        # the whole goal, defaults filled in: the checkpoint records it even for {} or partial inputs
        "model": state.model.model_dump(),
        "dataset": state.dataset.model_dump(),
        "objective": state.objective.model_dump(),
        "run_path": str(run_path),
        "status": "running",
        "state_format": STATE_FORMAT,  # the checkpoint's shape version (schemas/migrations.py)
        "family": adapter.name,
        "baseline": artifact_ref(here, saved),
        "labels": labels,
        "history": event("acquire", message, safe_adapter=adapter.safe),
    }
