"""Ask the LLM for an input shape and validate its JSON answer."""

from __future__ import annotations

import json
import logging
from typing import Any

from langchain_core.messages import HumanMessage

from profiling_agent.prompts.input_shape import render_input_shape
from profiling_agent.state import Context
from profiling_agent.tools.planning.json_extract import find_object
from profiling_agent.tools.planning.llm_client import (
    PlannerFailure,
    build_chat_model,
    call_model,
    message_text,
    request_limits,
)

logger = logging.getLogger(__name__)


# ---------------------------------------------------------------- input shape

SHAPE_FORM = '{"channels": 3, "height": 224, "width": 224}'


def _shape_like(value: dict[str, Any]) -> dict[str, Any] | None:
    """Return the object holding "channels" (`value` itself or one it wraps), else None."""
    if "channels" in value:
        return value
    return next((v for v in value.values() if isinstance(v, dict) and "channels" in v), None)


def validate_shape(value: Any) -> dict[str, int]:
    """Check an input-shape answer: integer channels in 1..16, height and width in 1..4096.

    Raises:
        ValueError: With a reason the LLM can act on.
    """
    if isinstance(value, dict) and "channels" not in value:
        value = next((v for v in value.values() if isinstance(v, dict) and "channels" in v), value)
    if not isinstance(value, dict):
        raise ValueError("the answer must be a JSON object")
    out = {}
    for key, high in (("channels", 16), ("height", 4096), ("width", 4096)):
        raw = value.get(key)
        if isinstance(raw, float) and raw.is_integer():
            raw = int(raw)
        if isinstance(raw, bool) or not isinstance(raw, int):
            raise ValueError(f"{key} must be an integer, got {json.dumps(raw, default=str)[:40]}")
        if not 1 <= raw <= high:
            raise ValueError(f"{key} must be in 1..{high}, got {raw}")
        out[key] = raw
    return out


def resolve_shape_with_llm(metadata: dict[str, Any], ctx: Context, *, chat_model: Any = None) -> dict[str, int] | None:
    """Ask the input-shape resolver agent for {"channels", "height", "width"}; None on any failure.

    The answer is validated here (ranges, integers); the caller still verifies it with a forward pass.
    """
    try:
        model = chat_model if chat_model is not None else build_chat_model(ctx)
        messages = render_input_shape(metadata)
        for _ in range(1 + max(0, ctx.llm_retries)):
            reply = call_model(model, messages, request_limits(ctx))
            try:
                return validate_shape(find_object(message_text(reply), _shape_like, "input shape", SHAPE_FORM).value)
            except ValueError as exc:
                messages += [reply, HumanMessage(content=f"Invalid answer: {exc}. Reply with the JSON object only.")]
    except PlannerFailure as failure:
        logger.warning("input-shape LLM failed (%s): %s", failure.stage, failure.reason)
    except Exception as exc:  # noqa: BLE001 - the resolver is optional, never fatal
        logger.warning("input-shape LLM failed: %s", exc)
    return None
