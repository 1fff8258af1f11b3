"""Parameter and memory counts of a model, packed (quantized) weights included: the one definition of each."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from profiling_agent.tools.models.dynamic_quant import (
    dynamic_linear_type,
)

# ---------------------------------------------------------------- counting

QWEIGHT, QSCALE, QZERO = "qweight", "qweight_scale", "qweight_zero_point"  # names of packed-weight tensors


def _unique_tensors(model: nn.Module) -> Iterator[torch.Tensor]:
    """Yield every parameter and buffer once (shared tensors counted once)."""
    seen: set[int] = set()
    for tensor in [*model.parameters(), *model.buffers()]:
        if id(tensor) not in seen:
            seen.add(id(tensor))
            yield tensor


def dynamic_linears(model: nn.Module) -> Iterator[tuple[str, nn.Module]]:
    """Yield (name, module) of every dynamically quantized Linear."""
    dynamic_linear = dynamic_linear_type()
    for name, module in model.named_modules():
        if isinstance(module, dynamic_linear):
            yield name, module


def linear_packed_params_type() -> type | None:
    """Return torch's LinearPackedParams class (the container of a quantized Linear's weights), or None."""
    try:
        from torch.ao.nn.quantized.modules.linear import (
            LinearPackedParams,
        )  # lazy: probe; a torch build without quantized modules returns None
    except ImportError:  # pragma: no cover - depends on the torch build
        return None
    return LinearPackedParams


def packed_linear_tensors(module: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None, torch.dtype] | None:
    """Return (weight, bias, storage dtype) of a quantized Linear's packed params, or None for other modules."""
    packed_type = linear_packed_params_type()
    packed = getattr(module, "_packed_params", None)
    if packed_type is None or not isinstance(packed, packed_type):
        return None
    container: Any = packed  # a LinearPackedParams, whose methods torch does not type
    weight, bias = container._weight_bias()
    return weight, bias, container.dtype


def own_params(module: nn.Module, seen: set[int] | None = None) -> int:
    """Count the module's own parameters (not its children's); packed quantized Linear weights count too.

    `seen` holds ids of tensors already counted, so shared (tied) parameters are counted once.
    """
    seen = set() if seen is None else seen
    total = 0
    for param in module.parameters(recurse=False):
        if id(param) not in seen:
            seen.add(id(param))
            total += param.numel()
    packed = packed_linear_tensors(module)
    if packed is not None:
        weight, bias, _ = packed
        total += weight.numel() + (bias.numel() if bias is not None else 0)
    return total


def count_params(model: nn.Module) -> int:
    """Count the logical parameters of a model, quantized Linear weights included (each counted once)."""
    seen: set[int] = set()
    return sum(own_params(module, seen) for module in model.modules())


def state_bytes(model: nn.Module) -> int:
    """Count bytes of parameters, buffers and quantized Linears' weights, bias and qparams as stored."""
    total = sum(t.numel() * t.element_size() for t in _unique_tensors(model))
    for name, module in dynamic_linears(model):
        total += sum(t.numel() * t.element_size() for t in quantized_tensors(name, module)[0].values())
    return int(total)


# ---------------------------------------------------------------- saving


def quantized_tensors(name: str, module: nn.Module) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Return the stored tensors of one dynamically quantized Linear and its scheme description."""
    linear: Any = module  # a dynamic quantized Linear: weight() and bias() are methods, not the usual tensors
    weight, bias = linear.weight(), linear.bias()
    tensors: dict[str, torch.Tensor] = {}
    if linear._packed_params.dtype == torch.float16:
        scheme: dict[str, Any] = {"dtype": "float16"}
        tensors[f"{name}.{QWEIGHT}"] = weight.to(torch.float16)
    elif weight.qscheme() in (torch.per_tensor_affine, torch.per_tensor_symmetric):
        scheme = {"dtype": "qint8", "qscheme": "per_tensor"}
        tensors[f"{name}.{QWEIGHT}"] = weight.int_repr()
        tensors[f"{name}.{QSCALE}"] = torch.tensor(weight.q_scale(), dtype=torch.float64)
        tensors[f"{name}.{QZERO}"] = torch.tensor(weight.q_zero_point(), dtype=torch.int64)
    else:
        scheme = {"dtype": "qint8", "qscheme": "per_channel", "axis": int(weight.q_per_channel_axis())}
        tensors[f"{name}.{QWEIGHT}"] = weight.int_repr()
        tensors[f"{name}.{QSCALE}"] = weight.q_per_channel_scales().to(torch.float64)
        tensors[f"{name}.{QZERO}"] = weight.q_per_channel_zero_points().to(torch.int64)
    if bias is not None:
        tensors[f"{name}.bias"] = bias.detach()
    return tensors, scheme
