"""Family adapter for transformers 5 ResNetForImageClassification (bottleneck and basic blocks)."""

from __future__ import annotations

import dataclasses
from typing import Any

from torch import nn
from transformers.models.resnet.modeling_resnet import ResNetModel

from profiling_agent.tools.compression.depth import drop_stage_blocks, replaces
from profiling_agent.tools.compression.families.base import FamilyAdapter, PrunableGroup, block_group
from profiling_agent.tools.models.shortcut import SHORTCUT, ShortcutBlock, replace_with_shortcut, replaced_blocks


class ResNetAdapter(FamilyAdapter):
    """Prune the convs inside each residual block whose output does not feed the residual add.

    Bottleneck blocks expose conv1 (1x1 reduce) and conv2 (3x3); basic blocks expose conv1. The block's last
    conv, its shortcut and every stage width stay intact, so the residual adds never change shape. A group's
    members are its conv, that conv's BatchNorm and the next conv (whose input channels shrink).
    """

    name = "resnet"

    def matches(self, model: nn.Module) -> bool:
        """Return True for a ResNetModel backbone under `.resnet` with a `.classifier` head."""
        return isinstance(getattr(model, "resnet", None), ResNetModel) and hasattr(model, "classifier")

    def _blocks(self, model: nn.Module) -> list[tuple[str, str, Any]]:
        """Return (short name, module name, block) for every residual block in forward order.

        A block already replaced by its shortcut (`ShortcutBlock`) is not listed: nothing in it can be pruned.
        """
        blocks = []
        resnet: Any = model.resnet  # a transformers ResNetModel: its submodules are attributes mypy cannot see
        for s, stage in enumerate(resnet.encoder.stages):
            for b, block in enumerate(stage.layers):
                if not isinstance(block, ShortcutBlock):
                    blocks.append((f"stages.{s}.layers.{b}", f"resnet.encoder.stages.{s}.layers.{b}", block))
        return blocks

    def prunable_groups(self, model: nn.Module) -> list[PrunableGroup]:
        """List conv1 (and conv2 for bottlenecks) of every block, skipping grouped convs."""
        groups: list[PrunableGroup] = []
        for short, full, block in self._blocks(model):
            convs = block.layer
            for j in range(len(convs) - 1):
                conv = convs[j].convolution
                if conv.groups != 1 or convs[j + 1].convolution.groups != 1:
                    continue  # grouped/depthwise convs couple channels across layers; leave them alone
                groups.append(
                    PrunableGroup(
                        name=f"{short}.conv{j + 1}",
                        kind="structured",
                        module=f"{full}.layer.{j}.convolution",
                        roots=(f"{full}.layer.{j}.convolution",),
                        members=(
                            f"{full}.layer.{j}.convolution",
                            f"{full}.layer.{j}.normalization",
                            f"{full}.layer.{j + 1}.convolution",
                        ),
                        units=conv.out_channels,
                        block=full,
                    )
                )
        return groups

    def block_groups(self, model: nn.Module) -> list[PrunableGroup]:
        """List the blocks depth pruning may take out, in forward order.

        A block after the first of its stage (same width, stride 1, identity shortcut) is removed. A block with a
        projection shortcut (a stage's first, which changes width or stride) is replaced by that shortcut
        (`ShortcutBlock`): its group owns only the residual branch (`<block>.layer`), the cost that goes.
        """
        groups = []
        for short, full, block in self._blocks(model):
            stage = model.get_submodule(full.rpartition(".")[0])  # the stage's Sequential of blocks
            size = len(list(stage.children()))
            if isinstance(block.shortcut, nn.Identity):
                if not short.endswith(".layers.0"):
                    groups.append(block_group(f"{short}.block", full, size))
                continue
            group = block_group(f"{short}.block", full, size)
            groups.append(
                dataclasses.replace(group, members=(f"{full}.layer",), extra={**group.extra, "replace": SHORTCUT})
            )
        return groups

    def drop_blocks(self, model: nn.Module, blocks: list[str]) -> dict[str, str]:
        """Replace the named projection blocks by their shortcuts, remove the others and lower `depths` to match.

        Returns:
            {old block name: new name} of the blocks kept in stacks that lost blocks (a replaced block keeps its
            name).
        """
        groups = {g.module: g for g in self.block_groups(model)}
        swap = [b for b in blocks if b in groups and replaces(groups[b])]
        allowed = {m for m, g in groups.items() if not replaces(g)}
        renamed = drop_stage_blocks(
            model,
            [b for b in blocks if b not in swap],
            allowed,
            "only blocks after a stage's first with identity shortcuts go; a stage's first is replaced by its shortcut",
        )
        replace_with_shortcut(model, [renamed.get(b, b) for b in swap])
        return renamed

    def protected_modules(self, model: nn.Module) -> list[str]:
        """Name the embedder, every shortcut, every block's last conv layer and the classifier."""
        names = ["resnet.embedder", *[f"{name}.shortcut" for name in replaced_blocks(model)]]
        for _, full, block in self._blocks(model):
            names.append(f"{full}.shortcut")
            names.append(f"{full}.layer.{len(block.layer) - 1}")
        names.append("classifier")
        return names
