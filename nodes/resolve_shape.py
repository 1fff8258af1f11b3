"""Input-shape resolver agent: channels/height/width from processor and config, checked by a forward pass."""

from __future__ import annotations

from typing import Any

from langgraph.runtime import Runtime

from profiling_agent.nodes.common import context_of, emit, event, load_artifact_model, run_dir
from profiling_agent.state import Context, State


def resolve_input_shape(state: State, runtime: Runtime[Context]) -> dict[str, Any]:
    """Resolve the input shape, verify it with a real forward pass, and prepare the evaluation tensors."""
    from profiling_agent.tools.data.prepare import prepare_data
    from profiling_agent.tools.data.sources import load_split
    from profiling_agent.tools.models.input_shape import resolve_input_shape as resolve
    from profiling_agent.tools.planning.llm_client import llm_configured
    from profiling_agent.tools.planning.llm_shape import settle_input_shape

    ctx = context_of(runtime)
    loaded = load_artifact_model(state, state.baseline)
    shape = resolve(loaded.model, loaded.processor)
    # the LLM is consulted only for an ambiguous shape, and its answer is used only if a forward pass works
    use_llm = state.objective.planner in ("llm", "auto") and llm_configured(ctx)
    shape = settle_input_shape(loaded.model, loaded.processor, shape, ctx, use_llm=use_llm)
    emit(runtime, kind="progress", task="preparing data", done=0, total=1, label=state.dataset.ref)
    dataset = load_split(state.dataset.ref, state.dataset.split)
    calibration_ds = None
    if len(dataset) < state.dataset.subset + state.dataset.calibration and state.dataset.split != "train":
        try:  # a small evaluation split: calibrate on the train split so probe and evaluation never share images
            calibration_ds = load_split(state.dataset.ref, "train")
        except Exception:
            calibration_ds = None
    data = prepare_data(
        dataset,
        loaded.processor,
        shape,
        state.labels,
        subset=state.dataset.subset,
        calibration=state.dataset.calibration,
        seed=state.dataset.seed,
        out_path=run_dir(state) / "data.safetensors",
        image_column=state.labels["image_column"],
        label_column=state.labels["label_column"],
        calibration_ds=calibration_ds,
    )
    data["path"] = "data.safetensors"
    emit(runtime, kind="progress", task="preparing data", done=1, total=1, label=state.dataset.ref)
    message = (
        f"input {shape['channels']}x{shape['height']}x{shape['width']} from {shape['source']}, verified by a "
        f"forward pass; {data['n_eval']} evaluation and {data['n_calib']} calibration images"
    )
    if shape.get("llm"):
        answer = shape["llm"]["answer"]
        said = "x".join(str(answer[k]) for k in ("channels", "height", "width")) if answer else "none"
        message += f"; ambiguous shape put to the LLM: it said {said}, " + (
            "verified by a forward pass and used" if shape["llm"]["verified"] else "not used"
        )
    return {"input_shape": shape, "data": data, "history": event("resolve_input_shape", message)}
