"""Input-shape resolver agent: settle an ambiguous input shape with the LLM, each answer checked by a forward pass."""

from __future__ import annotations

from typing import Any

from torch import nn

from profiling_agent.state import Context
from profiling_agent.tools.models.input_shape import verify_input_shape
from profiling_agent.tools.shape.llm_shape_agent import resolve_shape_with_llm

MAX_SIDE_FACTOR = 2  # an LLM-proposed side may be at most this times the largest static candidate's side
MIN_SIDE_CAP = 512  # ... but always at least up to this many pixels

CONFIG_FIELDS = (
    "model_type",
    "architectures",
    "image_size",
    "patch_size",
    "num_channels",
    "embed_dim",
    "hidden_size",
    "window_size",
    "num_labels",
)
PROCESSOR_FIELDS = (
    "size",
    "crop_size",
    "do_resize",
    "do_center_crop",
    "crop_pct",
    "image_mean",
    "image_std",
    "do_normalize",
    "resample",
)


def _plain(value: Any) -> Any:
    """Turn config/processor values (SizeDict, tuples, enums) into small JSON data."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items() if v is not None}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value][:16]
    items = getattr(value, "__dict__", None)
    if isinstance(items, dict) and items:
        return {str(k): _plain(v) for k, v in items.items() if not str(k).startswith("_") and v is not None}
    return str(value)[:80]


def shape_metadata(model: nn.Module, processor: Any | None, shape: dict[str, Any]) -> dict[str, Any]:
    """Collect what the resolver agent needs: config and processor fields, and the static resolver's doubts."""
    config = getattr(model, "config", None)
    return {
        "model_class": type(model).__name__,
        "config": {k: _plain(getattr(config, k)) for k in CONFIG_FIELDS if getattr(config, k, None) is not None},
        "processor": None
        if processor is None
        else {
            "class": type(processor).__name__,
            **{k: _plain(getattr(processor, k)) for k in PROCESSOR_FIELDS if getattr(processor, k, None) is not None},
        },
        "static_guess": [shape.get("channels"), shape.get("height"), shape.get("width")],
        "candidates": shape.get("candidates") or [],
        "notes": shape.get("notes") or [],
    }


def implausible(answer: list[int], static: list[list[int]]) -> str | None:
    """Say why an LLM-proposed (C, H, W) is not worth a forward pass, or None.

    A hostile answer such as 3x4096x4096 would make a size-agnostic CNN run for minutes, so the sides may be at
    most MAX_SIDE_FACTOR times the largest static candidate's (and at least MIN_SIDE_CAP), and channels must be
    1, 3, 4 or a static candidate's.
    """
    side_cap = max(MIN_SIDE_CAP, MAX_SIDE_FACTOR * max(max(c[1], c[2]) for c in static))
    channels = {1, 3, 4} | {c[0] for c in static}
    if answer[0] not in channels:
        return f"{answer[0]} channels is implausible (expected one of {sorted(channels)}); not tried"
    if max(answer[1], answer[2]) > side_cap:
        return f"{answer[1]}x{answer[2]} exceeds {side_cap} pixels per side; not tried"
    return None


def _verified(model: nn.Module, chw: list[int]) -> str | None:
    """Return None when a 1xCxHxW forward pass gives (1, num_labels) logits, else the one-line reason."""
    try:
        verify_input_shape(model, chw)
    except ValueError as exc:
        return str(exc)
    return None


def settle_input_shape(
    model: nn.Module,
    processor: Any | None,
    shape: dict[str, Any],
    ctx: Context,
    *,
    use_llm: bool,
    chat_model: Any = None,
) -> dict[str, Any]:
    """Pick the input shape to use and prove it with a real forward pass.

    An unambiguous shape is only verified. An ambiguous one (resolve_input_shape's `ambiguous`) is first put to
    the resolver agent when `use_llm`; its answer, then the static candidates in order, are tried with a forward
    pass, and the first that works is used. The LLM's answer is never used unverified.

    Args:
        model: The classifier.
        processor: Its image processor, or None.
        shape: resolve_input_shape's result.
        ctx: Run context (LLM endpoint, timeout, retries).
        use_llm: Consult the LLM when the shape is ambiguous.
        chat_model: A LangChain chat model to use instead of ChatOpenAI (tests).

    Returns:
        `shape` updated with the chosen channels/height/width, "source" ("llm" when the LLM's answer was
        used), "verified": "forward pass", and for an ambiguous shape "tried": [{"shape", "from", "error"}]
        and, when consulted, "llm": {"answer", "verified", "model"}.

    Raises:
        ValueError: No candidate passes the forward pass (one line, with the reasons).
    """
    if not shape.get("ambiguous"):
        problem = _verified(model, [shape["channels"], shape["height"], shape["width"]])
        if problem:
            raise ValueError(problem)
        return {**shape, "verified": "forward pass"}
    static = [
        [int(v) for v in c]
        for c in [[shape["channels"], shape["height"], shape["width"]], *(shape.get("candidates") or [])]
    ]
    options = [(c, str(shape.get("source", "static"))) for c in static]
    out = dict(shape)
    tried: list[dict[str, Any]] = []
    if use_llm:
        answer = resolve_shape_with_llm(shape_metadata(model, processor, shape), ctx, chat_model=chat_model)
        out["llm"] = {"answer": answer, "verified": False, "model": ctx.llm_model}
        if answer:
            chw = [answer["channels"], answer["height"], answer["width"]]
            problem = implausible(chw, static)
            if problem:
                tried.append({"shape": chw, "from": "llm", "error": problem})
            else:
                options.insert(0, (chw, "llm"))
    for chw, origin in options:
        if any(t["shape"] == chw for t in tried):
            continue
        problem = _verified(model, chw)
        tried.append({"shape": chw, "from": origin, "error": problem})
        if problem is None:
            out.update(
                {"channels": chw[0], "height": chw[1], "width": chw[2], "verified": "forward pass", "tried": tried}
            )
            if origin == "llm":
                out["source"] = "llm"
                out["llm"]["verified"] = True
            return out
    raise ValueError("no input shape passed the forward pass: " + "; ".join(str(t["error"]) for t in tried))
