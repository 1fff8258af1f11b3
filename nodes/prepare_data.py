"""Data agent: draw seeded validation, held-out test and calibration subsets and preprocess them."""

from __future__ import annotations

from typing import Any

from langgraph.runtime import Runtime

from profiling_agent.nodes.common import emit, event, load_artifact_model, run_dir
from profiling_agent.state import Context, State
from profiling_agent.tools import run_layout
from profiling_agent.tools.io import write_json_atomic


def prepare_data(state: State, runtime: Runtime[Context]) -> dict[str, Any]:
    """Draw every role's rows (disjoint by construction), decode each image once, refuse data that cannot judge."""
    from profiling_agent.tools.data.prepare import (
        PARTS,
        SubsetSpec,
        load_prepared,
        prepare_images,
    )  # lazy: torch; steps load without it
    from profiling_agent.tools.data.roles import judge_subsets, role_sources  # lazy: numpy; steps load without it

    assert state.labels is not None and state.input_shape is not None  # set by acquire and resolve_input_shape
    ds_ref = state.dataset
    loaded = load_artifact_model(state, state.baseline)
    emit(runtime, kind="progress", task="preparing data", done=0, total=1, label=ds_ref.ref)
    sources = role_sources(ds_ref)
    root = run_dir(state)
    data = prepare_images(
        sources.evaluated,
        loaded.processor,
        state.input_shape.model_dump(),
        state.labels.model_dump(),
        out_path=root / "data.safetensors",
        spec=SubsetSpec(
            subset=ds_ref.subset,
            calibration=ds_ref.calibration,
            seed=ds_ref.seed,
            test_subset=ds_ref.test_subset,
            image_column=state.labels.image_column,
            label_column=state.labels.label_column,
        ),
        calibration_ds=sources.calibration,
        test_ds=sources.test,
    )
    data["path"] = "data.safetensors"
    warnings = data.pop("warnings")
    tensors = load_prepared(root / data["path"], with_indices=True, parts=PARTS)
    subsets, weak = judge_subsets(tensors, ds_ref, sources)
    write_json_atomic(root / run_layout.SUBSETS, subsets)
    emit(runtime, kind="progress", task="preparing data", done=1, total=1, label=ds_ref.ref)
    where = {role: f" ({split})" if split else "" for role, split in sources.splits.items()}
    message = (
        f"{data['n_eval']} validation{where['validation']}, {data['n_test']} held-out test{where['test']} "
        f"and {data['n_calib']} calibration images{where['calibration']}, disjoint rows"
        + "".join(f"; {x}" for x in (sources.note, data["note"]) if x)
        + "".join(f". WARNING: {w}" for w in warnings)
        + (f". {weak}" if weak else "")
    )
    return {"data": {**data, "splits": sources.splits}, "history": event("prepare_data", message)}
