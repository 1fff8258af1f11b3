"""Tiny Hugging Face image classifiers built from configs (no download): one base per family, overrides per test."""

from __future__ import annotations

from typing import Any

import torch
import transformers
from torch import nn

# ViT-style transformers (ViT, DeiT, BEiT): 16x16 images in 4x4 patches, 2 layers of hidden 32 with 4 heads
TRANSFORMER = {
    "image_size": 16,
    "patch_size": 4,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 64,
    "num_labels": 10,
}
# Swin: 16x16 images in 2x2 patches (an 8x8 grid), 4x4 windows, two one-block stages of 2 and 4 heads
SWIN = {
    "image_size": 16,
    "patch_size": 2,
    "num_channels": 3,
    "embed_dim": 16,
    "depths": [1, 1],
    "num_heads": [2, 4],
    "window_size": 4,
    "mlp_ratio": 2.0,
    "num_labels": 10,
}
# ResNet: one-channel images, a two-stage bottleneck network (1 and 2 blocks)
RESNET = {
    "num_channels": 1,
    "embedding_size": 8,
    "hidden_sizes": [16, 32],
    "depths": [1, 2],
    "layer_type": "bottleneck",
    "num_labels": 10,
}


def digit_labels() -> dict[str, dict]:
    """The config fields that name labels 0-9 as the digits "0".."9" (what the digits data set uses)."""
    return {"id2label": {i: str(i) for i in range(10)}, "label2id": {str(i): i for i in range(10)}}


def vit_config(**overrides: Any):
    """A tiny ViTConfig: one channel, the TRANSFORMER sizes, `overrides` on top."""
    from transformers import ViTConfig

    return ViTConfig(**{**TRANSFORMER, "num_channels": 1, **overrides})


def deit_config(**overrides: Any):
    """A tiny DeiTConfig: three channels, the TRANSFORMER sizes, `overrides` on top."""
    from transformers import DeiTConfig

    return DeiTConfig(**{**TRANSFORMER, "num_channels": 3, **overrides})


def beit_config(**overrides: Any):
    """A tiny BeitConfig: three channels, the TRANSFORMER sizes, `overrides` on top."""
    from transformers import BeitConfig

    return BeitConfig(**{**TRANSFORMER, "num_channels": 3, **overrides})


def swin_config(**overrides: Any):
    """A tiny SwinConfig: the SWIN sizes, `overrides` on top."""
    from transformers import SwinConfig

    return SwinConfig(**{**SWIN, **overrides})


def resnet_config(**overrides: Any):
    """A tiny ResNetConfig: the RESNET sizes, `overrides` on top."""
    from transformers import ResNetConfig

    return ResNetConfig(**{**RESNET, **overrides})


def seeded(cls, config, seed: int = 0) -> torch.nn.Module:
    """`cls(config)` built after `torch.manual_seed(seed)`, in eval mode."""
    torch.manual_seed(seed)
    return cls(config).eval()


def family_model(family: str, layers: int | None = None) -> tuple[nn.Module, int]:
    """Return (a tiny random model of `family` taking 3-channel images, its image size).

    `layers` sets a ViT's or DeiT's encoder layers (the TRANSFORMER sizes' 2 by default): one layer holds every op
    kind of the family, and a test that builds forms of it whatever the depth builds each in about half the time.
    """
    import transformers as tf

    depth = {} if layers is None else {"num_hidden_layers": layers}
    # three-channel images throughout
    if family == "vit":
        return seeded(tf.ViTForImageClassification, vit_config(num_channels=3, **depth)), 16
    if family == "deit":
        return seeded(tf.DeiTForImageClassification, deit_config(**depth)), 16
    if family == "swin":
        config = swin_config(image_size=32, num_heads=[2, 2], mlp_ratio=4.0)
        return seeded(tf.SwinForImageClassification, config), 32
    return seeded(tf.ResNetForImageClassification, resnet_config(num_channels=3)), 16


def digits_processor():
    """A 16x16 one-channel ViT image processor (mean/std 0.5), as the digits images are preprocessed in the tests."""
    from transformers.models.vit.image_processing_pil_vit import ViTImageProcessorPil

    return ViTImageProcessorPil(size={"height": 16, "width": 16}, image_mean=[0.5], image_std=[0.5])


def random_pixels(n: int, size: int, seed: int = 1) -> torch.Tensor:
    """Return `n` seeded random 3-channel images of `size` x `size`."""
    return torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(seed))


def randomize(model: nn.Module, seed: int) -> nn.Module:
    """Give every parameter unit-scale random values (HF zero-inits tokens and bias tables, too weak a test)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            for name, param in module.named_parameters(recurse=False):
                noise = torch.randn(param.shape, generator=gen)
                if isinstance(module, nn.LayerNorm):
                    param.copy_((1.0 if name == "weight" else 0.0) + 0.1 * noise)
                elif isinstance(module, (nn.Linear, nn.Conv2d)) and name == "weight":
                    param.copy_(noise * param[0].numel() ** -0.5)
                else:  # biases, cls/distillation tokens, position embeddings, relative-position bias tables
                    param.copy_(0.5 * noise)
    return model.eval()


def random_deit(cls, attn: str = "sdpa") -> nn.Module:
    """Return a tiny DeiT of `cls` (5 labels) with unit-scale random weights."""
    return randomize(seeded(cls, deit_config(num_labels=5, attn_implementation=attn)), seed=1)


def random_swin(heads=(2, 4), depths=(2, 2), window: int = 4, attn: str = "sdpa") -> nn.Module:
    """Return a tiny Swin (32x32 images, 5 labels) with unit-scale random weights."""
    config = swin_config(
        image_size=32,
        depths=list(depths),
        num_heads=list(heads),
        window_size=window,
        mlp_ratio=4.0,
        num_labels=5,
        attn_implementation=attn,
    )
    return randomize(seeded(transformers.SwinForImageClassification, config), seed=2)
