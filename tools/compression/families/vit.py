"""Family adapter for transformers 5 ViTForImageClassification: MLP channels and whole attention heads."""

from __future__ import annotations

from typing import Any

from torch import nn
from transformers.models.vit.modeling_vit import ViTModel

from profiling_agent.tools.compression.depth import drop_from_stack, group_by_stack
from profiling_agent.tools.compression.families.base import (
    FamilyAdapter,
    PrunableGroup,
    block_group,
    head_group,
    mlp_group,
)


def attention_heads(attention: nn.Module) -> int:
    """Count the heads an attention module really has, from q_proj's width and the fixed head_dim.

    Raises:
        ValueError: If q_proj's width is not a whole number of heads.
    """
    attn: Any = attention  # transformers sets q_proj and head_dim in __init__: plain attributes mypy cannot see
    width, head_dim = int(attn.q_proj.out_features), int(attn.head_dim)
    if width % head_dim:
        raise ValueError(f"q_proj width {width} is not a multiple of head_dim {head_dim}")
    return width // head_dim


class ViTAdapter(FamilyAdapter):
    """Prune ViT layers inside their blocks: MLP intermediate channels and whole heads; hidden size never changes.

    In transformers 5 `ViTAttention.forward` reshapes q/k/v with `view(..., -1, head_dim)`, uses the `scaling`
    cached from head_dim and reshapes the output with `reshape(..., -1)`; removing whole heads keeps head_dim, so
    only the `num_attention_heads` attribute goes stale and `fix_up` resets it.
    """

    name = "vit"
    backbone_attr = "vit"  # subclasses for ViT-shaped families (e.g. DeiT) can point this elsewhere

    def _backbone(self, model: nn.Module) -> Any:
        """Return the ViT-shaped backbone (typed Any: its layers are transformers attributes mypy cannot see)."""
        return getattr(model, self.backbone_attr)

    def matches(self, model: nn.Module) -> bool:
        """Return True for a ViTModel backbone under `.vit` with a `.classifier` head."""
        return isinstance(getattr(model, "vit", None), ViTModel) and hasattr(model, "classifier")

    def prunable_groups(self, model: nn.Module) -> list[PrunableGroup]:
        """List, per layer, the heads group then the MLP group, with their live sizes."""
        groups: list[PrunableGroup] = []
        for i, layer in enumerate(self._backbone(model).layers):
            block = f"{self.backbone_attr}.layers.{i}"
            heads, hd = attention_heads(layer.attention), layer.attention.head_dim
            groups.append(head_group(f"layers.{i}.heads", block, heads, hd))
            groups.append(mlp_group(f"layers.{i}.mlp", block, layer.mlp.fc1.out_features))
        return groups

    def block_groups(self, model: nn.Module) -> list[PrunableGroup]:
        """List every transformer layer as a removable block (a model with one layer has none)."""
        layers = self._backbone(model).layers
        if len(layers) < 2:
            return []
        return [
            block_group(f"layers.{i}.block", f"{self.backbone_attr}.layers.{i}", len(layers))
            for i in range(len(layers))
        ]

    def drop_blocks(self, model: nn.Module, blocks: list[str]) -> dict[str, str]:
        """Remove the named layers (at least one stays) and set `num_hidden_layers` to the count left."""
        return drop_layers(model, self._backbone(model), f"{self.backbone_attr}.layers", blocks)

    def protected_modules(self, model: nn.Module) -> list[str]:
        """Name the embeddings, final layernorm, pooler, classifier and every LayerNorm."""
        prefix = self.backbone_attr
        backbone = self._backbone(model)
        names = [f"{prefix}.embeddings", f"{prefix}.layernorm", "classifier"]
        if getattr(backbone, "pooler", None) is not None:
            names.append(f"{prefix}.pooler")
        names += [name for name, module in model.named_modules() if isinstance(module, nn.LayerNorm)]
        return list(dict.fromkeys(names))

    def fix_up(self, model: nn.Module) -> dict[str, dict[str, Any]]:
        """Set each attention module's `num_attention_heads` to its live head count and return what was set."""
        attrs: dict[str, dict[str, Any]] = {}
        for i, layer in enumerate(self._backbone(model).layers):
            heads = attention_heads(layer.attention)
            layer.attention.num_attention_heads = heads
            attrs[f"{self.backbone_attr}.layers.{i}.attention"] = {"num_attention_heads": heads}
        return attrs


def drop_layers(model: nn.Module, backbone: Any, stack: str, blocks: list[str]) -> dict[str, str]:
    """Remove `blocks` from a ViT-shaped backbone's layer list `stack` and update `num_hidden_layers`.

    Raises:
        ValueError: A name is not a layer of `stack`, or no layer would remain.
    """
    stacks = group_by_stack(blocks)
    if set(stacks) - {stack}:
        raise ValueError(f"cannot remove {sorted(set(stacks) - {stack})[0]}: only layers of {stack} can go")
    renamed = drop_from_stack(model, stack, stacks.get(stack, []))
    for owner in (model, backbone):  # transformers shares one config between them; set it on both regardless
        config: Any = owner.config
        config.num_hidden_layers = len(backbone.layers)
    return renamed
