"""Resolve an image classifier's input shape from its processor and config, checked by a forward pass."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from profiling_agent.tools.text import one_line

DEFAULT_SIZE = 224  # guessed side length when neither processor nor config says anything


# ---------------------------------------------------------------- input shape


def _get(obj: Any, key: str) -> Any:
    """Read `key` from a dict-like or attribute-style size object (transformers' SizeDict)."""
    if obj is None:
        return None
    if isinstance(obj, Mapping):
        return obj.get(key)
    return getattr(obj, key, None)


def _int_or_none(value: Any) -> int | None:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 else None


def _processor_hw(processor: Any) -> tuple[tuple[int, int] | None, list[str]]:
    """Return the (height, width) the processor produces, and notes on how it was read."""
    notes: list[str] = []
    crop = getattr(processor, "crop_size", None)
    if getattr(processor, "do_center_crop", False) and crop is not None:
        height, width = _int_or_none(_get(crop, "height")), _int_or_none(_get(crop, "width"))
        if height and width:
            return (height, width), ["processor center-crops to crop_size"]
    if getattr(processor, "do_resize", True) is False:
        return None, ["processor does not resize (do_resize=False)"]
    size = getattr(processor, "size", None)
    if isinstance(size, (int, float)):
        return (int(size), int(size)), ["processor size is a single int"]
    height, width = _int_or_none(_get(size, "height")), _int_or_none(_get(size, "width"))
    if height and width:
        return (height, width), notes
    short = _int_or_none(_get(size, "shortest_edge"))
    if short:
        if getattr(processor, "crop_pct", None) is not None:
            return (short, short), ["processor resizes and crops to shortest_edge (crop_pct)"]
        return (short, short), ["processor sets only shortest_edge: non-square images keep their aspect ratio"]
    for key in ("longest_edge",):
        edge = _int_or_none(_get(size, key))
        if edge:
            return (edge, edge), [f"processor sets only {key}: assuming square inputs"]
    max_h, max_w = _int_or_none(_get(size, "max_height")), _int_or_none(_get(size, "max_width"))
    if max_h and max_w:
        return (max_h, max_w), ["processor sets max_height/max_width: assuming the maximum"]
    return None, ["processor size could not be read"]


def _config_hw(config: Any) -> tuple[int, int] | None:
    """Return (height, width) from config.image_size (int or pair), or None."""
    size = getattr(config, "image_size", None)
    if isinstance(size, (list, tuple)) and len(size) == 2 and all(_int_or_none(s) for s in size):
        return int(size[0]), int(size[1])
    side = _int_or_none(size)
    return (side, side) if side else None


def _processor_channels(processor: Any) -> int | None:
    mean = getattr(processor, "image_mean", None)
    if isinstance(mean, (list, tuple)) and len(mean) in (1, 3, 4):
        return len(mean)
    return None


def _resolve_channels(config: Any, processor: Any, notes: list[str]) -> tuple[int, bool]:
    """Return (channels, ambiguous) from config.num_channels and the processor's image_mean."""
    from_config = _int_or_none(getattr(config, "num_channels", None))
    from_proc = _processor_channels(processor) if processor is not None else None
    if from_config and from_proc and from_config != from_proc:
        notes.append(f"config num_channels={from_config} but processor image_mean has {from_proc} values")
        return from_config, True
    found = from_config or from_proc
    if found:
        return found, False
    notes.append("no channel count in config or processor: assuming 3")
    return 3, True


def resolve_input_shape(model: nn.Module, processor: Any | None) -> dict[str, Any]:
    """Resolve the (channels, height, width) a classifier expects from its processor and config.

    The config's image_size wins when both give one (it constrains the architecture, e.g. ViT position
    embeddings); any disagreement or missing information sets ambiguous=True and lists the alternatives
    in "candidates", so a caller can ask for help and check the answer with verify_input_shape.

    Args:
        model: A transformers image classifier (reads model.config).
        processor: Its image processor, or None.

    Returns:
        {"channels", "height", "width", "source": "processor+config" | "config" | "processor" | "default",
        "ambiguous": bool, "notes": [str], "candidates": [[c, h, w], ...]}.
    """
    config = getattr(model, "config", None)
    notes: list[str] = []
    channels, ambiguous = _resolve_channels(config, processor, notes)
    from_proc, proc_notes = _processor_hw(processor) if processor is not None else (None, ["no processor"])
    notes.extend(proc_notes)
    from_config = _config_hw(config)
    candidates: list[tuple[int, int]] = []
    if from_proc and from_config:
        source = "processor+config"
        if from_proc != from_config:
            ambiguous = True
            notes.append(
                f"processor gives {from_proc[0]}x{from_proc[1]}, config image_size {from_config[0]}x"
                f"{from_config[1]}: using the config's"
            )
        hw = from_config
        candidates = [from_config, from_proc]
    elif (found := from_config or from_proc) is not None:
        source = "config" if from_config else "processor"
        hw = found
        candidates = [hw]
    else:
        source, hw, ambiguous = "default", (DEFAULT_SIZE, DEFAULT_SIZE), True
        notes.append(f"no size in processor or config: assuming {DEFAULT_SIZE}x{DEFAULT_SIZE}")
        candidates = [hw]
    unique = list(dict.fromkeys(candidates))
    return {
        "channels": channels,
        "height": hw[0],
        "width": hw[1],
        "source": source,
        "ambiguous": ambiguous,
        "notes": notes,
        "candidates": [[channels, h, w] for h, w in unique],
    }


def _shape_tuple(shape: Mapping[str, Any] | Sequence[int]) -> tuple[int, int, int]:
    if isinstance(shape, Mapping):
        values: tuple[Any, ...] = (shape.get("channels"), shape.get("height"), shape.get("width"))
    else:
        values = tuple(shape)
    if len(values) != 3 or not all(_int_or_none(v) for v in values):
        raise ValueError(f"input shape must be three positive ints (channels, height, width), got {shape!r}")
    return int(values[0]), int(values[1]), int(values[2])


def _input_dtype(model: nn.Module) -> torch.dtype:
    for param in model.parameters():
        if param.is_floating_point():
            return param.dtype
    return torch.float32


def _input_device(model: nn.Module) -> torch.device:
    for param in model.parameters():
        return param.device
    return torch.device("cpu")


def verify_input_shape(model: nn.Module, shape: Mapping[str, Any] | Sequence[int]) -> None:
    """Check with a real forward pass that `model` accepts a (1, C, H, W) zero batch and returns (1, num_labels).

    Args:
        model: The classifier (put in eval mode).
        shape: {"channels", "height", "width"} or (channels, height, width).

    Raises:
        ValueError: One-line reason: bad shape, the forward pass failed, or the logits have the wrong shape.
    """
    channels, height, width = _shape_tuple(shape)
    x = torch.zeros(1, channels, height, width, dtype=_input_dtype(model), device=_input_device(model))
    model.eval()
    try:
        with torch.inference_mode():
            out = model(pixel_values=x)
    except Exception as err:  # noqa: BLE001 - any failure is the answer
        raise ValueError(f"forward pass with input 1x{channels}x{height}x{width} failed: {one_line(err)}") from None
    logits = getattr(out, "logits", out)
    num_labels = getattr(getattr(model, "config", None), "num_labels", None)
    if not isinstance(logits, torch.Tensor) or logits.dim() != 2 or logits.shape[0] != 1:
        got = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
        raise ValueError(f"input 1x{channels}x{height}x{width} gives logits {got}, expected (1, num_labels)")
    if num_labels is not None and logits.shape[1] != num_labels:
        raise ValueError(
            f"input 1x{channels}x{height}x{width} gives logits {tuple(logits.shape)}, expected (1, {num_labels})"
        )
