"""Depth pruning: remove whole blocks from a model's block stacks (ModuleList or Sequential) and renumber the rest.

A transformer layer or a residual block with an identity shortcut computes `x + f(x)`; removing it leaves the
hidden state as it was, so the model stays valid and its later blocks keep their weights. The stack is rebuilt
without the removed blocks, so module names are renumbered (the block that was `layers.3` may become `layers.2`)
and the config's depth field says the new count: the saved model rebuilds from its config like any other.

A block whose shortcut is a projection (a ResNet stage's first block changes width or stride) cannot simply go; it
is replaced by a `ShortcutBlock`: its projection shortcut and output activation, the residual branch gone. The
module keeps its name and the shortcut's weights keep theirs; a saved artifact records the replaced blocks
(`tools/models/shortcut.py`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from torch import nn

from profiling_agent.tools.models.shortcut import SHORTCUT

MAX_BLOCK_FRACTION = 0.5  # the planners' and the guard's default: at most half of a stack's blocks go (one stays)


def fields_of(group: Any) -> Mapping[str, Any]:
    """Return a group's fields: a PrunableGroup's attributes, or the dict a profile holds."""
    return group if isinstance(group, Mapping) else vars(group)


def replaces(group: Any) -> bool:
    """Return True for a block group whose block is replaced by its shortcut rather than removed."""
    return (fields_of(group).get("extra") or {}).get("replace") == SHORTCUT


def limit_key(group: Any) -> str:
    """Return what a block group's removal is limited within: its stack, or itself when it is replaced."""
    module = str(fields_of(group)["module"])
    return module if replaces(group) else stack_of(module)


def drop_from_stack(model: nn.Module, stack: str, indices: Iterable[int], keep_at_least: int = 1) -> dict[str, str]:
    """Remove the children at `indices` of the ModuleList or Sequential `stack` and renumber the others.

    Args:
        model: The model, changed in place.
        stack: Module name of the container, e.g. "vit.layers".
        indices: Child positions to remove.
        keep_at_least: Children that must remain.

    Returns:
        {old child name: new child name} for every child kept, as full module names.

    Raises:
        ValueError: An index is out of range, or fewer than `keep_at_least` children would remain.
    """
    container = model.get_submodule(stack)
    if not isinstance(container, (nn.ModuleList, nn.Sequential)):
        raise ValueError(f"{stack} is a {type(container).__name__}, not a ModuleList or Sequential")
    children = list(container)
    drop = set(indices)
    if not drop <= set(range(len(children))):
        raise ValueError(f"{stack} has {len(children)} blocks; cannot remove {sorted(drop)}")
    kept = [i for i in range(len(children)) if i not in drop]
    if len(kept) < keep_at_least:
        raise ValueError(
            f"removing {len(drop)} of the {len(children)} blocks of {stack} leaves fewer than {keep_at_least}"
        )
    chosen = [children[i] for i in kept]
    rebuilt = nn.Sequential(*chosen) if isinstance(container, nn.Sequential) else nn.ModuleList(chosen)
    parent_name, _, child = stack.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, child, rebuilt)
    return {f"{stack}.{old}": f"{stack}.{new}" for new, old in enumerate(kept)}


def split_block_name(name: str) -> tuple[str, int]:
    """Split a block's module name into its stack and position ("vit.layers.3" -> ("vit.layers", 3)).

    Raises:
        ValueError: The name does not end in a position.
    """
    stack, _, index = name.rpartition(".")
    if not stack or not index.isdigit():
        raise ValueError(f"{name!r} does not name a block in a stack")
    return stack, int(index)


def group_by_stack(blocks: Iterable[str]) -> dict[str, list[int]]:
    """Group block names by their stack: {stack: [positions]}."""
    out: dict[str, list[int]] = {}
    for name in blocks:
        stack, index = split_block_name(name)
        out.setdefault(stack, []).append(index)
    return out


def drop_stage_blocks(model: nn.Module, blocks: list[str], allowed: set[str], only: str) -> dict[str, str]:
    """Remove `blocks` from staged stacks ("<...>.<stage>.<blocks>.<i>") and lower `model.config.depths` to match.

    Args:
        model: A ResNet- or Swin-shaped model whose config has per-stage `depths`; changed in place.
        blocks: Block module names to remove.
        allowed: The names that may go (the adapter's block groups).
        only: What may go, for the error ("only the last block of a Swin stage").

    Returns:
        {old block name: new name} of the blocks kept in the stacks that changed.

    Raises:
        ValueError: A name is not in `allowed`.
    """
    wrong = sorted(set(blocks) - allowed)
    if wrong:
        raise ValueError(f"cannot remove {wrong[0]}: {only}")
    config: Any = model.config
    depths = list(config.depths)
    renamed: dict[str, str] = {}
    for stack, indices in group_by_stack(blocks).items():
        renamed.update(drop_from_stack(model, stack, indices))
        depths[int(stack.split(".")[-2])] -= len(set(indices))
    config.depths = depths
    return renamed


def stack_of(block: str) -> str:
    """Return the stack a block belongs to: its module name without the position ("vit.layers.3" -> "vit.layers")."""
    return block.rpartition(".")[0]


def block_limits(groups: Iterable[Any], fraction: float) -> dict[str, int]:
    """Return how many blocks of each stack a plan may remove, keyed by `limit_key`.

    At most `fraction` of the stack's blocks (all of them, removable or not: a block group's `extra["stack_blocks"]`),
    never all of them, and never more than its removable ones. A block replaced by its shortcut leaves a layer in
    its stack, so it is limited on its own (key: its module; 1). Groups are PrunableGroups or their dicts.

    Returns:
        {stack or replaced block: blocks that may go}, for every block group.
    """
    removable: dict[str, int] = {}
    total: dict[str, int] = {}
    out = {}
    for group in groups:
        fields = fields_of(group)
        if fields.get("kind") != "block":
            continue
        if replaces(group):
            out[limit_key(group)] = 1
            continue
        stack = stack_of(str(fields["module"]))
        removable[stack] = removable.get(stack, 0) + 1
        total[stack] = max(total.get(stack, 0), int((fields.get("extra") or {}).get("stack_blocks", 0)))
    for stack, n in removable.items():
        size = max(total[stack], n)
        out[stack] = max(0, min(n, size - 1, math.floor(size * fraction + 1e-9)))
    return out
