"""A residual block replaced by its projection shortcut: the model surgery depth pruning does and an artifact redoes.

A block whose shortcut is a projection (a ResNet stage's first block changes width or stride) cannot simply be
removed; `tools/compression/depth.py` replaces it by a `ShortcutBlock` (its shortcut and output activation, the
residual branch gone). The module keeps its name and the shortcut's parameters keep theirs, so a saved artifact
only records which blocks were replaced (`replaced_blocks`) and the loader replaces them again.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

SHORTCUT = "shortcut"  # a block group's extra["replace"] when the block is replaced by its shortcut, not removed


class ShortcutBlock(nn.Module):
    """A residual block with its residual branch removed: `activation(shortcut(x))`.

    Built from the block it replaces (any module with `shortcut` and `activation` children, as transformers'
    ResNet bottleneck and basic layers have); the children are the block's own, so their parameter names stay.
    """

    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        self.shortcut: nn.Module = block.get_submodule("shortcut")
        self.activation: nn.Module = block.get_submodule("activation")

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """Return what the block computes when its residual branch outputs zero."""
        return self.activation(self.shortcut(hidden))


def replace_with_shortcut(model: nn.Module, blocks: Iterable[str]) -> None:
    """Replace each named block of `model` by its `ShortcutBlock` in place.

    Raises:
        ValueError: A name is not a block with a projection shortcut and an activation.
    """
    for name in blocks:
        block = model.get_submodule(name)
        shortcut = getattr(block, "shortcut", None)
        if shortcut is None or isinstance(shortcut, nn.Identity) or not hasattr(block, "activation"):
            raise ValueError(f"{name} has no projection shortcut to replace it by")
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, ShortcutBlock(block))


def replaced_blocks(model: nn.Module) -> list[str]:
    """Name the blocks of `model` that are `ShortcutBlock`s (what a saved artifact records to rebuild it)."""
    return [name for name, module in model.named_modules() if isinstance(module, ShortcutBlock)]
