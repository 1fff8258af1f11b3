"""Fast sensitivity probe: block-local copies, cached baseline activations, a local refit, downstream-only forwards.

The full probe (`sensitivity.probe_sensitivity`) deep-copies the whole model per group, builds a dependency graph,
refits on whole-model forwards and runs the whole model twice. Pruning one group changes only its block, so this
probe walks the blocks in forward order once, keeping only the current block's input activations: for each group
it copies the block alone, masks the removed units (zeroing the consumer's input columns computes exactly what
removing them does), refits the consumer by the same ridge least squares as `tools/recovery/reconstruct.py` from
the baseline activations captured while the block ran (the consumer's kept inputs are the baseline's, since
nothing before it changed), and runs only the blocks from the pruned one onward on the cached inputs. Groups
without a block, or models whose blocks cannot be skipped (checked against the baseline's logits per block), go
through the full probe.
"""

from __future__ import annotations

import copy
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

from profiling_agent.tools.compression.depth import replaces, stack_of
from profiling_agent.tools.compression.families.base import PrunableGroup
from profiling_agent.tools.compression.units import removed_units, select_units
from profiling_agent.tools.models.shortcut import ShortcutBlock
from profiling_agent.tools.profiling.sensitivity import (
    compare_logits,
    damage_of,
    probe_ratio,
    probe_sensitivity,
    restrict_logits,
)
from profiling_agent.tools.runtimes.blocks import REPLAY_TOLERANCE, PassBlock, Stop, started_at
from profiling_agent.tools.runtimes.forward import forward_logits

log = logging.getLogger(__name__)

Layer = nn.Linear | nn.Conv2d
RIDGE = 1e-2  # as tools/recovery/reconstruct.py: relative to the mean diagonal of the Gram matrix
SKIP_TOLERANCE = REPLAY_TOLERANCE  # largest |logit gap| / (1 + max |logit|) when earlier blocks are skipped


@dataclass
class FastProbeConfig:
    """Knobs of the fast probe (the defaults keep full-size ViT-B/16 within a few CPU-minutes).

    Attributes:
        eval_images: Images whose logits measure the damage (the first ones of the calibration set; 0: all).
        max_rows: Activation rows sampled per batch and consumer for the refit (reconstruct.py uses 4096).
        batch_size: Images per forward (also the refit's row-sampling batch, as in reconstruct.py).
        float32_gram: Accumulate the refit's Gram matrices from float32 products (about 4x faster than float64).
    """

    eval_images: int = 16
    max_rows: int = 2048
    batch_size: int = 32
    float32_gram: bool = True


def _channels(group: PrunableGroup, units: list[int]) -> list[int]:
    return [u * group.unit_size + j for u in units for j in range(group.unit_size)]


def _consumers(block: nn.Module, prefix: str, group: PrunableGroup) -> list[str]:
    """Name the group's members inside `block` that read its channels (relative to the block)."""
    width = group.units * group.unit_size
    out = []
    for name in group.members:
        if name in group.roots or not name.startswith(prefix + "."):
            continue
        rel = name[len(prefix) + 1 :]
        module = block.get_submodule(rel)
        if isinstance(module, (nn.Linear, nn.Conv2d)) and getattr(module, "groups", 1) == 1:
            if module.weight.shape[1] == width:
                out.append(rel)
    return out


def _rows(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    if isinstance(module, nn.Linear):
        return x.reshape(-1, x.shape[-1])
    assert isinstance(module, nn.Conv2d)
    cols = F.unfold(x, module.kernel_size, module.dilation, module.padding, module.stride)  # type: ignore[arg-type]
    return cols.transpose(1, 2).reshape(-1, cols.shape[1])


def _targets(module: nn.Module, y: torch.Tensor) -> torch.Tensor:
    if isinstance(module, nn.Linear):
        return y.reshape(-1, y.shape[-1])
    return y.flatten(2).transpose(1, 2).reshape(-1, y.shape[1])


class _Stats:
    """Gram statistics of one consumer over every input column plus a ones column, accumulated per batch."""

    def __init__(self, module: nn.Module, seed: int, config: FastProbeConfig) -> None:
        self.module, self.config = module, config
        self.generator = torch.Generator().manual_seed(seed)
        self.gram: torch.Tensor | None = None
        self.cross: torch.Tensor | None = None
        self.col_sum: torch.Tensor | None = None
        self.yy, self.n = 0.0, 0

    def add(self, x: torch.Tensor, y: torch.Tensor) -> None:
        rows, target = _rows(self.module, x), _targets(self.module, y)
        if rows.shape[0] > self.config.max_rows:
            pick = torch.randperm(rows.shape[0], generator=self.generator)[: self.config.max_rows]
            rows, target = rows[pick], target[pick]
        dtype = torch.float32 if self.config.float32_gram else torch.float64
        rows1 = torch.cat([rows, torch.ones(rows.shape[0], 1)], 1).to(dtype)
        gram = (rows1.T @ rows1).double()
        cross = (rows1.T @ target.to(dtype)).double()
        self.gram = gram if self.gram is None else self.gram + gram
        self.cross = cross if self.cross is None else self.cross + cross
        total = rows1[:, :-1].double().sum(0)
        self.col_sum = total if self.col_sum is None else self.col_sum + total
        self.yy += float(target.double().pow(2).sum())
        self.n += rows.shape[0]


def _columns(module: nn.Module, channels: list[int]) -> list[int]:
    per = 1 if isinstance(module, nn.Linear) else int(module.kernel_size[0] * module.kernel_size[1])  # type: ignore[index]
    return [c * per + j for c in channels for j in range(per)]


def _bias_sink(block: nn.Module, rel: str, module: nn.Module) -> tuple[str, nn.Module | None]:
    if getattr(module, "bias", None) is not None:
        return "bias", module
    parent_name, _, _ = rel.rpartition(".")
    parent = block.get_submodule(parent_name) if parent_name else block
    norms = [
        m
        for m in parent.children()
        if isinstance(m, nn.BatchNorm2d)
        and m.num_features == cast(Layer, module).weight.shape[0]
        and m.running_mean is not None
    ]
    return ("batchnorm", norms[0]) if len(norms) == 1 else ("none", None)


def refit_masked(block: nn.Module, rel: str, stats: _Stats, removed: list[int]) -> tuple[float, float]:
    """Mask `removed` input channels of consumer `rel` in `block` and refit it; return (error before, after).

    The same ridge problem as `reconstruct._fit_one` (prior: kept weights with the removed inputs' mean folded into
    the bias), solved on the kept rows and columns of the baseline's Gram matrix; the removed columns stay zero.
    """
    module = cast(Layer, block.get_submodule(rel))
    assert stats.gram is not None and stats.cross is not None and stats.col_sum is not None
    weight = module.weight
    w_full = weight.detach().reshape(weight.shape[0], -1).double()
    n_cols = w_full.shape[1]
    gone = set(_columns(module, removed))
    kept = [c for c in range(n_cols) if c not in gone]
    sink, sink_mod = _bias_sink(block, rel, module)
    with_bias = sink != "none"
    index = torch.tensor(kept + ([n_cols] if with_bias else []))
    gram = stats.gram[index][:, index]
    cross = stats.cross[index]
    bias = getattr(module, "bias", None)
    own = bias.detach().double() if bias is not None and sink == "bias" else torch.zeros(w_full.shape[0]).double()
    current = w_full[:, kept].T
    removed_cols = sorted(gone)
    folded = own + w_full[:, removed_cols] @ (stats.col_sum[removed_cols] / max(stats.n, 1))
    prior = torch.cat([current, folded[None]]) if with_bias else current
    untouched = torch.cat([current, own[None]]) if with_bias else current
    lam = RIDGE * (float(gram.diagonal()[: len(kept)].mean()) or 1.0)
    solved = torch.linalg.solve(gram + lam * torch.eye(len(index), dtype=torch.float64), cross + lam * prior)

    def error(theta: torch.Tensor) -> float:
        return float((theta * (gram @ theta)).sum() - 2 * (theta * cross).sum() + stats.yy) / max(stats.yy, 1e-30)

    before, after = error(untouched), error(solved)
    if not torch.isfinite(solved).all() or after > before:
        solved, after = untouched, before
    with torch.no_grad():
        flat = torch.zeros_like(w_full)
        flat[:, kept] = solved[: len(kept)].T
        weight.copy_(flat.reshape(weight.shape).to(weight.dtype))
        if sink == "bias" and module.bias is not None:
            module.bias.copy_(solved[len(kept)].to(module.bias.dtype))
        elif sink == "batchnorm" and isinstance(sink_mod, nn.BatchNorm2d) and sink_mod.running_mean is not None:
            mean = sink_mod.running_mean
            mean.copy_(mean - solved[len(kept)].to(mean.dtype))
    return before, after


def _mask_only(block: nn.Module, rel: str, channels: list[int]) -> None:
    """Zero the input channels `channels` of consumer `rel`: what removing them computes."""
    with torch.no_grad():
        cast(Layer, block.get_submodule(rel)).weight[:, channels] = 0.0


class _Runner:
    """Runs the model from one block onward on cached block inputs, the blocks before it skipped."""

    def __init__(self, model: nn.Module, blocks: list[str], arity: dict[str, int], pixels: torch.Tensor) -> None:
        self.model, self.blocks, self.arity, self.pixels = model, blocks, arity, pixels

    def logits(self, index: int, block: nn.Module, inputs: torch.Tensor, batch_size: int) -> torch.Tensor:
        """Return the logits with block `index` replaced by `block`, fed `inputs` (one row per image)."""
        outs = []
        with started_at(self.model, self.blocks, index, self.arity, block) as inject, torch.inference_mode():
            for start in range(0, len(inputs), batch_size):
                inject.current = inputs[start : start + batch_size]
                outs.append(forward_logits(self.model, self.pixels[start : start + batch_size]))
        return torch.cat(outs)


def _block_pass(
    block: nn.Module, inputs: torch.Tensor, watch: dict[str, _Stats], batch_size: int, args: tuple, kwargs: dict
) -> torch.Tensor:
    """Run the baseline block on its inputs, feeding each watched consumer's (input, output) to its stats."""
    handles = []
    for rel, stats in watch.items():

        def hook(module: nn.Module, a: tuple, out: Any, stats: _Stats = stats) -> None:
            stats.add(a[0].detach(), out.detach())

        handles.append(block.get_submodule(rel).register_forward_hook(hook))
    outs = []
    try:
        with torch.inference_mode():
            for start in range(0, len(inputs), batch_size):
                out = block(inputs[start : start + batch_size], *args, **kwargs)
                outs.append(out[0] if isinstance(out, tuple) else out)
    finally:
        for h in handles:
            h.remove()
    return torch.cat(outs)


def _capture_first(
    model: nn.Module, names: list[str], pixels: torch.Tensor, n_eval: int, batch_size: int
) -> dict[str, Any]:
    """Capture what the probe replays from: each stack's first block inputs, every block's arguments and output type.

    The blocks of one stack feed each other, so only the first block of each stack needs its inputs kept (a Swin
    stage downsamples before the next stage's first block). Only the first `n_eval` images run the whole model,
    whose logits are kept; the others stop at the last stack's first block.

    Returns:
        {"inputs": {stack-first block: inputs of every image}, "args": {block: (positional args after the hidden
        state, keyword args)}, "arity": {block: its tuple length, 0 for a tensor}, "logits": the first `n_eval`
        images' logits}.
    """
    starts = [name for i, name in enumerate(names) if i == 0 or stack_of(name) != stack_of(names[i - 1])]
    info: dict[str, Any] = {"inputs": {n: [] for n in starts}, "arity": {}, "args": {}, "stop": False}
    handles = []
    for name in names:

        def pre(module: nn.Module, args: tuple, kwargs: dict, name: str = name) -> None:
            info["args"].setdefault(name, (args[1:], kwargs))
            if name in info["inputs"]:
                info["inputs"][name].append(args[0].detach())
                if info["stop"] and name == starts[-1]:
                    raise Stop

        def post(module: nn.Module, args: tuple, out: Any, name: str = name) -> None:
            info["arity"][name] = len(out) if isinstance(out, tuple) else 0

        handles.append(model.get_submodule(name).register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(model.get_submodule(name).register_forward_hook(post))
    logits = []
    try:
        with torch.inference_mode():
            for start in range(0, n_eval, batch_size):
                logits.append(forward_logits(model, pixels[start : min(start + batch_size, n_eval)]))
            info["stop"] = True
            for start in range(n_eval, len(pixels), batch_size):
                try:
                    forward_logits(model, pixels[start : start + batch_size])
                except Stop:
                    pass
    finally:
        for h in handles:
            h.remove()
    info["inputs"] = {name: torch.cat(parts) for name, parts in info["inputs"].items()}
    info["logits"] = torch.cat(logits)
    return info


def probe_sensitivity_fast(
    model: nn.Module,
    groups: list[PrunableGroup],
    pixels: torch.Tensor,
    labels: torch.Tensor | None = None,
    *,
    ratio: float = 0.3,
    allowed_ids: list[int] | None = None,
    seed: int = 0,
    progress: Callable[[int, int, str], None] | None = None,
    recover: bool = False,
    config: FastProbeConfig | None = None,
) -> dict[str, dict[str, Any]]:
    """Probe every group like `sensitivity.probe_sensitivity`, recomputing only from the pruned block onward.

    Args:
        model: The baseline model (left as it was).
        groups: Groups from the family adapter, in forward order.
        pixels: Calibration images (N, C, H, W); the refit reads all, the damage the first `eval_images`.
        labels: Their model label ids, or None.
        ratio: Probe ratio per group (at least one unit).
        allowed_ids: Restrict predictions to these ids.
        seed: Seed of the refit's row sampling (importance is L2, as the engine's default).
        progress: Called as progress(done, total, group_name).
        recover: Refit the group's consumer by least squares before measuring.
        config: Image count, refit rows, batch size.

    Returns:
        The full probe's rows (`damage`, `kl`, `agreement`, `acc_drop`, `units_removed`, `ratio`) plus `fast`
        (True, or False for a group the full probe measured) and `refit_error` (relative squared error of the
        consumer's outputs after the refit, when refitted).
    """
    config = config or FastProbeConfig()
    started = time.process_time()
    model.eval()
    n_eval = min(len(pixels), config.eval_images or len(pixels))
    blocks = list(dict.fromkeys(g.block for g in groups if g.block))
    results: dict[str, dict[str, Any]] = {}
    done = 0
    if blocks:
        try:
            info = _capture_first(model, blocks, pixels, n_eval, config.batch_size)
            reference = restrict_logits(info["logits"][:n_eval], allowed_ids)
            runner = _Runner(model, blocks, info["arity"], pixels[:n_eval])
            hidden = torch.empty(0)
            for index, block_name in enumerate(blocks):
                hidden = info["inputs"].get(block_name, hidden)  # a stack's first block: its own inputs
                args, kwargs = info["args"].get(block_name, ((), {}))
                block = model.get_submodule(block_name)
                mine = [g for g in groups if g.block == block_name]
                check = runner.logits(index, block, hidden[:1], config.batch_size)  # skipping must change nothing
                gap = float((check - info["logits"][:1]).abs().max()) / (1.0 + float(info["logits"][:1].abs().max()))
                if gap > SKIP_TOLERANCE:
                    log.warning(
                        "fast probe: skipping blocks before %s changes the logits (%.2g); full probe", block_name, gap
                    )
                    break
                watch = {}  # seeded per consumer position in its group, as reconstruct() does
                for g in mine:
                    for i, rel in enumerate(_consumers(block, block_name, g)):
                        watch[rel] = _Stats(block.get_submodule(rel), seed + i, config)
                nxt = _block_pass(block, hidden, watch if recover else {}, config.batch_size, args, kwargs)
                for g in mine:
                    row = _probe_one(
                        g, block, block_name, index, hidden, watch, runner, reference, labels, ratio, recover, config
                    )
                    if row is None:  # the full probe below measures it, or records why it cannot be pruned
                        continue
                    results[g.name] = row
                    done += 1
                    if progress:
                        progress(done, len(groups), g.name)
                hidden = nxt
        except Exception as exc:  # noqa: BLE001 - a block layout the fast path cannot replay: the full probe
            log.warning("fast probe unavailable for this model (%s: %s); full probe", type(exc).__name__, exc)
    rest = [g for g in groups if g.name not in results]
    if rest:
        full = probe_sensitivity(
            model, rest, pixels, labels, ratio=ratio, allowed_ids=allowed_ids, seed=seed, recover=recover
        )
        for g in rest:
            results[g.name] = {**full[g.name], "fast": False}
            done += 1
            if progress:
                progress(done, len(groups), g.name)
    masked = [g for g in groups if results[g.name].get("fast") and g.kind != "block"]  # blocks are the adapter's
    for name, reason in engine_failures(model, masked, ratio, pixels[:1], seed).items():
        results[name] = {"damage": float("inf"), "error": reason[:300], "ratio": results[name]["ratio"], "fast": True}
    for r in results.values():  # the full probe capped its own errors among its own rows: cap them among all
        if r.get("error"):
            r["damage"] = float("inf")
    finite = [r["damage"] for r in results.values() if r["damage"] != float("inf")]
    cap = 10.0 * max(finite) if finite else 1.0
    for r in results.values():
        if r["damage"] == float("inf"):
            r["damage"] = cap
    log.info("fast probe: %d groups in %.1f CPU-s", len(groups), time.process_time() - started)
    return {g.name: results[g.name] for g in groups}


def engine_failures(
    model: nn.Module, groups: list[PrunableGroup], ratio: float, example: torch.Tensor, seed: int = 0
) -> dict[str, str]:
    """Return {group: reason} for the groups the pruning engine refuses at the probe ratio.

    Masking never asks the engine, so the block-local probe would rate a group it cannot prune like any other; one
    copy pruned at every group's probe ratio finds out in one dependency-graph build (one by one when that fails).
    """
    from profiling_agent.tools.compression.pruning import prune_model
    from profiling_agent.tools.text import one_line

    def entry(group: PrunableGroup) -> dict[str, Any]:
        return {"layer": f"^{re.escape(group.module)}$", "type": group.kind, "ratio": probe_ratio(group, ratio)}

    def refused(chosen: list[PrunableGroup]) -> str | None:
        try:
            prune_model(copy.deepcopy(model), [entry(g) for g in chosen], example, seed=seed)
        except Exception as exc:  # noqa: BLE001 - the reason is recorded as the group's fact
            return f"{type(exc).__name__}: {one_line(exc)}"
        return None

    if not groups or refused(groups) is None:
        return {}
    return {g.name: reason for g in groups if (reason := refused([g])) is not None}


def _probe_one(
    group: PrunableGroup,
    block: nn.Module,
    block_name: str,
    index: int,
    hidden: torch.Tensor,
    watch: dict[str, _Stats],
    runner: _Runner,
    reference: torch.Tensor,
    labels: torch.Tensor | None,
    ratio: float,
    recover: bool,
    config: FastProbeConfig,
) -> dict[str, Any] | None:
    """Mask (and refit) one group on a copy of its block and measure the damage from that block onward.

    Returns None when the block-local probe cannot handle the group; the caller then runs the full probe on it.
    """
    if group.kind == "block":  # what taking the block out costs: a pass-through, or its shortcut, in its place
        skip = ShortcutBlock(block) if replaces(group) else PassBlock(runner.arity[block_name])
        return {
            **_damage_from(index, skip, hidden, runner, reference, labels, config),
            "units_removed": 1,
            "ratio": 1.0,
        }
    probe = probe_ratio(group, ratio)
    try:
        n_remove = removed_units(group.units, group.min_units, probe)
        if not n_remove:
            return None
        units = select_units(runner.model, group, n_remove, "l2")
        channels = _channels(group, units)
        trial = copy.deepcopy(block)
        errors = []
        consumers = _consumers(block, block_name, group)
        if not consumers:
            raise ValueError(f"no consumer of {group.name} inside block {block_name}")
        for rel in consumers:
            if recover:
                errors.append(refit_masked(trial, rel, watch[rel], channels)[1])
            else:
                _mask_only(trial, rel, channels)
        row = _damage_from(index, trial, hidden, runner, reference, labels, config)
        row.update(units_removed=n_remove, ratio=round(probe, 4))
        if errors:
            row["refit_error"] = round(max(errors), 6)
        return row
    except Exception as exc:  # noqa: BLE001 - the full probe decides whether the group is unprunable
        log.info("fast sensitivity probe cannot handle %s (%s): full probe", group.name, exc)
        return None


def _damage_from(
    index: int,
    block: nn.Module,
    hidden: torch.Tensor,
    runner: _Runner,
    reference: torch.Tensor,
    labels: torch.Tensor | None,
    config: FastProbeConfig,
) -> dict[str, Any]:
    """Run the model from block `index` on, `block` in its place, and return the logit statistics and damage."""
    logits = runner.logits(index, block, hidden[: len(reference)], config.batch_size)
    labels_used = labels[: len(reference)] if labels is not None else None
    stats = compare_logits(reference, _restrict_like(reference, logits), labels_used)
    return {**stats, "damage": damage_of(stats), "fast": True}


def _restrict_like(reference: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """Give `logits` the reference's -inf mask (the classes outside the dataset)."""
    return torch.where(torch.isinf(reference), reference, logits)
