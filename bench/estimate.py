"""Estimate what a pruning plan removes (params, MACs) from module shapes, without pruning."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from profiling_agent.state import PruneEntry
from profiling_agent.tools.compression.depgraph import plan_steps
from profiling_agent.tools.compression.families import adapter_for
from profiling_agent.tools.compression.families.base import FamilyAdapter
from profiling_agent.tools.compression.self_check import batch_size_of
from profiling_agent.tools.models.sizes import count_params
from profiling_agent.tools.runtimes.forward import run_model

# ---------------------------------------------------------------- analytic estimate

_WEIGHTED = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)


@dataclass
class _Shape:
    """Live (simulated) size of one member while the estimate walks the plan."""

    out: int  # output channels (rows)
    inp: int  # input channels (columns; 0 for norms)
    kernel: int  # weights per (row, column) pair: k*k for convs, 1 for Linear
    per_out: int  # parameters per output channel besides the weight row: bias, norm scale/shift


def _shape_of(module: nn.Module) -> _Shape:
    weight = getattr(module, "weight", None)
    if isinstance(module, _WEIGHTED) and isinstance(weight, torch.Tensor) and getattr(module, "groups", 1) == 1:
        bias = 1 if getattr(module, "bias", None) is not None else 0
        return _Shape(weight.shape[0], weight.shape[1], weight[0, 0].numel(), bias)
    params = list(module.parameters(recurse=False))
    if params and all(p.ndim == 1 and p.shape[0] == params[0].shape[0] for p in params):  # a norm layer
        return _Shape(params[0].shape[0], 0, 0, len(params))
    return _Shape(0, 0, 0, 0)  # parameters that do not shrink with channels (handled via per_head_params)


def _positions(model: nn.Module, example_inputs: Any) -> dict[str, float]:
    """Return, per Linear/Conv module, its output positions per image (tokens, or H*W), from one forward."""
    names = {m: n for n, m in model.named_modules() if isinstance(m, _WEIGHTED)}
    batch = batch_size_of(example_inputs)
    positions: dict[str, float] = {}

    def hook(module: nn.Module, _inputs: Any, output: torch.Tensor) -> None:
        width = module.out_features if isinstance(module, nn.Linear) else module.out_channels
        positions[names[module]] = output.numel() / (batch * width)

    handles = [m.register_forward_hook(hook) for m in names]
    model.eval()
    try:
        with torch.inference_mode():
            run_model(model, example_inputs)
    finally:
        for handle in handles:
            handle.remove()
    return positions


def _shrink(shape: _Shape, is_root: bool, n: int, positions: float) -> tuple[int, float]:
    """Remove `n` channels from a member (output rows for roots and norms, input columns for consumers).

    Returns:
        (parameters removed, MACs per image removed; norms count no MACs).
    """
    if is_root or shape.inp == 0:
        params = n * (shape.inp * shape.kernel + shape.per_out)
        macs = n * shape.inp * shape.kernel * positions
        shape.out -= n
    else:
        params = n * shape.out * shape.kernel
        macs = n * shape.out * shape.kernel * positions
        shape.inp -= n
    return params, macs


def estimate_pruning(
    model: nn.Module,
    entries: Iterable[PruneEntry | Mapping[str, Any]],
    example_inputs: Any = None,
    *,
    adapter: FamilyAdapter | None = None,
) -> dict[str, Any]:
    """Predict, without pruning, the parameters (and MACs) the entries would remove.

    Groups are walked in the order `prune_model` applies them, on simulated layer sizes, so groups that share a
    layer (a bottleneck's middle conv loses input columns to conv1 and output rows to conv2) are not counted
    twice. Params are exact: root rows and biases, norm scales/shifts, consumer columns, declared per-head
    tensors. MACs (only with `example_inputs`) count Linear/Conv multiply-accumulates per image; norm and
    attention-matmul costs are left out, so head pruning saves somewhat more than estimated.

    Returns:
        {family, params_before, params_removed, params_after, params_fraction_removed, macs_removed (or None),
        groups: [{group, module, kind, ratio, units, units_removed, units_after, params_removed, macs_removed}]}.
    """
    adapter = adapter or adapter_for(model)
    steps = plan_steps(adapter, model, entries)
    positions = _positions(model, example_inputs) if example_inputs is not None else {}
    shapes: dict[str, _Shape] = {}
    rows = []
    for step in steps:
        group, n = step.group, step.n_remove * step.group.unit_size
        params = macs = 0.0
        for name in group.members:
            shape = shapes.setdefault(name, _shape_of(model.get_submodule(name)))
            p, m = _shrink(shape, name in group.roots, n, positions.get(name, 0.0))
            params, macs = params + p, macs + m
        for pname in group.extra.get("per_head_params", []):  # e.g. Swin's bias table: one column per head
            params += step.n_remove * (model.get_parameter(pname).numel() // group.units)
        rows.append(
            {
                "group": group.name,
                "module": group.module,
                "kind": group.kind,
                "ratio": step.ratio,
                "units": group.units,
                "units_removed": step.n_remove,
                "units_after": group.units - step.n_remove,
                "params_removed": int(params),
                "macs_removed": round(macs) if example_inputs is not None else None,
            }
        )
    before = count_params(model)
    removed_total = sum(row["params_removed"] for row in rows)
    return {
        "family": adapter.name,
        "params_before": before,
        "params_removed": removed_total,
        "params_after": before - removed_total,
        "params_fraction_removed": removed_total / before if before else 0.0,
        "macs_removed": sum(row["macs_removed"] for row in rows) if example_inputs is not None else None,
        "groups": rows,
    }
