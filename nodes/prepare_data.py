"""Data agent: draw the seeded evaluation and calibration subsets and preprocess them with the model's processor."""

from __future__ import annotations

from typing import Any

from langgraph.runtime import Runtime

from profiling_agent.nodes.common import emit, event, load_artifact_model, run_dir
from profiling_agent.state import Context, State


def prepare_data(state: State, runtime: Runtime[Context]) -> dict[str, Any]:
    """Prepare the evaluation and calibration tensors at the resolved input shape."""
    from profiling_agent.tools.data.prepare import prepare_data as prepare
    from profiling_agent.tools.data.sources import load_split

    assert state.labels is not None and state.input_shape is not None  # set by acquire and resolve_input_shape
    loaded = load_artifact_model(state, state.baseline)
    emit(runtime, kind="progress", task="preparing data", done=0, total=1, label=state.dataset.ref)
    dataset = load_split(state.dataset.ref, state.dataset.split)
    calibration_ds = None
    if len(dataset) < state.dataset.subset + state.dataset.calibration and state.dataset.split != "train":
        try:  # a small evaluation split: calibrate on the train split so probe and evaluation never share images
            calibration_ds = load_split(state.dataset.ref, "train")
        except Exception:
            calibration_ds = None
    data = prepare(
        dataset,
        loaded.processor,
        state.input_shape.model_dump(),
        state.labels.model_dump(),
        subset=state.dataset.subset,
        calibration=state.dataset.calibration,
        seed=state.dataset.seed,
        out_path=run_dir(state) / "data.safetensors",
        image_column=state.labels.image_column,
        label_column=state.labels.label_column,
        calibration_ds=calibration_ds,
    )
    data["path"] = "data.safetensors"
    emit(runtime, kind="progress", task="preparing data", done=1, total=1, label=state.dataset.ref)
    message = f"{data['n_eval']} evaluation and {data['n_calib']} calibration images ({data['note']})"
    return {"data": data, "history": event("prepare_data", message)}
