"""Run a model from one of its blocks onward on cached block inputs, the blocks before it skipped.

A transformer layer or a residual block sees only the hidden state the previous block handed it. Work that changes
block k and later (a sensitivity probe of one group, the least-squares refit of the layers after a pruned one)
therefore needs the model's forward from block k on, fed the inputs block k saw: the blocks before it are swapped
for pass-throughs, block k for a wrapper that runs it on the cached input, and the model's own forward supplies
every other argument (masks, positions, the head). Whether a model can be replayed this way is checked by
`replays`, against the model's own logits; a layout that cannot (a stage whose downsampling reads the skipped
blocks' output shape) fails the check.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import nn

from profiling_agent.tools.runtimes.forward import forward_logits

REPLAY_TOLERANCE = 1e-4  # largest |logit gap| / (1 + max |logit|) of a replay from a block against the model


class PassBlock(nn.Module):
    """Stands in for a skipped block: returns its input (the next block's input is injected)."""

    def __init__(self, arity: int) -> None:
        """`arity`: 0 when the block returns a tensor, else the length of the tuple it returns."""
        super().__init__()
        self.arity = int(arity)

    def forward(self, hidden: Any, *args: Any, **kwargs: Any) -> Any:
        """Return the hidden state unchanged, shaped as the skipped block's output (the rest of a tuple None)."""
        return (hidden, *[None] * (self.arity - 1)) if self.arity else hidden


class InjectBlock(nn.Module):
    """Runs a block on a cached input (`current`), ignoring the hidden state the skipped blocks hand it."""

    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        self.block = block
        self.current: torch.Tensor | None = None

    def forward(self, hidden: Any, *args: Any, **kwargs: Any) -> Any:
        """Run the block on `current` with the arguments the model passes it."""
        return self.block(self.current, *args, **kwargs)


class Stop(Exception):
    """Raised by a hook to end a forward pass once it has what it came for."""


def swap_module(model: nn.Module, name: str, module: nn.Module) -> nn.Module:
    """Put `module` at `name` in `model` and return what was there."""
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    old = parent.get_submodule(child)
    setattr(parent, child, module)
    return old


@contextlib.contextmanager
def started_at(
    model: nn.Module, blocks: Sequence[str], index: int, arity: dict[str, int], block: nn.Module | None = None
) -> Iterator[InjectBlock]:
    """Make `model`'s forward start at `blocks[index]` (or `block` in its place); set the yielded `.current`.

    The model's blocks are put back on exit.
    """
    inject = InjectBlock(block if block is not None else model.get_submodule(blocks[index]))
    saved = {name: swap_module(model, name, PassBlock(arity[name])) for name in blocks[:index]}
    saved[blocks[index]] = swap_module(model, blocks[index], inject)
    try:
        yield inject
    finally:
        for name, module in saved.items():
            swap_module(model, name, module)


def block_inputs(model: nn.Module, blocks: Sequence[str], pixels: torch.Tensor) -> tuple[dict[str, Any], torch.Tensor]:
    """Run `model` once on `pixels`; return each block's input and output arity (`PassBlock`), and the logits."""
    seen: dict[str, Any] = {"inputs": {}, "arity": {}}
    handles = []
    for name in blocks:
        module = model.get_submodule(name)

        def pre(module: nn.Module, args: tuple, name: str = name) -> None:
            seen["inputs"][name] = args[0].detach()

        def post(module: nn.Module, args: tuple, out: Any, name: str = name) -> None:
            seen["arity"][name] = len(out) if isinstance(out, tuple) else 0

        handles += [module.register_forward_pre_hook(pre), module.register_forward_hook(post)]
    try:
        with torch.inference_mode():
            logits = forward_logits(model, pixels)
    finally:
        for h in handles:
            h.remove()
    return seen, logits


def replays(model: nn.Module, blocks: Sequence[str], indices: Sequence[int], example: torch.Tensor) -> dict[str, Any]:
    """Check that `model` replayed from each of `indices` gives its own logits on `example` (one image or a few).

    Returns:
        {"ok": bool, "arity": {block: tuple length, 0 for a tensor}, "gap": the largest relative logit gap,
        "block": the first failing block or None}.
    """
    seen, logits = block_inputs(model, blocks, example)
    scale = 1.0 + float(logits.abs().max())
    worst, failing = 0.0, None
    for index in indices:
        name = blocks[index]
        if name not in seen["inputs"] or name not in seen["arity"]:
            return {"ok": False, "arity": seen["arity"], "gap": float("inf"), "block": name}
        if any(b not in seen["arity"] for b in blocks[:index]):
            return {"ok": False, "arity": seen["arity"], "gap": float("inf"), "block": name}
        try:
            with started_at(model, blocks, index, seen["arity"]) as inject, torch.inference_mode():
                inject.current = seen["inputs"][name]
                gap = float((forward_logits(model, example) - logits).abs().max()) / scale
        except Exception:  # noqa: BLE001 - a layout that cannot be replayed (shapes the skipped blocks set)
            gap = float("inf")
        if gap > worst:
            worst = gap
        if gap > REPLAY_TOLERANCE and failing is None:
            failing = name
    return {"ok": failing is None, "arity": seen["arity"], "gap": worst, "block": failing}
