"""Refit the layers that consume pruned channels by ridge least squares so they reproduce the baseline's outputs."""

from __future__ import annotations

import contextlib
import copy
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

from profiling_agent.tools.compression.families import adapter_for
from profiling_agent.tools.compression.token_merge import tokens_unmerged
from profiling_agent.tools.compression.units import PrunedGroup, channels_of
from profiling_agent.tools.recovery.ridge import RIDGE, Layer, bias_sink, ridge_refit, weight_columns
from profiling_agent.tools.runtimes.blocks import Stop, replays, started_at
from profiling_agent.tools.runtimes.forward import forward_logits

MAX_ROWS_PER_BATCH = 4096  # activation rows (tokens or pixel positions) sampled per batch and consumer


@dataclass(frozen=True)
class RefitSettings:
    """How each consumer's ridge problem is sampled and solved."""

    ridge: float = RIDGE  # relative ridge strength (times the mean diagonal of X'X)
    batch_size: int = 32  # images per forward pass
    max_rows: int = MAX_ROWS_PER_BATCH  # activation rows sampled per batch and consumer (seeded)


class ReconstructError(RuntimeError):
    """A consumer layer cannot be reconstructed (not called, unsupported layer, shapes that do not line up)."""


@dataclass(frozen=True)
class Consumer:
    """A layer whose input channels pruning removed, and which of the baseline's input channels it kept."""

    group: str
    name: str
    kept: tuple[int, ...]
    removed: tuple[int, ...]
    outputs: tuple[int, ...] | None = None  # baseline output channels it keeps when it is also a pruned root


@dataclass
class ConsumerFit:
    """How one consumer's refit went: relative squared error of its outputs before and after, on the fit rows."""

    group: str
    name: str
    rows: int
    error_before: float
    error_after: float
    bias_into: str


BaseCapture = Callable[[int], tuple[torch.Tensor, torch.Tensor]]  # batch index -> baseline (input, output)
NewCapture = Callable[[int], torch.Tensor]  # batch index -> the pruned model's input of the consumer
Hook = Callable[[nn.Module, tuple, Any], None]  # a forward hook: (module, args, output)


def find_consumers(
    baseline: nn.Module, pruned: nn.Module, applied: Iterable[PrunedGroup], adapter: Any = None
) -> list[Consumer]:
    """List, in forward order, the non-root members of each pruned group that lost input channels.

    Args:
        baseline: The unpruned model.
        pruned: The pruned model.
        applied: `PruneReport.applied` rows with their `removed` unit indices.
        adapter: The family adapter (picked for `baseline` when omitted).
    """
    adapter = adapter or adapter_for(baseline)
    groups = {g.name: g for g in adapter.prunable_groups(baseline)}
    rows = list(applied)
    outputs: dict[str, tuple[int, ...]] = {}  # a root that lost output channels keeps these
    for row in rows:
        if row.removed and row.group in groups:
            group = groups[row.group]
            gone = set(channels_of(group, row.removed))
            for root in group.roots:
                outputs[root] = tuple(c for c in range(group.units * group.unit_size) if c not in gone)
    found = []
    for row in rows:
        removed_units = list(row.removed)
        if not removed_units:
            continue
        if row.group not in groups:
            raise ReconstructError(f"group {row.group} is not a group of the baseline")
        group = groups[row.group]
        removed = channels_of(group, removed_units)
        width = group.units * group.unit_size
        kept = tuple(c for c in range(width) if c not in set(removed))
        for name in group.members:
            base, new = baseline.get_submodule(name), cast(Layer, pruned.get_submodule(name))
            if name in group.roots or not isinstance(base, (nn.Linear, nn.Conv2d)) or getattr(base, "groups", 1) != 1:
                continue
            if base.weight.shape[1] == width and new.weight.shape[1] == len(kept):
                found.append(Consumer(group.name, name, kept, tuple(removed), outputs.get(name)))
    return found


def _grab(box: dict[str, torch.Tensor]) -> Hook:
    """Return a forward hook that keeps its layer's input and output in `box` and ends the pass (`Stop`)."""

    def hook(module: nn.Module, args: tuple, out: Any) -> None:
        box["x"], box["y"] = args[0].detach(), out.detach()
        raise Stop

    return hook


def _grabbed(box: dict[str, torch.Tensor], name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Return what `_grab` kept for module `name`."""
    if not box:
        raise ReconstructError(f"{name} is not called in the forward pass")
    return box["x"], box["y"]


def _capture(model: nn.Module, name: str, pixels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Run `model` on `pixels` until module `name` has run; return its input and output."""
    box: dict[str, torch.Tensor] = {}
    handle = model.get_submodule(name).register_forward_hook(_grab(box))
    try:
        with torch.inference_mode():
            forward_logits(model, pixels)
    except Stop:
        pass
    finally:
        handle.remove()
    return _grabbed(box, name)


def _rows(module: Layer, x: torch.Tensor) -> torch.Tensor:
    """Return the layer's input as rows (one per token or output position) of the features its weights read."""
    if isinstance(module, nn.Linear):
        return x.reshape(-1, x.shape[-1])
    if module.padding_mode != "zeros" or isinstance(module.padding, str):
        raise ReconstructError(f"convolution with padding {module.padding!r}/{module.padding_mode} is not supported")
    cols = F.unfold(x, module.kernel_size, module.dilation, module.padding, module.stride)
    return cols.transpose(1, 2).reshape(-1, cols.shape[1])


def _targets(module: nn.Module, y: torch.Tensor) -> torch.Tensor:
    """Return the layer's output as rows matching `_rows`."""
    if isinstance(module, nn.Linear):
        return y.reshape(-1, y.shape[-1])
    return y.flatten(2).transpose(1, 2).reshape(-1, y.shape[1])


def _sample(rows: int, cap: int, generator: torch.Generator) -> torch.Tensor | None:
    return None if rows <= cap else torch.randperm(rows, generator=generator)[:cap]


def _fit_one(
    baseline: nn.Module,
    pruned: nn.Module,
    consumer: Consumer,
    pixels: torch.Tensor,
    *,
    refit: RefitSettings,
    seed: int,
    captures: tuple[BaseCapture, NewCapture] | None = None,
) -> ConsumerFit:
    """Accumulate the Gram matrices of one consumer over the calibration batches and solve the ridge problem.

    `captures` give, per batch index, the baseline's input and output of the consumer and the pruned model's input
    (default: forwards of both whole models up to the consumer).
    """
    base_mod = cast(Layer, baseline.get_submodule(consumer.name))
    mod = cast(Layer, pruned.get_submodule(consumer.name))
    batch_size, max_rows = refit.batch_size, refit.max_rows
    sink, sink_mod = bias_sink(pruned, consumer.name, mod)
    with_bias = sink != "none"
    w_full = base_mod.weight.detach().reshape(base_mod.weight.shape[0], -1).double().cpu()
    outs = list(consumer.outputs) if consumer.outputs is not None else list(range(w_full.shape[0]))
    w_full = w_full[outs]
    kept_cols, removed_cols = weight_columns(base_mod, consumer.kept), weight_columns(base_mod, consumer.removed)
    d = len(kept_cols) + int(with_bias)
    gram = torch.zeros(d, d, dtype=torch.float64)
    cross = torch.zeros(d, w_full.shape[0], dtype=torch.float64)
    base_sum = torch.zeros(w_full.shape[1], dtype=torch.float64)
    yy, n_rows = 0.0, 0
    generator = torch.Generator().manual_seed(seed)
    device = next(pruned.parameters()).device
    for index, start in enumerate(range(0, len(pixels), batch_size)):
        if captures is not None:
            x_base, y_base = captures[0](index)
            x_new = captures[1](index)
        else:
            batch = pixels[start : start + batch_size].to(device)
            x_base, y_base = _capture(baseline, consumer.name, batch)
            x_new, _ = _capture(pruned, consumer.name, batch)
        # products in float32, sums in float64: on ResNet-50's 4,608-column convolutions the float64 products were
        # most of the refit's time (the fast probe does the same)
        rows_base = _rows(base_mod, x_base).float().cpu()
        target = _targets(base_mod, y_base).float().cpu()[:, outs]
        rows_new = _rows(mod, x_new).float().cpu()
        if rows_new.shape[0] != target.shape[0] or rows_new.shape[1] != len(kept_cols):
            raise ReconstructError(f"{consumer.name}: pruned activations {tuple(rows_new.shape)} do not line up")
        pick = _sample(target.shape[0], max_rows, generator)
        if pick is not None:
            rows_base, target, rows_new = rows_base[pick], target[pick], rows_new[pick]
        if with_bias:
            rows_new = torch.cat([rows_new, torch.ones(rows_new.shape[0], 1, dtype=torch.float32)], 1)
        gram += (rows_new.T @ rows_new).double()
        cross += (rows_new.T @ target).double()
        base_sum += rows_base.double().sum(0)
        yy += float(target.double().pow(2).sum())
        n_rows += target.shape[0]
    if n_rows == 0:
        raise ReconstructError("no calibration images to reconstruct from")
    # the prior: the kept weights, with the removed inputs' mean contribution folded into the bias
    own_bias = (
        mod.bias.detach().double().cpu() if mod.bias is not None else torch.zeros(w_full.shape[0], dtype=torch.float64)
    )
    if sink == "batchnorm":  # the BatchNorm's running mean already absorbs any earlier shift: start from zero
        own_bias = torch.zeros(w_full.shape[0], dtype=torch.float64)
    current = mod.weight.detach().reshape(mod.weight.shape[0], -1).double().cpu().T
    folded = own_bias + w_full[:, removed_cols] @ (base_sum[removed_cols] / n_rows)
    prior = torch.cat([current, folded[None]]) if with_bias else current
    untouched = torch.cat([current, own_bias[None]]) if with_bias else current
    solved, before, after = ridge_refit(gram, cross, yy, prior, untouched, len(kept_cols), refit.ridge)
    _write(mod, solved, sink, sink_mod, len(kept_cols))
    return ConsumerFit(consumer.group, consumer.name, n_rows, round(before, 6), round(after, 6), sink)


def _write(mod: Layer, theta: torch.Tensor, sink: str, sink_mod: nn.Module | None, n_cols: int) -> None:
    """Copy a solved weight (and bias) back into the layer, in its dtype and device."""
    weight = mod.weight
    with torch.no_grad():
        weight.copy_(theta[:n_cols].T.reshape(weight.shape).to(weight.dtype))
        if sink == "bias":
            assert mod.bias is not None
            mod.bias.copy_(theta[n_cols].to(mod.bias.dtype))
        elif sink == "batchnorm":  # BN(y + b) with running mean m equals BN(y) with running mean m - b
            assert isinstance(sink_mod, nn.BatchNorm2d) and sink_mod.running_mean is not None
            mean = sink_mod.running_mean
            mean.copy_(mean - theta[n_cols].to(mean.dtype).to(mean.device))


class _Feed:
    """One model's cached block inputs, batch by batch, and its forward from a block on them (`blocks.started_at`)."""

    def __init__(
        self, model: nn.Module, blocks: list[str], arity: dict[str, int], pixels: torch.Tensor, batch_size: int
    ) -> None:
        self.model, self.blocks, self.arity = model, blocks, arity
        device = next(model.parameters()).device
        self.batches = [pixels[s : s + batch_size].to(device) for s in range(0, len(pixels), batch_size)]
        self.inputs: list[torch.Tensor] = []

    def run(self, index: int | None, batch: int, watch: dict[str, Hook], stop_at: str | None) -> torch.Tensor | None:
        """Run batch `batch` from block `index` (None: the whole model); return the input of `stop_at`, if given.

        `watch` maps module names to forward hooks; a hook may raise `Stop` to end the pass.
        """
        box: dict[str, torch.Tensor] = {}
        handles = [self.model.get_submodule(name).register_forward_hook(hook) for name, hook in watch.items()]
        if stop_at is not None:

            def pre(module: nn.Module, args: tuple) -> None:
                box["x"] = args[0].detach()
                raise Stop

            handles.append(self.model.get_submodule(stop_at).register_forward_pre_hook(pre))
        try:
            with contextlib.ExitStack() as stack:
                stack.enter_context(torch.inference_mode())
                if index is not None:
                    inject = stack.enter_context(started_at(self.model, self.blocks, index, self.arity))
                    inject.current = self.inputs[batch]
                forward_logits(self.model, self.batches[batch])
        except Stop:
            pass
        finally:
            for h in handles:
                h.remove()
        return box.get("x")

    def consumer_input(self, index: int, batch: int, name: str) -> torch.Tensor:
        """Return the input of module `name` (inside block `index`) on batch `batch`, from the cached block input."""
        box: dict[str, torch.Tensor] = {}
        self.run(index, batch, {name: _grab(box)}, None)
        return _grabbed(box, name)[0]

    def advance(self, index: int | None, to: str) -> None:
        """Replace the cached inputs by those of block `to`, running from block `index` (None: from the stem)."""
        self.inputs = [cast(torch.Tensor, self.run(index, b, {}, to)) for b in range(len(self.batches))]


def block_layout(baseline: nn.Module, consumers: list[Consumer]) -> tuple[list[str], list[int]] | None:
    """Return the model's blocks (family adapter, forward order) and each consumer's block.

    None when a consumer lies outside every block or the consumers are not in block order: the whole-model refit
    handles those.
    """
    try:
        groups = adapter_for(baseline).prunable_groups(baseline)
    except Exception:  # noqa: BLE001 - no adapter: the whole-model refit
        return None
    blocks = list(dict.fromkeys(g.block for g in groups if g.block))
    where = []
    for c in consumers:
        index = next((i for i, b in enumerate(blocks) if c.name.startswith(b + ".")), None)
        if index is None:
            return None
        where.append(index)
    return (blocks, where) if where == sorted(where) else None


def _refit_by_blocks(
    baseline: nn.Module,
    pruned: nn.Module,
    consumers: list[Consumer],
    pixels: torch.Tensor,
    layout: tuple[list[str], list[int]],
    *,
    refit: RefitSettings,
    seed: int,
    progress: Callable[[int, int, str], None] | None,
) -> list[ConsumerFit] | None:
    """Refit like the whole-model path, each consumer from its block's cached inputs (None: the layout cannot replay).

    The baseline runs once over the blocks; the pruned model runs each block once per consumer in it and once more
    to hand the next block its input, instead of both models running from the stem for every consumer.
    """
    blocks, where = layout
    used = sorted(set(where))
    checks = [replays(m, blocks, used, pixels[:1].to(next(m.parameters()).device)) for m in (baseline, pruned)]
    if not all(c["ok"] for c in checks):
        return None
    base = _Feed(baseline, blocks, checks[0]["arity"], pixels, refit.batch_size)
    new = _Feed(pruned, blocks, checks[1]["arity"], pixels, refit.batch_size)
    base.advance(None, blocks[used[0]])
    new.advance(None, blocks[used[0]])
    fits: list[ConsumerFit] = []
    for k, index in enumerate(used):
        mine = [(i, c) for i, c in enumerate(consumers) if where[i] == index]
        following = blocks[used[k + 1]] if k + 1 < len(used) else None
        seen: dict[str, list[tuple[torch.Tensor, torch.Tensor]]] = {c.name: [] for _, c in mine}

        def keep(name: str, store: dict[str, list[tuple[torch.Tensor, torch.Tensor]]] = seen) -> Hook:
            return lambda module, args, out: store[name].append((args[0].detach(), out.detach()))

        hooks = {c.name: keep(c.name) for _, c in mine}
        following_base = [base.run(index, b, hooks, following) for b in range(len(base.batches))]
        for i, consumer in mine:
            captures = (
                lambda b, name=consumer.name, store=seen: store[name][b],
                lambda b, name=consumer.name, at=index: new.consumer_input(at, b, name),
            )
            fits.append(
                _fit_one(
                    baseline,
                    pruned,
                    consumer,
                    pixels,
                    refit=refit,
                    seed=seed + i,
                    captures=captures,
                )
            )
            seen.pop(consumer.name)
            if progress is not None:
                progress(len(fits), len(consumers), consumer.name)
        if following is not None:
            base.inputs = [cast(torch.Tensor, x) for x in following_base]
            new.advance(index, following)
    return fits


def without_removed_blocks(baseline: nn.Module, applied: list[PrunedGroup]) -> nn.Module:
    """Return `baseline`, or a copy of it without the blocks `applied` removed (block rows, original names)."""
    blocks = [row.module for row in applied if row.kind == "block"]
    if not blocks:
        return baseline
    shallow = copy.deepcopy(baseline)
    adapter_for(shallow).drop_blocks(shallow, blocks)
    return shallow.eval()


def reconstruct(
    baseline: nn.Module,
    pruned: nn.Module,
    pixels: torch.Tensor,
    applied: Iterable[PrunedGroup],
    *,
    seed: int = 0,
    refit: RefitSettings = RefitSettings(),
    progress: Callable[[int, int, str], None] | None = None,
    by_blocks: bool = True,
) -> dict[str, Any]:
    """Refit, in place and in forward order, every layer of `pruned` that reads pruned channels.

    For each consumer (an MLP's second Linear, the attention output projection, the next convolution) the
    pruned model's activations at its input, X, are regressed on the baseline's outputs of that layer, Y, on the
    calibration images: minimize |[X 1] theta - Y|^2 + lam |theta - prior|^2, where the prior is the kept
    weights with the removed inputs' mean contribution folded into the bias, and lam = `ridge` times the mean
    diagonal of X'X. Consumers are fitted one after another, so each sees the already-refitted layers before
    it. A convolution without a bias hands its fitted bias to the BatchNorm right after it (its running mean).
    A fit that does not lower the error on its own rows keeps the pruned weights. No labels, no gradients.

    Args:
        baseline: The untouched model (the teacher); not changed. When `applied` removed whole blocks, the targets
            come from a copy without them (the width rows name its groups): depth is left to distillation.
        pruned: The pruned model; changed in place and left in eval mode.
        pixels: Calibration images (N, C, H, W).
        applied: `PruneReport.applied` rows, with `removed` unit indices.
        seed: Seed of the row sampling.
        refit: The ridge strength, images per forward pass and activation rows sampled per batch and consumer.
        progress: Called as progress(done, total, consumer name).
        by_blocks: Capture each consumer's activations from its block's cached inputs when the blocks replay
            exactly (`blocks.replays`): the fits of running both models from the stem, at a fraction of the forwards.

    Returns:
        {"consumers": [ConsumerFit as dict...], "seconds": float, "images": int, "by_blocks": bool}.

    Raises:
        ReconstructError: A consumer cannot be refitted.
    """
    started = time.perf_counter()
    baseline.eval()
    pruned.eval()
    rows = list(applied)
    baseline = without_removed_blocks(baseline, rows)
    consumers = find_consumers(baseline, pruned, [row for row in rows if row.kind != "block"])
    layout = block_layout(baseline, consumers) if by_blocks and consumers else None
    fits = None
    with tokens_unmerged(pruned):  # a merging student is refitted token by token against the baseline, unmerged
        if layout is not None:
            fits = _refit_by_blocks(
                baseline, pruned, consumers, pixels, layout, refit=refit, seed=seed, progress=progress
            )
        replayed = fits is not None
        if fits is None:
            fits = []
            for i, consumer in enumerate(consumers):
                fits.append(_fit_one(baseline, pruned, consumer, pixels, refit=refit, seed=seed + i))
                if progress is not None:
                    progress(i + 1, len(consumers), consumer.name)
    return {
        "consumers": [asdict(f) for f in fits],
        "seconds": round(time.perf_counter() - started, 3),
        "images": int(len(pixels)),
        "by_blocks": replayed,
    }
