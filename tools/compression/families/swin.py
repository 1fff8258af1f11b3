"""Family adapter for Swin image classifiers: MLP channels and whole window-attention heads per block."""

from __future__ import annotations

import logging
import re
from typing import Any

import torch
from torch import nn
from transformers.models.swin.modeling_swin import (
    SwinAttention,
    SwinForImageClassification,
    SwinLayer,
    SwinPatchMerging,
)

from profiling_agent.tools.compression.depth import drop_stage_blocks
from profiling_agent.tools.compression.families.base import (
    FamilyAdapter,
    PrunableGroup,
    block_group,
    head_group,
    mlp_group,
)
from profiling_agent.tools.compression.families.deit import fix_attention

logger = logging.getLogger(__name__)

_BLOCK_PATH = re.compile(r"layers\.(\d+)\.blocks\.(\d+)$")
BIAS_TABLE = "relative_position_bias.relative_position_bias_table"
_PROTECTED_LEAVES = ("embeddings", "classifier", "relative_position_bias")


def _blocks(model: nn.Module) -> list[tuple[str, int, int, SwinLayer]]:
    """Return (name, stage, block, module) for every Swin block, in forward order."""
    found = []
    for name, module in model.named_modules():
        match = _BLOCK_PATH.search(name)
        if isinstance(module, SwinLayer) and match:
            found.append((name, int(match[1]), int(match[2]), module))
    return found


def _keep_heads(heads: int, head_idxs: list[int], where: str) -> list[int]:
    """Return the head indices kept after removing `head_idxs` from `heads`, checking the request."""
    removed = set(head_idxs)
    if len(removed) != len(head_idxs) or not removed <= set(range(heads)):
        raise ValueError(f"{where}: invalid head indices {head_idxs} for {heads} heads")
    if len(removed) >= heads:
        raise ValueError(f"{where}: cannot remove all {heads} heads")
    return [h for h in range(heads) if h not in removed]


def _table(attention: SwinAttention) -> nn.Parameter:
    """Return the relative-position bias table, shape ((2w-1)^2, heads)."""
    return attention.relative_position_bias.relative_position_bias_table


class SwinAdapter(FamilyAdapter):
    """Prune Swin MLP channels and whole heads inside each block; patch merging and hidden sizes never change.

    The config keeps the unpruned sizes (head counts and MLP widths may now differ per layer); the pruned
    sizes live in the weight shapes and in the attributes `fix_up` returns.
    """

    name = "swin"

    def matches(self, model: nn.Module) -> bool:
        """Return True for SwinForImageClassification."""
        return isinstance(model, SwinForImageClassification)

    def prunable_groups(self, model: nn.Module) -> list[PrunableGroup]:
        """List per block the head group, then the MLP group, in forward order."""
        groups = []
        for prefix, stage, block, layer in _blocks(model):
            hd, name = layer.attention.head_dim, f"stages.{stage}.blocks.{block}.heads"
            heads = layer.attention.q_proj.out_features // hd
            groups.append(head_group(name, prefix, heads, hd, ("relative_position_bias",), (BIAS_TABLE,)))
            groups.append(mlp_group(f"stages.{stage}.blocks.{block}.mlp", prefix, layer.mlp.fc1.out_features))
        return groups

    def block_groups(self, model: nn.Module) -> list[PrunableGroup]:
        """List the last block of every stage of two or more blocks as removable.

        A stage's blocks alternate plain and shifted windows by position; removing the last keeps that pattern for
        the others, so the shallower stage is what its config (`depths`) builds.
        """
        stages: dict[int, list[tuple[str, int]]] = {}
        for prefix, stage, block, _ in _blocks(model):
            stages.setdefault(stage, []).append((prefix, block))
        groups = []
        for stage, blocks in sorted(stages.items()):
            if len(blocks) >= 2:
                prefix, block = blocks[-1]
                groups.append(block_group(f"stages.{stage}.blocks.{block}.block", prefix, len(blocks)))
        return groups

    def drop_blocks(self, model: nn.Module, blocks: list[str]) -> dict[str, str]:
        """Remove the named blocks (each the last of its stage) and lower the config's `depths` to match."""
        allowed = {g.module for g in self.block_groups(model)}
        return drop_stage_blocks(model, blocks, allowed, "only the last block of a Swin stage (two or more blocks)")

    def protected_modules(self, model: nn.Module) -> list[str]:
        """Name the patch embeddings, every patch merging (reduction and norm), LayerNorm, bias table and classifier."""
        merging = [name for name, module in model.named_modules() if isinstance(module, SwinPatchMerging)]
        names = []
        for name, module in model.named_modules():
            in_merging = any(name == m or name.startswith(f"{m}.") for m in merging)
            named = name.rsplit(".", 1)[-1] in _PROTECTED_LEAVES or "patch_embeddings" in name
            if in_merging or named or isinstance(module, nn.LayerNorm):
                names.append(name)
        return names

    def before_head_prune(self, model: nn.Module, group: PrunableGroup, head_idxs: list[int]) -> None:
        """Remove the columns of `head_idxs` from the group's relative-position bias table, in place."""
        attention = model.get_submodule(group.module)
        if not isinstance(attention, SwinAttention):
            raise TypeError(f"{group.module} is {type(attention).__name__}, not SwinAttention")
        table = _table(attention)
        keep = _keep_heads(table.shape[1], list(head_idxs), group.module)
        with torch.no_grad():
            # Assign .data so the Parameter object (which a built DependencyGraph may reference) stays the same.
            table.data = table.data[:, keep].clone()
        logger.debug("%s: bias table heads %d -> %d", group.module, len(keep) + len(head_idxs), len(keep))

    def fix_up(self, model: nn.Module) -> dict[str, dict[str, Any]]:
        """Set every window attention's head count, check its bias table, and return what was set."""
        fixed = {}
        for name, module in model.named_modules():
            if not isinstance(module, SwinAttention):
                continue
            fixed[name] = fix_attention(name, module)
            columns = _table(module).shape[1]
            if columns != fixed[name]["num_attention_heads"]:
                raise ValueError(
                    f"{name}: bias table has {columns} head columns but q/k/v hold "
                    f"{fixed[name]['num_attention_heads']} heads (before_head_prune not called?)"
                )
        logger.debug("swin fix_up: %s", fixed)
        return fixed
