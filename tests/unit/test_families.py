"""Tests of the family registry and the ViT, ResNet and generic adapters."""

from __future__ import annotations

import logging

import pytest
import torch
from helpers.toy_models import ToyBlockNet
from torch import nn

from profiling_agent.tools.compression import families
from profiling_agent.tools.compression.families import ADAPTERS, adapter_by_name, adapter_for, register_adapter
from profiling_agent.tools.compression.families.base import FamilyAdapter
from profiling_agent.tools.compression.families.generic import GenericAdapter
from profiling_agent.tools.compression.families.resnet import ResNetAdapter
from profiling_agent.tools.compression.families.vit import ViTAdapter


def _is_under(name: str, prefixes: list[str]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


# ---------------------------------------------------------------- registry


def test_registry_picks_family(tiny_vit, tiny_resnet, tiny_resnet_basic):
    assert isinstance(adapter_for(tiny_vit), ViTAdapter)
    assert isinstance(adapter_for(tiny_resnet), ResNetAdapter)
    assert isinstance(adapter_for(tiny_resnet_basic), ResNetAdapter)
    assert adapter_by_name("vit").name == "vit"
    with pytest.raises(KeyError):
        adapter_by_name("nope")


def test_registry_order_deit_before_vit_and_generic_last():
    names = [a.name for a in ADAPTERS]
    assert names[-1] == "generic" and not ADAPTERS[-1].safe
    assert names.index("vit") < names.index("resnet")
    if "deit" in names:  # registered when tools/compression/families/deit.py exists
        assert names.index("deit") < names.index("vit")


def test_unknown_model_gets_generic_with_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="profiling_agent.tools.compression.families"):
        adapter = adapter_for(ToyBlockNet())
    assert isinstance(adapter, GenericAdapter)
    assert any("fallback" in r.getMessage() for r in caplog.records)


def test_register_adapter_first_and_before_fallback(tiny_vit, monkeypatch):
    class Claims(FamilyAdapter):
        name = "claims"

        def matches(self, model):
            return True

    monkeypatch.setattr(families, "ADAPTERS", list(ADAPTERS))
    register_adapter(Claims())
    assert [a.name for a in families.ADAPTERS][-2:] == ["claims", "generic"]
    assert adapter_for(tiny_vit).name == "vit"  # earlier adapters still win
    register_adapter(Claims(), first=True)
    assert families.ADAPTERS[0].name == "claims"
    assert adapter_for(tiny_vit).name == "claims"


def test_adapters_match_only_their_family(tiny_vit, tiny_resnet):
    assert ViTAdapter().matches(tiny_vit) and not ViTAdapter().matches(tiny_resnet)
    assert ResNetAdapter().matches(tiny_resnet) and not ResNetAdapter().matches(tiny_vit)
    assert not ViTAdapter().matches(ToyBlockNet()) and not ResNetAdapter().matches(ToyBlockNet())


# ---------------------------------------------------------------- ViT


def test_vit_groups(tiny_vit):
    groups = ViTAdapter().prunable_groups(tiny_vit)
    assert [g.name for g in groups] == ["layers.0.heads", "layers.0.mlp", "layers.1.heads", "layers.1.mlp"]
    heads, mlp = groups[0], groups[1]
    assert (heads.kind, heads.units, heads.unit_size, heads.module) == ("head", 4, 8, "vit.layers.0.attention")
    assert heads.roots == tuple(f"vit.layers.0.attention.{p}_proj" for p in "qkv")
    assert heads.members == (*heads.roots, "vit.layers.0.attention.o_proj")
    assert (mlp.kind, mlp.units, mlp.unit_size, mlp.module) == ("structured", 64, 1, "vit.layers.0.mlp.fc1")
    assert mlp.members == ("vit.layers.0.mlp.fc1", "vit.layers.0.mlp.fc2")
    names = dict(tiny_vit.named_modules())
    assert all(m in names for g in groups for m in g.members)


def test_vit_protected(tiny_vit):
    protected = ViTAdapter().protected_modules(tiny_vit)
    layernorms = [n for n, m in tiny_vit.named_modules() if isinstance(m, nn.LayerNorm)]
    assert len(layernorms) == 5
    assert set(layernorms) | {"vit.embeddings", "classifier"} <= set(protected)
    for g in ViTAdapter().prunable_groups(tiny_vit):
        assert not any(_is_under(m, protected) for m in g.members)


def test_vit_fix_up_sets_live_head_counts(tiny_vit):
    att = tiny_vit.vit.layers[1].attention
    keep = torch.arange(8, 32)  # drop head 0 by hand
    for name in ("q_proj", "k_proj", "v_proj"):
        old = getattr(att, name)
        new = nn.Linear(32, 24)
        new.weight.data, new.bias.data = old.weight.data[keep], old.bias.data[keep]
        setattr(att, name, new)
    o_new = nn.Linear(24, 32)
    o_new.weight.data, o_new.bias.data = att.o_proj.weight.data[:, keep], att.o_proj.bias.data
    att.o_proj = o_new
    attrs = ViTAdapter().fix_up(tiny_vit)
    assert attrs == {
        "vit.layers.0.attention": {"num_attention_heads": 4},
        "vit.layers.1.attention": {"num_attention_heads": 3},
    }
    assert att.num_attention_heads == 3 and att.head_dim == 8 and att.scaling == 8**-0.5
    assert ViTAdapter().prunable_groups(tiny_vit)[2].units == 3


# ---------------------------------------------------------------- ResNet


def test_resnet_bottleneck_groups(tiny_resnet):
    groups = ResNetAdapter().prunable_groups(tiny_resnet)
    assert [g.name for g in groups] == [
        "stages.0.layers.0.conv1",
        "stages.0.layers.0.conv2",
        "stages.1.layers.0.conv1",
        "stages.1.layers.0.conv2",
        "stages.1.layers.1.conv1",
        "stages.1.layers.1.conv2",
    ]
    assert [g.units for g in groups] == [4, 4, 8, 8, 8, 8]  # hidden_sizes // reduction 4
    g = groups[3]
    base = "resnet.encoder.stages.1.layers.0.layer"
    assert g.module == f"{base}.1.convolution" and g.roots == (g.module,)
    assert g.members == (f"{base}.1.convolution", f"{base}.1.normalization", f"{base}.2.convolution")
    assert all(g.kind == "structured" and g.unit_size == 1 for g in groups)


def test_resnet_basic_groups(tiny_resnet_basic):
    groups = ResNetAdapter().prunable_groups(tiny_resnet_basic)
    assert [(g.name, g.units) for g in groups] == [("stages.0.layers.0.conv1", 8), ("stages.1.layers.0.conv1", 16)]
    assert groups[1].members[-1] == "resnet.encoder.stages.1.layers.0.layer.1.convolution"


@pytest.mark.parametrize("fixture, last", [("tiny_resnet", 2), ("tiny_resnet_basic", 1)])
def test_resnet_protected(fixture, last, request):
    model = request.getfixturevalue(fixture)
    adapter = ResNetAdapter()
    protected = adapter.protected_modules(model)
    assert {"resnet.embedder", "classifier", "resnet.encoder.stages.1.layers.0.shortcut"} <= set(protected)
    assert f"resnet.encoder.stages.0.layers.0.layer.{last}" in protected
    for g in adapter.prunable_groups(model):
        assert not _is_under(g.module, protected)
        # only the consumer conv may be protected (it loses input channels, never outputs)
        assert [m for m in g.members if _is_under(m, protected)] in ([], [g.members[-1]])


# ---------------------------------------------------------------- generic


def test_generic_on_toy_model():
    model = ToyBlockNet()
    adapter = GenericAdapter()
    assert not adapter.safe and adapter.matches(model)
    groups = adapter.prunable_groups(model)
    assert [(g.name, g.members, g.units) for g in groups] == [
        ("convblock.conv1", ("convblock.conv1", "convblock.bn1", "convblock.conv2"), 12),
        ("mlp.fc1", ("mlp.fc1", "mlp.fc2"), 48),
    ]
    protected = adapter.protected_modules(model)
    assert "classifier" in protected and "embed" in protected


def test_generic_on_vit_finds_only_mlps(tiny_vit):
    groups = GenericAdapter().prunable_groups(tiny_vit)
    assert [g.roots for g in groups] == [("vit.layers.0.mlp.fc1",), ("vit.layers.1.mlp.fc1",)]
    assert "classifier" in GenericAdapter().protected_modules(tiny_vit)


def test_generic_on_resnet_matches_resnet_adapter_roots(tiny_resnet, tiny_resnet_basic):
    for model in (tiny_resnet, tiny_resnet_basic):
        generic = [(g.roots, g.members, g.units) for g in GenericAdapter().prunable_groups(model)]
        specific = [(g.roots, g.members, g.units) for g in ResNetAdapter().prunable_groups(model)]
        assert generic == specific
