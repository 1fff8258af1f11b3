"""Data agent: draw seeded validation, held-out test and calibration subsets and preprocess them."""

from __future__ import annotations

from typing import Any

from langgraph.runtime import Runtime

from profiling_agent.nodes.common import emit, event, load_artifact_model, run_dir
from profiling_agent.state import Context, State


def _other_split(ref: str, split: str) -> Any | None:
    from profiling_agent.tools.data.sources import load_split

    try:
        return load_split(ref, split)
    except Exception:  # noqa: BLE001 - a dataset without that split simply has none
        return None


def prepare_data(state: State, runtime: Runtime[Context]) -> dict[str, Any]:
    """Prepare validation, test and calibration tensors at the resolved input shape; record every role's rows."""
    from profiling_agent.tools.data.prepare import load_prepared
    from profiling_agent.tools.data.prepare import prepare_data as prepare
    from profiling_agent.tools.data.sources import load_split
    from profiling_agent.tools.io import write_json_atomic

    assert state.labels is not None and state.input_shape is not None  # set by acquire and resolve_input_shape
    ds_ref = state.dataset
    loaded = load_artifact_model(state, state.baseline)
    emit(runtime, kind="progress", task="preparing data", done=0, total=1, label=ds_ref.ref)
    dataset = load_split(ds_ref.ref, ds_ref.split)
    test_split = ds_ref.test_split or ("test" if ds_ref.split == "validation" else None)
    test_ds = None
    if test_split and test_split != ds_ref.split:
        test_ds = load_split(ds_ref.ref, test_split) if ds_ref.test_split else _other_split(ds_ref.ref, test_split)
    here = ds_ref.subset + ds_ref.calibration + (ds_ref.test_subset if test_ds is None else 0)
    # a small evaluated split: calibrate on the train split, so probe, selection and report never share images
    calibration_ds = _other_split(ds_ref.ref, "train") if len(dataset) < here and ds_ref.split != "train" else None
    root = run_dir(state)
    data = prepare(
        dataset,
        loaded.processor,
        state.input_shape.model_dump(),
        state.labels.model_dump(),
        subset=ds_ref.subset,
        test_subset=ds_ref.test_subset,
        calibration=ds_ref.calibration,
        seed=ds_ref.seed,
        out_path=root / "data.safetensors",
        image_column=state.labels.image_column,
        label_column=state.labels.label_column,
        calibration_ds=calibration_ds,
        test_ds=test_ds,
    )
    data["path"] = "data.safetensors"
    rows = load_prepared(root / data["path"], with_indices=True, parts=("eval", "test", "calib"))
    splits = {
        "validation": ds_ref.split,
        "test": test_split if data["test_other_split"] else ds_ref.split,
        "calibration": "train" if data["calib_other_split"] else ds_ref.split,
    }
    write_json_atomic(
        root / "subsets.json",
        {
            "dataset": ds_ref.ref,
            "seed": ds_ref.seed,
            **{
                role: {"split": splits[role], "indices": rows[f"{part}_index"].tolist()}
                for role, part in (("validation", "eval"), ("test", "test"), ("calibration", "calib"))
            },
        },
    )
    emit(runtime, kind="progress", task="preparing data", done=1, total=1, label=ds_ref.ref)
    message = (
        f"{data['n_eval']} validation ({splits['validation']}), {data['n_test']} held-out test ({splits['test']}) "
        f"and {data['n_calib']} calibration images ({splits['calibration']}), disjoint"
        + (f"; {data['note']}" if data["note"] else "")
    )
    return {"data": data, "history": event("prepare_data", message)}
