"""A latency model of the delivered backend: per group, its node time measured at a few pruning ratios.

NetAdapt-style lookup table, measured rather than assumed: the model is pruned uniformly at each ratio (every group
at once), built in the backend's form and profiled per node (`backend_profile`); each group's node time at each
ratio is read off the same profile. A plan's latency on that backend is then predicted by interpolating every
group's time at its own ratio, plus the time no group owns. Tables are cached per model (weights digest) and form.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from profiling_agent.tools.io import write_json_atomic
from profiling_agent.tools.profiling.backend_profile import BackendForm, form_profile
from profiling_agent.tools.profiling.identical import identical_layers

log = logging.getLogger(__name__)

RATIOS = (0.0, 0.25, 0.5, 0.75)


def model_digest(model: nn.Module) -> str:
    """Return a short digest of the model's weights and shapes (the cache key of its tables)."""
    h = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        h.update(name.encode())
        h.update(str(tuple(tensor.shape)).encode())
        h.update(tensor.detach().float().flatten()[:64].cpu().numpy().tobytes())
    return h.hexdigest()[:16]


def measure_table(
    model: nn.Module,
    example: torch.Tensor,
    form: BackendForm,
    *,
    ratios: Sequence[float] = RATIOS,
    folder: Path,
    repeats: int = 5,
    base_path: Path | None = None,
) -> dict[str, Any]:
    """Measure every group's node time in `form` at each ratio (all groups pruned uniformly by L2 norm).

    Each form is timed twice, in opposite orders, and each node keeps its faster median; identical layers' rows
    are pooled (`identical`). `base_path` is the unpruned model already built in `form` (the profile's build): ratio
    0 is timed on it instead of a new build.

    Returns:
        {"form", "ratios", "groups": {group: [ms at each ratio]}, "other_ms": [ms no group owns, per ratio],
        "total_ms": [per ratio]}.
    """
    from profiling_agent.tools.compression.families import (
        adapter_for,
    )  # lazy: transformers; tools.profiling.deliverable loads this module without it
    from profiling_agent.tools.compression.pruning import (
        prune_model,
    )  # lazy: torch_pruning and transformers; tools.profiling.deliverable loads this module without it

    groups = adapter_for(model).prunable_groups(model)
    rows = [dataclasses.asdict(g) for g in groups]
    table: dict[str, Any] = {"form": form.name, "ratios": list(ratios), "groups": {g.name: [] for g in groups}}
    table["other_ms"], table["total_ms"] = [], []
    paths: list[Path] = []
    classes = []
    for ratio in ratios:
        trial = copy.deepcopy(model)
        if ratio > 0:
            entries = [{"layer": f"^{g.module}$", "type": g.kind, "ratio": ratio} for g in groups]
            prune_model(trial, entries, example)
        if ratio == 0 and base_path is not None:
            paths.append(base_path)
        else:
            paths.append(form.build(trial, example, folder / f"r{int(ratio * 100):02d}"))
        classes.append(identical_layers(trial))  # pruned alike, identical layers stay identical
    # timed twice, in opposite orders, each node's faster median kept: whichever form runs first on a cold
    # machine is not booked as slower (on the zoo ViT the unpruned form, timed first, read 45% above its value)
    times: list[dict[str, float]] = [{} for _ in paths]
    for order in (range(len(paths)), reversed(range(len(paths)))):
        for i in order:
            for node, ms in form.time_nodes(paths[i], example, 2, repeats).items():
                times[i][node] = min(ms, times[i].get(node, ms))
    for node_ms, pooled in zip(times, classes, strict=True):
        prof = form_profile(node_ms, rows, form.module_path, pooled)
        total = prof["total_ms"]
        owned = 0.0
        for name, share in prof["group_latency_share"].items():
            table["groups"][name].append(round(share * total, 5))
            owned += share * total
        table["other_ms"].append(round(total - owned, 5))
        table["total_ms"].append(round(total, 5))
    return table


def cached_table(
    model: nn.Module, example: torch.Tensor, form: BackendForm, cache: Path, **kwargs: Any
) -> dict[str, Any]:
    """Return the table of (model, form) from `cache`, measuring and writing it on a miss."""
    path = cache / f"latency-v4-{model_digest(model)}-{form.name}.json"  # v3: OpenVINO static shape; v4: pooled
    if path.exists():
        return json.loads(path.read_text())
    table = measure_table(model, example, form, folder=cache / "forms", **kwargs)
    write_json_atomic(path, table)
    return table


def _interp(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
    if x <= xs[0]:
        return ys[0]
    for (x0, y0), (x1, y1) in zip(zip(xs, ys, strict=True), zip(xs[1:], ys[1:], strict=True), strict=False):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    x0, x1, y0, y1 = xs[-2], xs[-1], ys[-2], ys[-1]  # beyond the last ratio: extend the last segment
    return max(0.0, y1 + (y1 - y0) * (x - x1) / (x1 - x0))


def predict_latency(table: Mapping[str, Any], ratios: Mapping[str, float]) -> dict[str, float]:
    """Predict a plan's latency in the table's form: each group's time at its ratio, plus the rest (at ratio 0).

    Returns:
        {"baseline_ms", "predicted_ms", "reduction"}.
    """
    xs = table["ratios"]
    base = float(table["total_ms"][0])
    predicted = float(table["other_ms"][0])
    for name, times in table["groups"].items():
        predicted += _interp(xs, times, float(ratios.get(name, 0.0)))
    return {"baseline_ms": base, "predicted_ms": predicted, "reduction": 1.0 - predicted / base if base else 0.0}
