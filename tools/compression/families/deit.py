"""Family adapter for DeiT image classifiers (plain and distilled, transformers 5 attention)."""

from __future__ import annotations

import logging
from typing import Any

from torch import nn
from transformers.models.deit.modeling_deit import (
    DeiTAttention,
    DeiTForImageClassification,
    DeiTForImageClassificationWithTeacher,
    DeiTLayer,
)

from profiling_agent.tools.compression.families.base import (
    FamilyAdapter,
    PrunableGroup,
    block_group,
    head_group,
    mlp_group,
)
from profiling_agent.tools.compression.families.vit import drop_layers

logger = logging.getLogger(__name__)

_PROTECTED_LEAVES = ("embeddings", "classifier", "cls_classifier", "distillation_classifier")


def _layers(model: nn.Module) -> list[tuple[str, DeiTLayer]]:
    """Return (name, layer) for every DeiT transformer layer, in forward order."""
    return [(name, mod) for name, mod in model.named_modules() if isinstance(mod, DeiTLayer)]


def check_attention(name: str, attention: nn.Module) -> int:
    """Check that q/k/v/o agree on a whole number of heads and return that number.

    Args:
        name: Module name, for the error message.
        attention: A transformers 5 attention module with q_proj, k_proj, v_proj, o_proj and head_dim.

    Returns:
        The number of heads the projections hold now.

    Raises:
        ValueError: When the projections disagree or are not a multiple of head_dim.
    """
    attn: Any = attention  # transformers sets the projections and head_dim in __init__: invisible to mypy
    head_dim = int(attn.head_dim)
    widths = {p: int(getattr(attn, p).out_features) for p in ("q_proj", "k_proj", "v_proj")}
    widths["o_proj.in"] = int(attn.o_proj.in_features)
    if len(set(widths.values())) != 1 or widths["q_proj"] % head_dim:
        raise ValueError(f"{name}: inconsistent attention widths {widths} for head_dim {head_dim}")
    return widths["q_proj"] // head_dim


def fix_attention(name: str, attention: nn.Module) -> dict[str, Any]:
    """Set the cached head count (and the unchanged head_dim scaling) of one attention module."""
    heads = check_attention(name, attention)
    attn: Any = attention  # head_dim and scaling are plain attributes of the transformers module
    attn.num_attention_heads = heads
    attn.scaling = attn.head_dim**-0.5
    return {"num_attention_heads": heads, "head_dim": attn.head_dim, "scaling": attn.scaling}


class DeiTAdapter(FamilyAdapter):
    """Prune DeiT MLP channels and whole heads inside each layer; the hidden size never changes.

    The config keeps the unpruned sizes (head counts and MLP widths may now differ per layer); the pruned
    sizes live in the weight shapes and in the attributes `fix_up` returns.
    """

    name = "deit"

    def matches(self, model: nn.Module) -> bool:
        """Return True for DeiTForImageClassification and DeiTForImageClassificationWithTeacher."""
        return isinstance(model, (DeiTForImageClassification, DeiTForImageClassificationWithTeacher))

    def prunable_groups(self, model: nn.Module) -> list[PrunableGroup]:
        """List per layer the head group, then the MLP group, in forward order."""
        groups = []
        for prefix, layer in _layers(model):
            index = int(prefix.rsplit(".", 1)[-1])
            hd = layer.attention.head_dim
            groups.append(head_group(f"layers.{index}.heads", prefix, layer.attention.q_proj.out_features // hd, hd))
            groups.append(mlp_group(f"layers.{index}.mlp", prefix, layer.mlp.fc1.out_features))
        return groups

    def block_groups(self, model: nn.Module) -> list[PrunableGroup]:
        """List every DeiT layer as a removable block (a model with one layer has none)."""
        layers = _layers(model)
        if len(layers) < 2:
            return []
        return [block_group(f"layers.{name.rsplit('.', 1)[-1]}.block", name, len(layers)) for name, _ in layers]

    def drop_blocks(self, model: nn.Module, blocks: list[str]) -> dict[str, str]:
        """Remove the named layers (at least one stays) and set `num_hidden_layers` to the count left."""
        backbone: Any = model.deit
        return drop_layers(model, backbone, "deit.layers", blocks)

    def protected_modules(self, model: nn.Module) -> list[str]:
        """Name the embeddings (cls, distillation and position tokens), every LayerNorm and the classifiers."""
        names = []
        for name, module in model.named_modules():
            leaf = name.rsplit(".", 1)[-1]
            if isinstance(module, nn.LayerNorm) or leaf in _PROTECTED_LEAVES or "patch_embeddings" in name:
                names.append(name)
        return names

    def fix_up(self, model: nn.Module) -> dict[str, dict[str, Any]]:
        """Set every attention module's head count from its pruned projections and return what was set."""
        fixed = {}
        for name, module in model.named_modules():
            if isinstance(module, DeiTAttention):
                fixed[name] = fix_attention(name, module)
        logger.debug("deit fix_up: %s", fixed)
        return fixed
