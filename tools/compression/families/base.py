"""The family-adapter contract: what can be pruned in a model family and how to repair it afterwards."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from torch import nn

GroupKind = Literal["structured", "head", "block"]


@dataclass(frozen=True)
class PrunableGroup:
    """One unit of structured pruning that a plan entry can target.

    A group removes `units` of its `roots`' output channels at the same indices (one unit is `unit_size`
    consecutive channels: 1 for conv/MLP channels, head_dim for an attention head whose q, k and v
    projections are all roots). torch-pruning's DependencyGraph propagates each root's pruning to the
    layers that consume it (BatchNorm, the next conv's or Linear's input channels, o_proj's inputs).

    Attributes:
        name: Short stable id, unique in the model, e.g. "layers.3.mlp", "layers.3.heads",
            "stages.2.layers.1.conv1".
        kind: "structured" (channels), "head" (whole attention heads) or "block" (the whole block: one unit,
            `min_units` 0, removed by the adapter's `drop_blocks`, never by the dependency graph).
        module: Module name that plan regexes are searched in (re.search): the MLP's first Linear, the
            attention module for heads, the conv for a ResNet group.
        roots: Module names whose output channels are pruned together at the same indices.
        members: Module names whose cost (MACs, params, latency) shrinks with this group; the profiler
            sums their costs to get the group's cost share.
        units: Prunable units right now (channels, or heads).
        unit_size: Channels per unit (1, or head_dim).
        min_units: Units that always remain (at least 1; 0 only for a block group, removed whole).
        block: Name of the enclosing block (transformer layer or residual block), for reports.
    """

    name: str
    kind: GroupKind
    module: str
    roots: tuple[str, ...]
    members: tuple[str, ...]
    units: int
    unit_size: int = 1
    min_units: int = 1
    block: str = ""
    extra: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)


def mlp_group(name: str, block: str, units: int) -> PrunableGroup:
    """Describe the MLP intermediate channels of one transformer block: `block`.mlp.fc1 outputs, fc2 inputs.

    Args:
        name: The group's stable id, e.g. "layers.3.mlp".
        block: The block's module name (the MLP is its `mlp` child with `fc1` and `fc2`).
        units: fc1's output channels now.
    """
    fc1, fc2 = f"{block}.mlp.fc1", f"{block}.mlp.fc2"
    return PrunableGroup(
        name=name, kind="structured", module=fc1, roots=(fc1,), members=(fc1, fc2), units=units, block=block
    )


def head_group(
    name: str, block: str, heads: int, head_dim: int, shrinking: tuple[str, ...] = (), per_head: tuple[str, ...] = ()
) -> PrunableGroup:
    """Describe the whole attention heads of one block: `block`.attention's q/k/v outputs and o_proj inputs.

    Args:
        name: The group's stable id, e.g. "layers.3.heads".
        block: The block's module name (the attention is its `attention` child with q/k/v/o_proj).
        heads: Heads now.
        head_dim: Channels per head.
        shrinking: Further attention children whose cost shrinks with the heads (members, not roots).
        per_head: Attention parameters holding per-head tensors that are not root channels (Swin's bias
            table): pruned by the adapter's before_head_prune, never by the graph.
    """
    attn = f"{block}.attention"
    q, k, v, o = (f"{attn}.{p}" for p in ("q_proj", "k_proj", "v_proj", "o_proj"))
    extra: dict[str, Any] = {"head_dim": head_dim}
    if per_head:
        extra["per_head_params"] = [f"{attn}.{param}" for param in per_head]
    members = (q, k, v, o, *(f"{attn}.{child}" for child in shrinking))
    return PrunableGroup(
        name=name,
        kind="head",
        module=attn,
        roots=(q, k, v),
        members=members,
        units=heads,
        unit_size=head_dim,
        block=block,
        extra=extra,
    )


def block_group(name: str, block: str, stack_blocks: int) -> PrunableGroup:
    """Describe a whole residual block that depth pruning may remove: one unit, none required to stay.

    Args:
        name: The group's stable id, e.g. "layers.3.block".
        block: The block's module name; the block and everything under it is the group's cost.
        stack_blocks: Blocks in its stack, removable or not (what `depth.block_limits` takes a fraction of).
    """
    return PrunableGroup(
        name=name,
        kind="block",
        module=block,
        roots=(),
        members=(block,),
        units=1,
        min_units=0,
        block=block,
        extra={"stack_blocks": stack_blocks},
    )


class FamilyAdapter:
    """Base class of a family adapter; subclasses override what differs.

    Subclasses set `name` and implement `matches`, `prunable_groups` and `protected_modules`; the pruning
    engine calls `before_head_prune` with the head indices it is about to remove (for per-head tensors that
    are not channels of a root, e.g. Swin's relative-position bias table) and `fix_up` once after all
    groups are pruned (head counts, cached sizes, config fields). `fix_up` returns the attributes it set,
    as {module_name: {attr: value}}, so a saved artifact can set them again when it is rebuilt.
    """

    name: str = "base"
    safe: bool = True  # False: generic fallback, used with a warning

    def matches(self, model: nn.Module) -> bool:
        """Return True when this adapter handles `model`."""
        raise NotImplementedError

    def prunable_groups(self, model: nn.Module) -> list[PrunableGroup]:
        """List the model's prunable groups in forward order, with their current sizes."""
        raise NotImplementedError

    def protected_modules(self, model: nn.Module) -> list[str]:
        """Name the modules that must never be pruned (classifier heads, embeddings, patch merging...)."""
        raise NotImplementedError

    def block_groups(self, model: nn.Module) -> list[PrunableGroup]:
        """List the blocks depth pruning may remove (kind "block", forward order); the default has none."""
        return []

    def drop_blocks(self, model: nn.Module, blocks: list[str]) -> dict[str, str]:
        """Remove the named blocks in place, update the config, and return {old block name: new name} of the rest.

        Raises:
            ValueError: The family cannot remove blocks, a name is not one of `block_groups`, or every block of
                a stack would go.
        """
        raise ValueError(f"the {self.name} family cannot remove whole blocks")

    def before_head_prune(self, model: nn.Module, group: PrunableGroup, head_idxs: list[int]) -> None:
        """Prune per-head tensors that are not root channels; the default has none."""

    def fix_up(self, model: nn.Module) -> dict[str, dict[str, Any]]:
        """Repair cached sizes after pruning and return the attributes set, by module name."""
        return {}
