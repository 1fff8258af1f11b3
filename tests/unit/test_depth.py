"""Depth pruning: whole blocks removed by plan entries of type "block", probed, planned and refitted around."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path

import pytest
import torch
from helpers.fake_llm import guard_profile
from helpers.search_trials import rounds
from helpers.tiny import resnet_config, seeded, vit_config
from pydantic import ValidationError
from transformers import ResNetForImageClassification, ViTForImageClassification

from profiling_agent.state import CompressionPlan, Objective, PlanningProblem, PruneEntry, group_rows
from profiling_agent.tools.compression.depth import replaces
from profiling_agent.tools.compression.families import adapter_for
from profiling_agent.tools.compression.pruning import prune_model
from profiling_agent.tools.compression.units import PruneError
from profiling_agent.tools.models.artifact_load import load_artifact
from profiling_agent.tools.models.artifacts import ArtifactError, save_artifact
from profiling_agent.tools.models.shortcut import ShortcutBlock
from profiling_agent.tools.planning.deterministic import PlannerConfig, estimate_reduction
from profiling_agent.tools.planning.deterministic import depth_first_blocks as depth_first
from profiling_agent.tools.profiling.probe_fast import FastProbeConfig, probe_groups
from profiling_agent.tools.profiling.sensitivity import compare_logits
from profiling_agent.tools.recovery.reconstruct import reconstruct
from profiling_agent.tools.runtimes.blocks import PassBlock


@pytest.fixture
def vit4():
    """A 4-layer tiny ViT: enough blocks to remove some and keep others."""
    return seeded(ViTForImageClassification, vit_config(num_hidden_layers=4))


@pytest.fixture
def resnet3():
    """A bottleneck ResNet whose second stage has three blocks (two removable)."""
    return seeded(ResNetForImageClassification, resnet_config(depths=[1, 3]))


def _pixels(model, n=16):
    return torch.randn(n, model.config.num_channels, 16, 16, generator=torch.Generator().manual_seed(5))


class _SwinPass(torch.nn.Module):
    """A Swin block's pass-through: its hidden state and no attention weights."""

    def forward(self, hidden, *args, **kwargs):
        return hidden, None


def _skipping(model, names, swin=False):
    """The unpruned model with `names` replaced by pass-throughs: what removing them computes."""
    out = copy.deepcopy(model)
    for name in names:
        parent, _, child = name.rpartition(".")
        setattr(out.get_submodule(parent), child, _SwinPass() if swin else PassBlock(False))
    return out


def test_a_block_entry_must_remove_the_whole_block():
    assert PruneEntry(layer="layers\\.2$", type="block", ratio=1.0).ratio == 1.0
    with pytest.raises(ValidationError, match="ratio must be 1.0"):
        PruneEntry(layer="layers\\.2$", type="block", ratio=0.5)
    with pytest.raises(ValidationError, match="below 1.0"):
        PruneEntry(layer="mlp", type="structured", ratio=1.0)


def test_depth_is_on_by_default_only_for_a_latency_target():
    assert Objective(target="latency").prunes_depth()
    assert not Objective(target="params").prunes_depth()
    assert Objective(target="params", depth=True).prunes_depth()
    assert not Objective(target="latency", depth=False).prunes_depth()


def test_removing_vit_layers_computes_the_model_without_them_and_reloads(vit4, tmp_path):
    x = _pixels(vit4, 4)
    pruned = copy.deepcopy(vit4)
    report = prune_model(pruned, [{"layer": "layers\\.(1|2)$", "type": "block", "ratio": 1.0}], x[:1])
    assert [(r.group, r.kind, r.units_after) for r in report.applied] == [
        ("layers.1.block", "block", 0),
        ("layers.2.block", "block", 0),
    ]
    assert pruned.config.num_hidden_layers == 2 and len(pruned.vit.layers) == 2
    with torch.no_grad():
        expected = _skipping(vit4, ["vit.layers.1", "vit.layers.2"])(x).logits
        assert torch.allclose(pruned(x).logits, expected, atol=1e-6)
    save_artifact(pruned, tmp_path / "a", attrs=report.attrs)
    with torch.no_grad():
        assert torch.allclose(load_artifact(tmp_path / "a").model.eval()(x).logits, pruned(x).logits, atol=1e-6)


def test_width_entries_follow_the_renumbered_blocks_and_skip_removed_ones(vit4):
    pruned = copy.deepcopy(vit4)
    entries = [
        {"layer": "layers\\.1$", "type": "block", "ratio": 1.0},
        {"layer": "layers\\.(1|3)\\.mlp", "type": "structured", "ratio": 0.5},
    ]
    report = prune_model(pruned, entries, _pixels(vit4, 1))
    width = [r for r in report.applied if r.kind != "block"]
    assert [(r.group, r.module) for r in width] == [("layers.2.mlp", "vit.layers.2.mlp.fc1")]  # old layer 3
    assert pruned.vit.layers[2].mlp.fc1.out_features == vit4.vit.layers[3].mlp.fc1.out_features // 2
    assert pruned.vit.layers[0].mlp.fc1.out_features == vit4.vit.layers[0].mlp.fc1.out_features
    assert report.skipped == [{"group": "layers.1.mlp", "reason": "inside removed block vit.layers.1"}]


def test_the_engine_keeps_at_least_one_block(vit4):
    with pytest.raises(PruneError, match="fewer than 1"):
        prune_model(copy.deepcopy(vit4), [{"layer": "layers", "type": "block", "ratio": 1.0}], _pixels(vit4, 1))


def test_resnet_removes_identity_blocks_and_lowers_its_depths(resnet3, tmp_path):
    adapter = adapter_for(resnet3)
    groups = adapter.block_groups(resnet3)
    assert [g.name for g in groups] == [
        "stages.0.layers.0.block",
        "stages.1.layers.0.block",
        "stages.1.layers.1.block",
        "stages.1.layers.2.block",
    ]
    # a stage's first block (projection shortcut) is replaced, not removed: its group owns only the residual branch
    assert [replaces(g) for g in groups] == [True, True, False, False]
    assert groups[1].members == ("resnet.encoder.stages.1.layers.0.layer",)
    x = _pixels(resnet3, 4)
    pruned = copy.deepcopy(resnet3)
    report = prune_model(pruned, [{"layer": "stages\\.1\\.layers\\.1$", "type": "block", "ratio": 1.0}], x[:1])
    assert pruned.config.depths == [1, 2]
    with torch.no_grad():
        expected = _skipping(resnet3, ["resnet.encoder.stages.1.layers.1"])(x).logits
        assert torch.allclose(pruned(x).logits, expected, atol=1e-5)
    save_artifact(pruned, tmp_path / "r", attrs=report.attrs)
    with torch.no_grad():
        assert torch.allclose(load_artifact(tmp_path / "r").model.eval()(x).logits, pruned(x).logits, atol=1e-5)
    with pytest.raises(ValueError, match="only blocks after a stage's first"):
        adapter.drop_blocks(copy.deepcopy(resnet3), ["resnet.encoder.stages.1.layers.0.layer"])


def _shortcut_only(model, name):
    """The unpruned model with block `name`'s residual branch zeroed: what replacing it by its shortcut computes."""
    out = copy.deepcopy(model)
    last = out.get_submodule(f"{name}.layer")[-1].normalization
    torch.nn.init.zeros_(last.weight)
    torch.nn.init.zeros_(last.bias)
    return out


def test_resnet_replaces_a_stages_first_block_by_its_shortcut_and_the_artifact_rebuilds_it(resnet3, tmp_path):
    x = _pixels(resnet3, 4)
    pruned = copy.deepcopy(resnet3)
    entries = [
        {"layer": r"^resnet\.encoder\.stages\.1\.layers\.0$", "type": "block", "ratio": 1.0},
        {"layer": r"^resnet\.encoder\.stages\.1\.layers\.2$", "type": "block", "ratio": 1.0},
        {"layer": r"layer\.0\.convolution", "type": "structured", "ratio": 0.5},
    ]
    report = prune_model(pruned, entries, x[:1])
    first = pruned.resnet.encoder.stages[1].layers[0]
    assert isinstance(first, ShortcutBlock) and pruned.config.depths == [1, 2]
    assert first.shortcut.convolution.weight is not None  # the shortcut keeps its weights under its own name
    assert "resnet.encoder.stages.1.layers.0.shortcut.convolution.weight" in dict(pruned.named_parameters())
    # the width entry inside the replaced block is moot; the one in the kept identity block applies
    assert {r["group"] for r in report.skipped} == {"stages.1.layers.0.conv1", "stages.1.layers.2.conv1"}
    assert [r.group for r in report.applied][:2] == ["stages.1.layers.0.block", "stages.1.layers.2.block"]
    # a block-only plan computes exactly the model with that block's residual branch at zero
    only = copy.deepcopy(resnet3)
    prune_model(only, entries[:1], x[:1])
    with torch.no_grad():
        expected = _shortcut_only(resnet3, "resnet.encoder.stages.1.layers.0")(x).logits
        assert torch.allclose(only(x).logits, expected, atol=1e-5)
    # nothing inside a replaced block is offered again
    assert "stages.1.layers.0" not in " ".join(g.name for g in adapter_for(pruned).prunable_groups(pruned))
    assert "stages.1.layers.0" not in " ".join(g.name for g in adapter_for(pruned).block_groups(pruned))
    save_artifact(pruned, tmp_path / "r", attrs=report.attrs)
    recipe = json.loads((tmp_path / "r" / "recipe.json").read_text())
    assert recipe["replaced_blocks"] == {"resnet.encoder.stages.1.layers.0": "shortcut"}
    assert recipe["format_version"] == 2
    loaded = load_artifact(tmp_path / "r").model
    assert isinstance(loaded.resnet.encoder.stages[1].layers[0], ShortcutBlock)
    with torch.no_grad():
        assert torch.equal(loaded(x).logits, pruned(x).logits)
    recipe["replaced_blocks"] = {"resnet.encoder.stages.1.layers.0": "zeros"}
    (tmp_path / "r" / "recipe.json").write_text(json.dumps(recipe))
    with pytest.raises(ArtifactError, match="replaced by 'zeros', which is unknown"):
        load_artifact(tmp_path / "r")


def test_an_artifact_without_replaced_blocks_stays_format_version_1(resnet3, tmp_path):
    save_artifact(resnet3, tmp_path / "r")
    assert json.loads((tmp_path / "r" / "recipe.json").read_text())["format_version"] == 1


def test_the_fast_probe_measures_a_removed_block_exactly(vit4):
    adapter = adapter_for(vit4)
    groups = adapter.prunable_groups(vit4) + adapter.block_groups(vit4)
    pixels = _pixels(vit4, 24)
    rows = probe_groups(vit4, groups, pixels, ratio=0.3, config=FastProbeConfig(eval_images=0))
    with torch.no_grad():
        reference = vit4(pixels).logits
        for i in range(4):
            row = rows[f"layers.{i}.block"]
            direct = compare_logits(reference, _skipping(vit4, [f"vit.layers.{i}"])(pixels).logits, None)
            assert row["ratio"] == 1.0 and row["units_removed"] == 1
            assert row["kl"] == pytest.approx(direct["kl"], rel=1e-4, abs=1e-7)
            assert row["agreement"] == pytest.approx(direct["agreement"])


def test_the_fast_probe_measures_a_block_replaced_by_its_shortcut_exactly(resnet3):
    from profiling_agent.tools.profiling.sensitivity import probe_groups_full

    adapter = adapter_for(resnet3)
    groups = adapter.prunable_groups(resnet3) + adapter.block_groups(resnet3)
    pixels = _pixels(resnet3, 24)
    rows = probe_groups(resnet3, groups, pixels, ratio=0.3, config=FastProbeConfig(eval_images=0))
    full = probe_groups_full(resnet3, [g for g in groups if g.kind == "block"], pixels, ratio=0.3)
    with torch.no_grad():
        reference = resnet3(pixels).logits
        for name in ("resnet.encoder.stages.0.layers.0", "resnet.encoder.stages.1.layers.0"):
            group = name[len("resnet.encoder.") :] + ".block"
            direct = compare_logits(reference, _shortcut_only(resnet3, name)(pixels).logits, None)
            assert rows[group]["fast"] and rows[group]["units_removed"] == 1
            assert rows[group]["kl"] == pytest.approx(direct["kl"], rel=1e-4, abs=1e-7)
            assert full[group]["kl"] == pytest.approx(direct["kl"], rel=1e-4, abs=1e-7)  # the engine's own path


def test_the_refit_after_removing_blocks_fits_the_shallower_baseline(vit4):
    pixels = _pixels(vit4, 48)
    pruned = copy.deepcopy(vit4)
    entries = [
        {"layer": "layers\\.2$", "type": "block", "ratio": 1.0},
        {"layer": "mlp", "type": "structured", "ratio": 0.5},
    ]
    report = prune_model(pruned, entries, pixels[:1])
    info = reconstruct(vit4, pruned, pixels, report.applied)
    assert len(info["consumers"]) == 3  # the MLPs of the three layers left
    assert all(f["error_after"] <= f["error_before"] for f in info["consumers"])
    shallow = copy.deepcopy(vit4)
    adapter_for(shallow).drop_blocks(shallow, ["vit.layers.2"])
    with torch.no_grad():  # the refitted model is closer to the shallower unpruned model than before the refit
        before = copy.deepcopy(vit4)
        prune_model(before, entries, pixels[:1])
        target = shallow(pixels).logits
        assert (pruned(pixels).logits - target).pow(2).mean() < (before(pixels).logits - target).pow(2).mean()


def _planner_groups(model):
    adapter = adapter_for(model)
    return [dataclasses.asdict(g) for g in (*adapter.prunable_groups(model), *adapter.block_groups(model))]


def test_depth_first_takes_the_cheapest_blocks_and_at_most_half_a_stack(vit4):
    groups = _planner_groups(vit4)
    costs = {g["name"]: {"latency_share": 0.2 if g["kind"] == "block" else 0.01} for g in groups}
    damage = {"layers.0.block": 1.0, "layers.1.block": 0.5, "layers.2.block": 0.05, "layers.3.block": 0.3}
    sensitivity = {g["name"]: {"damage": damage.get(g["name"], 0.001)} for g in groups}
    config = PlannerConfig()
    one = depth_first(0.2, group_rows(groups, costs, sensitivity), "latency", config)
    assert [name for name, r in one.items() if r] == ["layers.2.block"]
    two = depth_first(0.4, group_rows(groups, costs, sensitivity), "latency", config)
    assert sorted(name for name, r in two.items() if r) == ["layers.2.block", "layers.3.block"]
    most = depth_first(0.9, group_rows(groups, costs, sensitivity), "latency", config)
    assert sum(most.values()) == 2  # half of the four layers, however far the goal
    below = depth_first(0.4, group_rows(groups, costs, sensitivity), "latency", config, ceiling=0.39)
    assert [name for name, r in below.items() if r] == ["layers.2.block"]
    # a removed block's cost counts once: its width groups add nothing on top
    ratios = {**two, "layers.2.mlp": 0.5, "layers.2.heads": 0.5}
    assert estimate_reduction(ratios, group_rows(groups, costs, {}), "latency") == pytest.approx(0.4)


def test_auto_recovery_distills_longer_after_removing_blocks():
    from profiling_agent.tools.recovery.policy import DEPTH_MAX_STEPS, MAX_STEPS, auto_steps

    assert auto_steps(2000, 32, 100_000) == 125  # two passes over the images
    assert auto_steps(20_000, 32, 100_000) == MAX_STEPS  # capped
    assert auto_steps(2000, 64, 100_000, removed_blocks=2) == 3000  # ninety-six passes
    assert auto_steps(20_000, 32, 100_000, removed_blocks=1) == DEPTH_MAX_STEPS  # capped higher than width plans
    assert auto_steps(200, 32, 100_000, removed_blocks=1) == 600
    assert auto_steps(2000, 32, 90_000_000, removed_blocks=1) == MAX_STEPS // 2  # a big model's steps cost minutes


def test_a_stack_may_lose_half_its_blocks_counting_those_that_cannot_go(vit4, resnet3):
    from profiling_agent.tools.compression.depth import block_limits

    assert block_limits(_planner_groups(vit4), 0.5) == {"vit.layers": 2}
    # three blocks, the first not removable: one may go (half of three, rounded down), never the first; each
    # stage's first block may be replaced by its shortcut on its own
    firsts = {"resnet.encoder.stages.0.layers.0": 1, "resnet.encoder.stages.1.layers.0": 1}
    assert block_limits(_planner_groups(resnet3), 0.5) == {**firsts, "resnet.encoder.stages.1.layers": 1}
    zoo_like = seeded(ResNetForImageClassification, resnet_config(depths=[1, 2]))
    assert block_limits(_planner_groups(zoo_like), 0.5) == {**firsts, "resnet.encoder.stages.1.layers": 1}
    assert block_limits(_planner_groups(zoo_like), 0.4) == {**firsts, "resnet.encoder.stages.1.layers": 0}


def test_a_latency_plan_removes_the_cheapest_blocks_first_and_prunes_no_width_inside_them(vit4):
    from profiling_agent.tools.planning.deterministic import plan_round

    groups = _planner_groups(vit4)
    costs = {  # as on the zoo ViT at batch 1: a layer is a fifth of the time, its channels and heads little of it
        g["name"]: {"latency_share": 0.2 if g["kind"] == "block" else 0.02, "macs_share": 0.1, "params_share": 0.1}
        for g in groups
    }
    damage = {"layers.0.block": 1.0, "layers.1.block": 0.5, "layers.2.block": 0.05, "layers.3.block": 0.3}
    sensitivity = {g["name"]: {"damage": damage.get(g["name"], 0.01)} for g in groups}
    result = plan_round(
        PlanningProblem.of(groups, costs, sensitivity, Objective(target="latency", target_reduction=0.38), [])
    )
    blocks = [e.layer for e in result.plan.pruning if e.type == "block"]
    assert blocks == ["^vit\\.layers\\.2$", "^vit\\.layers\\.3$"]
    assert all(e.ratio == 1.0 for e in result.plan.pruning if e.type == "block")
    assert not [
        e for e in result.plan.pruning if e.type != "block" and ("layers\\.2" in e.layer or "layers\\.3" in e.layer)
    ]
    # where channels and heads alone can reach the goal, no block goes
    wide = {name: {**c, "latency_share": 0.08} if "block" not in name else c for name, c in costs.items()}
    wide_plan = plan_round(
        PlanningProblem.of(groups, wide, sensitivity, Objective(target="latency", target_reduction=0.38), [])
    ).plan
    assert not [e for e in wide_plan.pruning if e.type == "block"]
    # the same groups under a params target: no block groups planned unless the round lists them (depth off)
    width = [g for g in groups if g["kind"] != "block"]
    params = plan_round(
        PlanningProblem.of(width, costs, sensitivity, Objective(target="params", target_reduction=0.3), [])
    )
    assert params.plan.pruning and not [e for e in params.plan.pruning if e.type == "block"]


def test_a_latency_plan_on_a_resnet_replaces_a_stages_first_block_and_the_guard_and_engine_take_it(resnet3):
    from profiling_agent.tools.planning.deterministic import plan_round
    from profiling_agent.tools.planning.plan_guard import check_plan

    groups = _planner_groups(resnet3)
    damage = {"stages.1.layers.0.block": 0.05, "stages.0.layers.0.block": 2.0}
    shares = {"stages.1.layers.0.block": 0.3, "stages.0.layers.0.block": 0.2}
    costs = {
        g["name"]: {
            "latency_share": shares.get(g["name"], 0.1 if g["kind"] == "block" else 0.02),
            "macs_share": 0.05,
            "params_share": 0.05,
        }
        for g in groups
    }
    sensitivity = {g["name"]: {"damage": damage.get(g["name"], 1.0 if g["kind"] == "block" else 0.5)} for g in groups}
    result = plan_round(
        PlanningProblem.of(groups, costs, sensitivity, Objective(target="latency", target_reduction=0.25), [])
    )
    blocks = [e.layer for e in result.plan.pruning if e.type == "block"]
    assert blocks == ["^resnet\\.encoder\\.stages\\.1\\.layers\\.0$"]  # the cheapest: replaced, not removed
    assert check_plan(result.plan, guard_profile(groups)).ok
    pruned = copy.deepcopy(resnet3)
    prune_model(pruned, result.plan.pruning, _pixels(resnet3, 1))
    assert isinstance(pruned.resnet.encoder.stages[1].layers[0], ShortcutBlock)
    # both stages' first blocks and one identity block may go in one plan: each replacement has its own limit
    both = [{"layer": r"^resnet\.encoder\.stages\.(0\.layers\.0|1\.layers\.(0|1))$", "type": "block", "ratio": 1.0}]
    assert check_plan(CompressionPlan(pruning=both, quantization=[], rationale="r"), guard_profile(groups)).ok


def test_swin_removes_the_last_block_of_a_stage_and_rebuilds_from_its_config(tmp_path):
    from helpers.tiny import swin_config
    from transformers import SwinForImageClassification

    model = seeded(SwinForImageClassification, swin_config(depths=[2, 2]))
    adapter = adapter_for(model)
    assert [g.module for g in adapter.block_groups(model)] == [
        "swin.encoder.layers.0.blocks.1",
        "swin.encoder.layers.1.blocks.1",
    ]
    x = torch.randn(3, 3, 16, 16, generator=torch.Generator().manual_seed(2))
    pruned = copy.deepcopy(model)
    entries = [{"layer": "layers\\.1\\.blocks\\.1$", "type": "block", "ratio": 1.0}]
    report = prune_model(pruned, entries, x[:1])
    assert pruned.config.depths == [2, 1]
    save_artifact(pruned, tmp_path / "s", attrs=report.attrs)
    with torch.no_grad():
        expected = _skipping(model, ["swin.encoder.layers.1.blocks.1"], swin=True)(x).logits
        assert torch.allclose(pruned(x).logits, expected, atol=1e-5)
        assert torch.allclose(load_artifact(tmp_path / "s").model.eval()(x).logits, expected, atol=1e-5)
    with pytest.raises(ValueError, match="only the last block"):
        adapter.drop_blocks(copy.deepcopy(model), ["swin.encoder.layers.0.blocks.0"])


def test_a_failed_plan_of_blocks_and_width_backs_off_its_width_first(vit4):
    from profiling_agent.tools.planning.deterministic import plan_round

    groups = _planner_groups(vit4)
    costs = {  # two layers give 0.36 of the latency; reaching 0.42 takes width in the layers left
        g["name"]: {"latency_share": 0.18 if g["kind"] == "block" else 0.03, "macs_share": 0.1, "params_share": 0.1}
        for g in groups
    }
    damage = {"layers.0.block": 1.0, "layers.1.block": 0.5, "layers.2.block": 0.05, "layers.3.block": 0.3}
    sensitivity = {g["name"]: {"damage": damage.get(g["name"], 0.01)} for g in groups}
    objective = Objective(target="latency", target_reduction=0.4)
    first = plan_round(PlanningProblem.of(groups, costs, sensitivity, objective, []))
    blocks = sorted(e.layer for e in first.plan.pruning if e.type == "block")
    assert blocks == ["^vit\\.layers\\.2$", "^vit\\.layers\\.3$"] and len(first.plan.pruning) > 2  # width on top
    failed = {
        "iteration": 1,
        "goal": first.target_estimate,
        "gamma": first.gamma,
        "passed": False,
        "blocks": blocks,
        "width": True,
    }
    second = plan_round(PlanningProblem.of(groups, costs, sensitivity, objective, rounds(failed)))
    assert sorted(e.layer for e in second.plan.pruning) == blocks  # the same blocks, no width
    assert second.target_estimate == pytest.approx(0.36) and "keeping the 2 blocks round 1 removed" in second.notes[0]
    # when those blocks alone also missed the budget, they are no longer kept: the plan starts over, lower
    alone = {**failed, "iteration": 2, "goal": second.target_estimate, "width": False}
    third = plan_round(PlanningProblem.of(groups, costs, sensitivity, objective, rounds(failed, alone)))
    assert "keeping" not in third.notes[0] and third.target_estimate < second.target_estimate
    assert sorted(e.layer for e in third.plan.pruning if e.type == "block") != blocks
    # ... and it fills its lower goal with blocks alone: the cheapest block, no width on top
    assert [e.layer for e in third.plan.pruning] == ["^vit\\.layers\\.2$"] and "blocks alone" in third.notes[0]
    # a planner history without the plan's blocks (older checkpoints) plans as before
    legacy = {k: v for k, v in failed.items() if k not in ("blocks", "width")}
    assert (
        "keeping" not in plan_round(PlanningProblem.of(groups, costs, sensitivity, objective, rounds(legacy))).notes[0]
    )


def test_after_a_plan_of_blocks_alone_missed_the_next_round_takes_fewer_blocks_and_no_width(resnet3):
    from profiling_agent.tools.planning.deterministic import plan_round

    groups = _planner_groups(resnet3)
    shares = {"stages.0.layers.0.block": 0.15, "stages.1.layers.0.block": 0.2, "stages.1.layers.1.block": 0.12}
    costs = {
        g["name"]: {
            "latency_share": shares.get(g["name"], 0.1 if g["kind"] == "block" else 0.03),
            "macs_share": 0.05,
            "params_share": 0.05,
        }
        for g in groups
    }
    damage = {"stages.1.layers.0.block": 0.1, "stages.1.layers.1.block": 0.3, "stages.0.layers.0.block": 0.4}
    sensitivity = {g["name"]: {"damage": damage.get(g["name"], 0.2)} for g in groups}
    objective = Objective(target="latency", target_reduction=0.45)
    first = [
        "^resnet\\.encoder\\.stages\\.0\\.layers\\.0$",
        "^resnet\\.encoder\\.stages\\.1\\.layers\\.0$",
        "^resnet\\.encoder\\.stages\\.1\\.layers\\.1$",
    ]
    failed = {"iteration": 1, "goal": 0.47, "gamma": 1.0, "passed": False, "blocks": first, "width": False}
    second = plan_round(PlanningProblem.of(groups, costs, sensitivity, objective, rounds(failed)))
    # the goal halves; one replacement (the cheapest by damage per latency share) fits it and width stays untouched
    assert [e.layer for e in second.plan.pruning] == ["^resnet\\.encoder\\.stages\\.1\\.layers\\.0$"]
    assert "blocks alone" in second.notes[0]
    # it passed: the bisection's next goal (33.5%) takes one more block, still without width
    passed = {
        "iteration": 2,
        "goal": second.target_estimate,
        "gamma": second.gamma,
        "passed": True,
        "blocks": [e.layer for e in second.plan.pruning],
        "width": False,
    }
    third = plan_round(PlanningProblem.of(groups, costs, sensitivity, objective, rounds(failed, passed)))
    stage1 = "^resnet\\.encoder\\.stages\\.1\\.layers\\."
    assert [(e.layer, e.type) for e in third.plan.pruning] == [(stage1 + "0$", "block"), (stage1 + "2$", "block")]
    assert third.target_estimate == pytest.approx(0.3)
    # a failed plan of one replacement plus width: the next round keeps the replacement and adds no width, even
    # where the replacement alone stays below the round's goal (the width fill is what cost the accuracy)
    with_width = {**failed, "goal": 0.5, "blocks": [stage1 + "0$"], "width": True}
    kept = plan_round(PlanningProblem.of(groups, costs, sensitivity, objective, rounds(with_width)))
    assert [e.layer for e in kept.plan.pruning] == [stage1 + "0$"] and "keeping the 1 blocks" in kept.notes[0]
    # the pair alone missed too, and no block fits within the lower goal (15%): the cheapest single block is the
    # smallest step depth has, and it is taken rather than width alone
    pair = [stage1 + "0$", stage1 + "2$"]
    missed = [{**failed, "goal": 0.3, "blocks": pair, "width": True}, {**failed, "goal": 0.3, "blocks": pair}]
    single = plan_round(PlanningProblem.of(groups, costs, sensitivity, objective, rounds(*missed)))
    assert [e.layer for e in single.plan.pruning] == [stage1 + "0$"] and "one block" in single.notes[0]
    # a plan of every block lost 22.95 pp (budget 2): its loss scales the next goal down (not halved), and the
    # cheapest single block, the smallest step depth has, is taken
    every = [{**failed, "goal": 0.57, "blocks": first + [stage1 + "2$"], "drop": 22.95}]
    scaled = plan_round(PlanningProblem.of(groups, costs, sensitivity, objective, rounds(*every)))
    assert "its loss scales the goal to 4.0%" in scaled.notes[0]
    assert [e.layer for e in scaled.plan.pruning] == [stage1 + "0$"] and "one block" in scaled.notes[0]
    # a width-only plan that missed is still halved (its calibration trial corrects it instead)
    halved = plan_round(
        PlanningProblem.of(groups, costs, sensitivity, objective, rounds({**every[0], "blocks": [], "width": True}))
    )
    assert "trying 28.5%" in halved.notes[0]
    # blocks alone that would not go past the passing round are not planned: width fills as before
    at_most = {**passed, "goal": 0.31}
    fourth = plan_round(PlanningProblem.of(groups, costs, sensitivity, objective, rounds(failed, at_most)))
    assert "blocks alone" not in fourth.notes[0] and any(e.type != "block" for e in fourth.plan.pruning)


def test_the_fast_probe_replays_swin_stages_and_measures_what_the_full_probe_does(caplog):
    from helpers.tiny import swin_config
    from transformers import SwinForImageClassification

    from profiling_agent.tools.profiling.sensitivity import probe_groups_full

    model = seeded(SwinForImageClassification, swin_config(depths=[2, 2])).eval()
    with torch.no_grad():  # random weights give nearly equal logits: spread them so the probe's KL is measurable
        model.classifier.weight.mul_(200.0)
    adapter = adapter_for(model)
    groups = adapter.prunable_groups(model) + adapter.block_groups(model)
    pixels = torch.randn(12, 3, 16, 16, generator=torch.Generator().manual_seed(3))
    with caplog.at_level("WARNING"):  # a stage's blocks return (hidden, attention) and stages downsample between
        rows = probe_groups(model, groups, pixels, ratio=0.5, config=FastProbeConfig(eval_images=0))
    assert not caplog.records and all(rows[g.name]["fast"] for g in groups)
    full = probe_groups_full(model, groups, pixels, ratio=0.5)
    with torch.no_grad():
        reference = model(pixels).logits
        skipped = _skipping(model, ["swin.encoder.layers.1.blocks.1"], swin=True)
        direct = compare_logits(reference, skipped(pixels).logits, None)
    assert direct["kl"] > 1e-3 and rows["stages.1.blocks.1.block"]["kl"] == pytest.approx(direct["kl"], rel=1e-4)
    for g in groups:  # the later stage's groups too: replayed from their stage's own inputs
        assert rows[g.name]["kl"] == pytest.approx(full[g.name]["kl"], rel=1e-3, abs=1e-6), g.name
        assert rows[g.name]["agreement"] == pytest.approx(full[g.name]["agreement"]), g.name


def test_a_resnet_with_a_replaced_block_exports_to_onnx_and_openvino_forms_that_match_torch(resnet3, tmp_path):
    from profiling_agent.tools.runtimes.forms import build_forms
    from profiling_agent.tools.runtimes.onnx_model import load_onnx_folder
    from profiling_agent.tools.runtimes.openvino_model import load_openvino_folder

    pruned = copy.deepcopy(resnet3)
    prune_model(
        pruned,
        [{"layer": r"^resnet\.encoder\.stages\.1\.layers\.0$", "type": "block", "ratio": 1.0}],
        _pixels(resnet3, 1),
    )
    x = _pixels(resnet3, 40)
    forms = {f.name: f for f in build_forms(pruned, x[:24], x[24:], tmp_path, forms=["ov_fp32"], threads=1)}
    assert [f.status for f in forms.values()] == ["ok", "ok"], [f.error for f in forms.values()]
    with torch.no_grad():
        ref = pruned(x[:5]).logits
    tolerance = 1e-4 * (1 + ref.abs().max().item())
    for got in (
        load_onnx_folder(Path(forms["ort_fp32"].path), 1),
        load_openvino_folder(Path(forms["ov_fp32"].path), 1),
    ):
        assert (got(pixel_values=x[:5]).logits - ref).abs().max().item() <= tolerance
