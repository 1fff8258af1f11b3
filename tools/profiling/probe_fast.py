"""The sensitivity probe the graph runs (`probe_groups`, node `probe_sensitivity`): block-local and cached.

The full probe (`sensitivity.probe_groups_full`) deep-copies the whole model per group, builds a dependency graph,
refits on whole-model forwards and runs the whole model on every calibration image. Pruning one group changes only
its block, so this probe walks the blocks in forward order once, keeping only the current block's input activations:
for each group it copies the block alone, masks the removed units (zeroing the consumer's input columns computes
exactly what removing them does), refits the consumer by the same ridge least squares as
`tools/recovery/reconstruct.py` from the baseline activations captured while the block ran (the consumer's kept
inputs are the baseline's, since nothing before it changed), and runs only the blocks from the pruned one onward on
the cached inputs. Groups without a block, or models whose blocks cannot be skipped (checked against the baseline's
logits per block), go through the full probe. The damage is measured on the first `FastProbeConfig.eval_images`
calibration images (the refit reads them all), so its rows match the full probe's on those images, not on the whole
calibration set.
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

from profiling_agent.tools.compression.depth import replaces, stack_of
from profiling_agent.tools.compression.families.base import PrunableGroup
from profiling_agent.tools.compression.units import removed_units, select_units
from profiling_agent.tools.models.shortcut import ShortcutBlock
from profiling_agent.tools.profiling.sensitivity import (
    ProbeRun,
    cap_damage,
    compare_logits,
    damage_of,
    engine_failures,
    probe_groups_full,
    probe_ratio,
    restrict_logits,
)
from profiling_agent.tools.recovery.ridge import Layer, bias_sink, ridge_refit, weight_columns
from profiling_agent.tools.runtimes.blocks import REPLAY_TOLERANCE, PassBlock, Stop, started_at
from profiling_agent.tools.runtimes.forward import forward_logits

log = logging.getLogger(__name__)

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


class GramStats:
    """Gram statistics of one consumer over every input column plus a ones column, accumulated per batch.

    `add(x, y)` takes the consumer's input and output of one batch (the baseline's), rows sampled by `seed` as
    `reconstruct` samples them; `refit_masked` solves on the kept columns.
    """

    def __init__(self, module: nn.Module, seed: int, config: FastProbeConfig) -> None:
        self.module, self.config = module, config
        self.generator = torch.Generator().manual_seed(seed)
        self.gram: torch.Tensor | None = None
        self.cross: torch.Tensor | None = None
        self.col_sum: torch.Tensor | None = None
        self.yy, self.n = 0.0, 0

    def add(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """Add one batch: the consumer's input `x` and output `y`."""
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


def refit_masked(block: nn.Module, rel: str, stats: GramStats, removed: list[int]) -> tuple[float, float]:
    """Mask `removed` input channels of consumer `rel` in `block` and refit it; return (error before, after).

    The recovery refit's ridge problem (`recovery.ridge.ridge_refit`; prior: kept weights with the removed inputs'
    mean folded into the bias), solved on the kept rows and columns of the baseline's Gram matrix; the removed
    columns stay zero.
    """
    module = cast(Layer, block.get_submodule(rel))
    assert stats.gram is not None and stats.cross is not None and stats.col_sum is not None
    weight = module.weight
    w_full = weight.detach().reshape(weight.shape[0], -1).double()
    n_cols = w_full.shape[1]
    gone = set(weight_columns(module, removed))
    kept = [c for c in range(n_cols) if c not in gone]
    sink, sink_mod = bias_sink(block, rel, module)
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
    solved, before, after = ridge_refit(gram, cross, stats.yy, prior, untouched, len(kept))
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
    block: nn.Module, inputs: torch.Tensor, watch: dict[str, GramStats], batch_size: int, args: tuple, kwargs: dict
) -> torch.Tensor:
    """Run the baseline block on its inputs, feeding each watched consumer's (input, output) to its stats."""
    handles = []
    for rel, stats in watch.items():

        def hook(module: nn.Module, a: tuple, out: Any, stats: GramStats = stats) -> None:
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


@dataclass
class _Site:
    """One block of the walk: its baseline module, name, position, inputs and its consumers' Gram statistics."""

    block: nn.Module
    name: str
    index: int
    hidden: torch.Tensor
    watch: dict[str, GramStats]


@dataclass
class _Scorer:
    """What scores a probed group: labels and settings, then (set by the walk) the runner and baseline logits."""

    labels: torch.Tensor | None
    ratio: float
    recover: bool
    config: FastProbeConfig
    runner: _Runner = field(init=False)
    reference: torch.Tensor = field(init=False)


def probe_groups(
    model: nn.Module,
    groups: list[PrunableGroup],
    pixels: torch.Tensor,
    labels: torch.Tensor | None = None,
    *,
    ratio: float = 0.3,
    recover: bool = False,
    config: FastProbeConfig | None = None,
    run: ProbeRun | None = None,
) -> dict[str, dict[str, Any]]:
    """Probe every group as `sensitivity.probe_groups_full` does, recomputing only from the pruned block onward.

    Args:
        model: The baseline model (left as it was).
        groups: Groups from the family adapter, in forward order.
        pixels: Calibration images (N, C, H, W); the refit reads all, the damage the first `eval_images`.
        labels: Their model label ids, or None.
        ratio: Probe ratio per group (at least one unit).
        recover: Refit the group's consumer by least squares before measuring.
        config: Image count, refit rows, batch size.
        run: Allowed class ids, the seed of the refit's row sampling (importance is L2, as the engine's default)
            and the progress callback.

    Returns:
        The full probe's rows (`damage`, `kl`, `agreement`, `acc_drop`, `units_removed`, `ratio`) plus `fast`
        (True, or False for a group the full probe measured) and `refit_error` (relative squared error of the
        consumer's outputs after the refit, when refitted).
    """
    config, run = config or FastProbeConfig(), run or ProbeRun()
    started = time.process_time()
    model.eval()
    progress = _Counter(run.progress, len(groups))
    results: dict[str, dict[str, Any]] = {}
    blocks = list(dict.fromkeys(g.block for g in groups if g.block))
    if blocks:
        try:
            scorer = _Scorer(labels, ratio, recover, config)
            _walk_blocks(model, blocks, groups, pixels, scorer, run, results, progress)
        except Exception as exc:  # noqa: BLE001 - a block layout the fast path cannot replay: the full probe
            log.warning("fast probe unavailable for this model (%s: %s); full probe", type(exc).__name__, exc)
    rest = [g for g in groups if g.name not in results]
    if rest:
        full = probe_groups_full(
            model,
            rest,
            pixels,
            labels,
            ratio=ratio,
            recover=recover,
            run=ProbeRun(allowed_ids=run.allowed_ids, seed=run.seed),
        )
        for g in rest:
            results[g.name] = {**full[g.name], "fast": False}
            progress(g.name)
    masked = [g for g in groups if results[g.name].get("fast") and g.kind != "block"]  # blocks are the adapter's
    for name, reason in engine_failures(model, masked, ratio, pixels[:1], run.seed).items():
        results[name] = {"damage": float("inf"), "error": reason[:300], "ratio": results[name]["ratio"], "fast": True}
    for r in results.values():  # the full probe capped its own errors among its own rows: cap them among all
        if r.get("error"):
            r["damage"] = float("inf")
    cap_damage(results)
    log.info("fast probe: %d groups in %.1f CPU-s", len(groups), time.process_time() - started)
    return {g.name: results[g.name] for g in groups}


class _Counter:
    """Counts probed groups and reports each one as progress(done, total, group name)."""

    def __init__(self, report: Callable[[int, int, str], None] | None, total: int) -> None:
        self.report, self.total, self.done = report, total, 0

    def __call__(self, name: str) -> None:
        self.done += 1
        if self.report:
            self.report(self.done, self.total, name)


def _walk_blocks(
    model: nn.Module,
    blocks: list[str],
    groups: list[PrunableGroup],
    pixels: torch.Tensor,
    scorer: _Scorer,
    run: ProbeRun,
    results: dict[str, dict[str, Any]],
    progress: _Counter,
) -> None:
    """Walk the blocks in forward order once, probing each block's groups into `results`.

    Stops (leaving the rest to the full probe) at the first block whose skipped predecessors change the logits.
    Sets the scorer's runner and reference logits (the first `eval_images` images).
    """
    config = scorer.config
    n_eval = min(len(pixels), config.eval_images or len(pixels))
    info = _capture_first(model, blocks, pixels, n_eval, config.batch_size)
    scorer.reference = restrict_logits(info["logits"][:n_eval], run.allowed_ids)
    scorer.runner = _Runner(model, blocks, info["arity"], pixels[:n_eval])
    hidden = torch.empty(0)
    for index, block_name in enumerate(blocks):
        hidden = info["inputs"].get(block_name, hidden)  # a stack's first block: its own inputs
        args, kwargs = info["args"].get(block_name, ((), {}))
        block = model.get_submodule(block_name)
        check = scorer.runner.logits(index, block, hidden[:1], config.batch_size)  # skipping must change nothing
        gap = float((check - info["logits"][:1]).abs().max()) / (1.0 + float(info["logits"][:1].abs().max()))
        if gap > SKIP_TOLERANCE:
            log.warning("fast probe: skipping blocks before %s changes the logits (%.2g); full probe", block_name, gap)
            return
        mine = [g for g in groups if g.block == block_name]
        watch = {}  # seeded per consumer position in its group, as reconstruct() does
        for g in mine:
            for i, rel in enumerate(_consumers(block, block_name, g)):
                watch[rel] = GramStats(block.get_submodule(rel), run.seed + i, config)
        nxt = _block_pass(block, hidden, watch if scorer.recover else {}, config.batch_size, args, kwargs)
        site = _Site(block, block_name, index, hidden, watch)
        for g in mine:
            row = _probe_one(g, site, scorer)
            if row is not None:  # else the full probe measures it, or records why it cannot be pruned
                results[g.name] = row
                progress(g.name)
        hidden = nxt


def _probe_one(group: PrunableGroup, site: _Site, scorer: _Scorer) -> dict[str, Any] | None:
    """Mask (and refit) one group on a copy of its block and measure the damage from that block onward.

    Returns None when the block-local probe cannot handle the group; the caller then runs the full probe on it.
    """
    if group.kind == "block":  # what taking the block out costs: a pass-through, or its shortcut, in its place
        skip = ShortcutBlock(site.block) if replaces(group) else PassBlock(scorer.runner.arity[site.name])
        return {**_damage_from(site, skip, scorer), "units_removed": 1, "ratio": 1.0}
    probe = probe_ratio(group, scorer.ratio)
    try:
        n_remove = removed_units(group.units, group.min_units, probe)
        if not n_remove:
            return None
        channels = _channels(group, select_units(scorer.runner.model, group, n_remove, "l2"))
        trial = copy.deepcopy(site.block)
        errors = []
        consumers = _consumers(site.block, site.name, group)
        if not consumers:
            raise ValueError(f"no consumer of {group.name} inside block {site.name}")
        for rel in consumers:
            if scorer.recover:
                errors.append(refit_masked(trial, rel, site.watch[rel], channels)[1])
            else:
                _mask_only(trial, rel, channels)
        row = _damage_from(site, trial, scorer)
        row.update(units_removed=n_remove, ratio=round(probe, 4))
        if errors:
            row["refit_error"] = round(max(errors), 6)
        return row
    except Exception as exc:  # noqa: BLE001 - the full probe decides whether the group is unprunable
        log.info("fast sensitivity probe cannot handle %s (%s): full probe", group.name, exc)
        return None


def _damage_from(site: _Site, block: nn.Module, scorer: _Scorer) -> dict[str, Any]:
    """Run the model from the site's block on, `block` in its place, and return the logit statistics and damage."""
    reference = scorer.reference
    logits = scorer.runner.logits(site.index, block, site.hidden[: len(reference)], scorer.config.batch_size)
    labels_used = scorer.labels[: len(reference)] if scorer.labels is not None else None
    stats = compare_logits(reference, _restrict_like(reference, logits), labels_used)
    return {**stats, "damage": damage_of(stats), "fast": True}


def _restrict_like(reference: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """Give `logits` the reference's -inf mask (the classes outside the dataset)."""
    return torch.where(torch.isinf(reference), reference, logits)
