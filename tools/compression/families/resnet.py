"""Family adapter for transformers 5 ResNetForImageClassification (bottleneck and basic blocks)."""

from __future__ import annotations

from typing import Any

from torch import nn
from transformers.models.resnet.modeling_resnet import ResNetModel

from profiling_agent.tools.compression.depth import drop_stage_blocks
from profiling_agent.tools.compression.families.base import FamilyAdapter, PrunableGroup, block_group


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
        """Return (short name, module name, block) for every residual block in forward order."""
        blocks = []
        resnet: Any = model.resnet  # a transformers ResNetModel: its submodules are attributes mypy cannot see
        for s, stage in enumerate(resnet.encoder.stages):
            for b, block in enumerate(stage.layers):
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
        """List every block after the first of its stage (same width, stride 1, identity shortcut) as removable."""
        groups = []
        for short, full, block in self._blocks(model):
            if not short.endswith(".layers.0") and isinstance(block.shortcut, nn.Identity):
                stage = model.get_submodule(full.rpartition(".")[0])  # the stage's Sequential of blocks
                groups.append(block_group(f"{short}.block", full, len(list(stage.children()))))
        return groups

    def drop_blocks(self, model: nn.Module, blocks: list[str]) -> dict[str, str]:
        """Remove the named blocks (never a stage's first) and lower the config's `depths` to match."""
        allowed = {g.module for g in self.block_groups(model)}
        return drop_stage_blocks(model, blocks, allowed, "only blocks after a stage's first, with identity shortcuts")

    def protected_modules(self, model: nn.Module) -> list[str]:
        """Name the embedder, every shortcut, every block's last conv layer and the classifier."""
        names = ["resnet.embedder"]
        for _, full, block in self._blocks(model):
            names.append(f"{full}.shortcut")
            names.append(f"{full}.layer.{len(block.layer) - 1}")
        names.append("classifier")
        return names
