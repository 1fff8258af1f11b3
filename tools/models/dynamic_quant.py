"""PyTorch dynamic quantization primitives: the quantized Linear type, qconfigs, applying and listing them."""

from __future__ import annotations

import copy
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn
from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear
from torch.ao.quantization import default_dynamic_qconfig, float16_dynamic_qconfig, quantize_dynamic

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
    return DynamicLinear


def qconfig_for(dtype: str) -> Any:
    """Return the dynamic qconfig of a dtype name ("qint8" | "float16")."""
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
