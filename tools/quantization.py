"""Post-training dynamic quantization (qint8 or float16) of the nn.Linear layers a plan selects."""

from __future__ import annotations

import copy
import logging
import re
import warnings
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

logger = logging.getLogger(__name__)

QUANT_DTYPES = ("qint8", "float16")


@contextmanager
def quiet_ao_quantization() -> Iterator[None]:
    """Silence torch.ao.quantization's deprecation warning and its quantized-tensor creation warning."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=DeprecationWarning, message=r".*torch\.ao\.quantization.*")
        warnings.filterwarnings("ignore", category=UserWarning, message=r".*quantized tensor creation.*")
        yield


def dynamic_linear_type() -> type[nn.Module]:
    """Return torch's dynamically quantized Linear class."""
    from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear

    return DynamicLinear


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


def qconfig_for(dtype: str) -> Any:
    """Return the dynamic qconfig of a dtype name ("qint8" | "float16")."""
    from torch.ao.quantization import default_dynamic_qconfig, float16_dynamic_qconfig

    if dtype == "qint8":
        return default_dynamic_qconfig
    if dtype == "float16":
        return float16_dynamic_qconfig
    raise ValueError(f"quantization dtype {dtype!r} is not one of {', '.join(QUANT_DTYPES)}")


def apply_dynamic_quantization(model: nn.Module, plan: Mapping[str, str], *, inplace: bool) -> nn.Module:
    """Swap the named nn.Linear modules for dynamically quantized ones (model moved to CPU).

    Args:
        model: The float model.
        plan: Module name -> dtype ("qint8" | "float16").
        inplace: Modify `model` itself instead of a deep copy.

    Returns:
        The quantized model.
    """
    from torch.ao.quantization import quantize_dynamic

    target = model if inplace else copy.deepcopy(model)
    spec = {name: qconfig_for(dtype) for name, dtype in plan.items()}
    with quiet_ao_quantization():
        return quantize_dynamic(target.cpu(), qconfig_spec=spec, inplace=True)


def quantized_layers(model: nn.Module) -> dict[str, str]:
    """Map every dynamically quantized Linear in `model` to its weight dtype ("qint8" | "float16")."""
    dynamic_linear = dynamic_linear_type()
    found = {}
    for name, module in model.named_modules():
        if isinstance(module, dynamic_linear):
            found[name] = "float16" if module._packed_params.dtype == torch.float16 else "qint8"
    return found


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
