"""Shared fixtures: tiny transformers image classifiers built from configs (no download)."""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
torch.set_num_threads(1)


def _seeded(build):
    torch.manual_seed(0)
    model = build()
    model.eval()
    return model


@pytest.fixture
def tiny_vit():
    """A 2-layer ViT (hidden 32, 4 heads, 1x16x16 images, 10 labels), random weights, eval mode."""
    from transformers import ViTConfig, ViTForImageClassification

    config = ViTConfig(
        image_size=16,
        patch_size=4,
        num_channels=1,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        num_labels=10,
    )
    return _seeded(lambda: ViTForImageClassification(config))


@pytest.fixture
def tiny_resnet():
    """A 2-stage bottleneck ResNet (1x16x16 images, 10 labels), random weights, eval mode."""
    from transformers import ResNetConfig, ResNetForImageClassification

    config = ResNetConfig(
        num_channels=1,
        embedding_size=8,
        hidden_sizes=[16, 32],
        depths=[1, 2],
        layer_type="bottleneck",
        num_labels=10,
    )
    return _seeded(lambda: ResNetForImageClassification(config))


@pytest.fixture
def tiny_resnet_basic():
    """A 2-stage basic-block ResNet (3x16x16 images, 10 labels), random weights, eval mode."""
    from transformers import ResNetConfig, ResNetForImageClassification

    config = ResNetConfig(
        num_channels=3,
        embedding_size=8,
        hidden_sizes=[8, 16],
        depths=[1, 1],
        layer_type="basic",
        num_labels=10,
    )
    return _seeded(lambda: ResNetForImageClassification(config))
