"""Input-shape resolver agent: channels/height/width from processor and config, checked by a forward pass."""

from __future__ import annotations

from typing import Any

from langgraph.runtime import Runtime

from profiling_agent.nodes.common import context_of, event, load_artifact_model
from profiling_agent.state import Context, State
from profiling_agent.tools.planning.llm_config import llm_configured


def resolve_shape(state: State, runtime: Runtime[Context]) -> dict[str, Any]:
    """Resolve the input shape from processor and config (the LLM only when ambiguous), verified by a forward pass."""
    from profiling_agent.tools.models.input_shape import resolve_input_shape  # lazy: torch; steps load without it
    from profiling_agent.tools.shape.llm_shape import settle_input_shape  # lazy: torch; steps load without it

    ctx = context_of(runtime)
    loaded = load_artifact_model(state, state.baseline)
    shape = resolve_input_shape(loaded.model, loaded.processor)
    # the LLM is consulted only for an ambiguous shape, and its answer is used only if a forward pass works
    use_llm = state.objective.planner in ("llm", "auto") and llm_configured(ctx)
    shape = settle_input_shape(loaded.model, loaded.processor, shape, ctx, use_llm=use_llm)
    message = (
        f"input {shape['channels']}x{shape['height']}x{shape['width']} from {shape['source']}, verified by a "
        "forward pass"
    )
    if shape.get("llm"):
        answer = shape["llm"]["answer"]
        said = "x".join(str(answer[k]) for k in ("channels", "height", "width")) if answer else "none"
        message += f"; ambiguous shape put to the LLM: it said {said}, " + (
            "verified by a forward pass and used" if shape["llm"]["verified"] else "not used"
        )
    return {"input_shape": shape, "history": event("resolve_input_shape", message)}
