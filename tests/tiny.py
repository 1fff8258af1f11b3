"""Tiny Hugging Face image classifiers built from configs (no download): one base per family, overrides per test."""

from __future__ import annotations

from typing import Any

import torch

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
