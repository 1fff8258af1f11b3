"""Post-training dynamic quantization (qint8 or float16) of the nn.Linear layers a plan selects."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping
from typing import Any

from torch import nn

from profiling_agent.tools.models.dynamic_quant import QUANT_DTYPES, apply_dynamic_quantization, quantized_layers

logger = logging.getLogger(__name__)


def _entry_fields(entry: Any) -> tuple[str, str]:
    """Return (layer, dtype) of a QuantEntry-like object or a dict with those keys."""
    if isinstance(entry, Mapping):
        layer, dtype = entry.get("layer", "all"), entry.get("dtype", "qint8")
    else:
        layer, dtype = getattr(entry, "layer", "all"), getattr(entry, "dtype", "qint8")
    if dtype not in QUANT_DTYPES:
        raise ValueError(f"quantization dtype {dtype!r} is not one of {', '.join(QUANT_DTYPES)}")
    if not isinstance(layer, str) or not layer:
        raise ValueError(f"quantization layer must be 'all' or a non-empty regex, got {layer!r}")
    return layer, dtype


def _compile(layer: str) -> re.Pattern[str] | None:
    """Compile an entry's layer regex; 'all' gives None (matches everything)."""
    if layer == "all":
        return None
    try:
        return re.compile(layer)
    except re.error as err:
        raise ValueError(f"invalid layer regex {layer!r}: {err}") from None


def _is_protected(name: str, protected: Iterable[str]) -> bool:
    """Return True when `name` is a protected module or lies inside one."""
    return any(name == p or name.startswith(p + ".") for p in protected if p)


def match_linear_layers(model: nn.Module, entries: Iterable[Any], protected: Iterable[str] = ()) -> dict[str, str]:
    """Map every nn.Linear matched by a quantization entry to its dtype.

    An entry's layer "all" matches every Linear, otherwise `re.search(layer, name)` decides. Later entries
    override earlier ones. Linears named in `protected` (or inside a protected module) are never matched.

    Args:
        model: The model whose modules are searched.
        entries: `QuantEntry` objects or dicts with "layer" and "dtype" ("qint8" | "float16").
        protected: Module names that must stay in floating point.

    Returns:
        Module name -> dtype, in module order.

    Raises:
        ValueError: An entry has an invalid regex or dtype.
    """
    rules = [(_compile(layer), dtype) for layer, dtype in map(_entry_fields, entries)]
    protected = tuple(protected)
    matched: dict[str, str] = {}
    for name, module in model.named_modules():
        if not isinstance(module, nn.Linear) or _is_protected(name, protected):
            continue
        for pattern, dtype in rules:
            if pattern is None or pattern.search(name):
                matched[name] = dtype
    return matched


def quantize_model(
    model: nn.Module, entries: Iterable[Any], protected: Iterable[str] = ()
) -> tuple[nn.Module, dict[str, str]]:
    """Dynamically quantize the nn.Linear layers selected by `entries` (post-training, CPU).

    The input model is left untouched: a quantized deep copy is returned. Subclasses of nn.Linear that
    torch does not know how to quantize stay in floating point and are not reported.

    Args:
        model: The float model.
        entries: `QuantEntry` objects or dicts with "layer" and "dtype"; later entries override earlier ones.
        protected: Module names that must stay in floating point.

    Returns:
        (quantized model in eval mode on CPU, module name -> dtype actually quantized). Empty entries, or
        entries matching nothing, return `model` itself and {}.

    Raises:
        ValueError: An entry has an invalid regex or dtype.
    """
    plan = match_linear_layers(model, entries, protected)
    if not plan:
        return model, {}
    quantized = apply_dynamic_quantization(model, plan, inplace=False)
    quantized.eval()
    done = quantized_layers(quantized)
    skipped = sorted(set(plan) - set(done))
    if skipped:
        logger.warning("left %d matched Linear subclasses in float: %s", len(skipped), ", ".join(skipped))
    logger.info("dynamically quantized %d Linear layers", len(done))
    return quantized, done
