"""Identical layers are recognised by structure and read one pooled figure; a layer that differs keeps its own."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from helpers.tiny import resnet_config, seeded, swin_config, vit_config
from transformers import ResNetForImageClassification, SwinForImageClassification, ViTForImageClassification

from profiling_agent.tools.compression.families import adapter_for
from profiling_agent.tools.compression.pruning import prune_model
from profiling_agent.tools.profiling.backend_profile import ORT_FORMS, profile_backends
from profiling_agent.tools.profiling.identical import identical_layers, pooled_rows
from profiling_agent.tools.profiling.summary import planner_profile


def _vit(layers: int = 3, pruned_mlp: int | None = None):
    # MLPs wide enough to hold a timed share of their own, so the pruned one (3/4 of its channels gone) reads a
    # clearly other figure than the pooled two: a narrow MLP's share rounded to the pooled one's now and then
    model = seeded(ViTForImageClassification, vit_config(num_hidden_layers=layers, intermediate_size=512))
    if pruned_mlp is not None:
        entry = {"layer": f"^vit.layers.{pruned_mlp}.mlp.fc1$", "type": "structured", "ratio": 0.75}
        prune_model(model, [entry], torch.randn(1, 1, 16, 16))
    return model


def test_layers_of_one_structure_form_a_class_and_a_differing_one_stays_out():
    assert identical_layers(_vit()) == [["vit.layers.0", "vit.layers.1", "vit.layers.2"]]
    assert identical_layers(_vit(pruned_mlp=1)) == [["vit.layers.0", "vit.layers.2"]]
    # a ResNet stage's first block (stride, shortcut) differs from the blocks after it
    resnet = seeded(ResNetForImageClassification, resnet_config(depths=[3, 1]))
    assert identical_layers(resnet) == [["resnet.encoder.stages.0.layers.1", "resnet.encoder.stages.0.layers.2"]]
    # Swin's shifted blocks differ from the unshifted ones (shift_size), not from each other
    swin = seeded(SwinForImageClassification, swin_config(depths=[4, 1]))
    stage = "swin.encoder.layers.0.blocks"
    assert identical_layers(swin) == [[f"{stage}.0", f"{stage}.2"], [f"{stage}.1", f"{stage}.3"]]


def test_pooling_keeps_the_sum_and_gives_each_member_the_class_mean():
    rows = {"a.0": 1.0, "a.0.fc": 3.0, "a.1": 2.0, "a.1.fc": 5.0, "a.2.fc": 1.0, "head": 7.0}
    pooled = pooled_rows(rows, [["a.0", "a.1", "a.2"]])
    assert pooled["a.0.fc"] == pooled["a.1.fc"] == pooled["a.2.fc"] == pytest.approx(3.0)
    assert pooled["a.0"] == pooled["a.1"] == pooled["a.2"] == pytest.approx(1.0)  # a.2 had no own row: 0 counted
    assert pooled["head"] == 7.0 and sum(pooled.values()) == pytest.approx(sum(rows.values()))


def _shares(model, kind: str) -> dict[str, float]:
    groups = [dataclasses.asdict(g) for g in adapter_for(model).prunable_groups(model)]
    if kind == "torch":
        return {name: c["latency_share"] for name, c in planner_profile(model, (1, 16, 16))["group_costs"].items()}
    out = profile_backends(model, torch.randn(1, 1, 16, 16), groups, ORT_FORMS[:1], repeats=3)
    return out["forms"]["ort_fp32"]["group_latency_share"]


@pytest.mark.parametrize("kind", ["torch", "ort_fp32"])
def test_identical_layers_read_equal_shares_and_a_pruned_one_its_own(kind):
    shares = _shares(_vit(), kind)
    for part in ("heads", "mlp"):
        assert shares[f"layers.0.{part}"] > 0
        assert shares[f"layers.0.{part}"] == shares[f"layers.1.{part}"] == shares[f"layers.2.{part}"], shares
    shares = _shares(_vit(pruned_mlp=1), kind)
    assert shares["layers.0.mlp"] == shares["layers.2.mlp"] != shares["layers.1.mlp"], shares
