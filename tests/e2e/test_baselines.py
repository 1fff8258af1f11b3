"""Tests of the uniform L1/L2/random pruning baselines and their wiring as planners."""

from __future__ import annotations

import copy
import json
import math
import os

import pytest
import torch
from pydantic import ValidationError

from profiling_agent.state import Objective, group_rows
from profiling_agent.tools.compression.baselines import (
    check_ratio,
    is_baseline,
    prune_uniform,
    uniform_entries,
    uniform_plan,
    uniform_removals,
)
from profiling_agent.tools.compression.families import adapter_for
from profiling_agent.tools.compression.units import match_groups


def _x(model, batch=2):
    channels = model.config.num_channels
    size = getattr(model.config, "image_size", 16)
    return torch.randn(batch, channels, size, size, generator=torch.Generator().manual_seed(0))


def _removed(report, group):
    return next(row.removed for row in report.applied if row.group == group)


@pytest.mark.parametrize("fixture", ["tiny_vit", "tiny_resnet", "tiny_resnet_basic"])
@pytest.mark.parametrize("ratio", [0.1, 0.3, 0.5])
def test_each_group_loses_the_floor_of_its_units(request, fixture, ratio):
    model = request.getfixturevalue(fixture)
    groups = adapter_for(model).prunable_groups(model)
    expected = {g.name: g.units - max(0, min(math.floor(g.units * ratio), g.units - g.min_units)) for g in groups}
    report = prune_uniform(model, ratio, _x(model), importance="l2")
    after = {row.group: row.units_after for row in report.applied}
    assert after == expected  # every group is targeted, each at floor(units * ratio)
    assert uniform_removals(groups, ratio) == {g.name: g.units - expected[g.name] for g in groups}
    live = {g.name: g.units for g in adapter_for(model).prunable_groups(model)}
    assert live == expected  # the weights really shrank
    shrank = any(expected[g.name] < g.units for g in groups)
    assert (report.params_after < report.params_before) == shrank
    with torch.inference_mode():
        assert model(pixel_values=_x(model)).logits.shape == (2, 10)


def test_vit_heads_and_mlp_counts(tiny_vit):
    report = prune_uniform(tiny_vit, 0.3, _x(tiny_vit), importance="l1")
    rows = {row.group: row for row in report.applied}
    assert rows["layers.0.mlp"].units_after == 64 - 19  # floor(64 * 0.3)
    assert rows["layers.0.heads"].units_after == 4 - 1  # floor(4 * 0.3)
    assert tiny_vit.vit.layers[0].attention.q_proj.out_features == 3 * 8


def test_random_is_reproducible_by_seed_and_differs_across_seeds(tiny_vit):
    x = _x(tiny_vit)
    reports = {}
    for name, seed in (("a", 0), ("b", 0), ("c", 1)):
        reports[name] = prune_uniform(copy.deepcopy(tiny_vit), 0.5, x, importance="random", seed=seed)
    groups = [row.group for row in reports["a"].applied]
    assert [_removed(reports["a"], g) for g in groups] == [_removed(reports["b"], g) for g in groups]
    assert [_removed(reports["a"], g) for g in groups] != [_removed(reports["c"], g) for g in groups]


def test_l1_and_l2_pick_different_units_where_norms_disagree(tiny_vit):
    # Channel 0 of layer 0's MLP has one weight 3 (L1 3, L2 3); channel 1 has four weights 1 (L1 4, L2 2);
    # every other channel is all ones (L1 64, L2 8). Removing one unit: L1 takes channel 0, L2 channel 1.
    mlp = tiny_vit.vit.layers[0].mlp
    with torch.no_grad():
        mlp.fc1.weight.fill_(1.0)
        mlp.fc1.bias.zero_()
        mlp.fc2.weight.fill_(1.0)
        for ch in (0, 1):
            mlp.fc1.weight[ch].zero_()
            mlp.fc2.weight[:, ch].zero_()
        mlp.fc1.weight[0, 0] = 3.0
        mlp.fc1.weight[1, :4] = 1.0
    ratio = 1.5 / 64  # floor(64 * ratio) = 1
    x = _x(tiny_vit)
    l1 = prune_uniform(copy.deepcopy(tiny_vit), ratio, x, importance="l1")
    l2 = prune_uniform(copy.deepcopy(tiny_vit), ratio, x, importance="l2")
    assert _removed(l1, "layers.0.mlp") == [0]
    assert _removed(l2, "layers.0.mlp") == [1]


def test_uniform_plan_targets_every_group_and_quantizes_as_asked(tiny_resnet, tiny_vit):
    for model in (tiny_resnet, tiny_vit):
        groups = adapter_for(model).prunable_groups(model)
        plan = uniform_plan(groups, 0.2, "l1", quantize="qint8")
        assert set(match_groups(groups, plan.pruning)) == {g.name for g in groups}
        assert set(match_groups(groups, plan.pruning).values()) == {0.2}
        assert [q.dtype for q in plan.quantization] == ["qint8"]
    rows = group_rows([{"name": "a", "kind": "structured", "module": "a", "units": 10, "min_units": 1}], {}, {})
    plan = uniform_plan(rows, 0.2, "random", quantize="none")
    assert [e.type for e in plan.pruning] == ["structured"] and plan.quantization == []
    assert "random" in plan.rationale


def test_bad_ratio_and_planner():
    for bad in (None, 0.0, 1.0, -0.1, 1.5):
        with pytest.raises(ValueError):
            check_ratio(bad)
    with pytest.raises(ValueError):
        uniform_plan([], 0.2, "l3")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        uniform_entries(["head"], 1.0)
    assert is_baseline("l1") and is_baseline("random") and not is_baseline("deterministic")


def test_objective_requires_ratio_for_baselines_only():
    assert Objective(planner="l2", ratio=0.1).ratio == 0.1
    with pytest.raises(ValidationError, match="needs a ratio"):
        Objective(planner="random")
    with pytest.raises(ValidationError, match="applies only"):
        Objective(planner="deterministic", ratio=0.1)
    with pytest.raises(ValidationError):
        Objective(planner="l1", ratio=1.0)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--planner", "l1"], "needs a ratio"),
        (["--planner", "auto", "--ratio", "0.2"], "applies only"),
        (["--planner", "l2", "--ratio", "2"], "--ratio"),
    ],
)
def test_cli_rejects_bad_baseline_flags(tmp_path, capsys, argv, message):
    from profiling_agent.graph.cli.args import EXIT_BAD_INPUT
    from profiling_agent.graph.cli.main import main

    assert main(["run", "--run-dir", str(tmp_path), *argv]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1 and "Traceback" not in err


@pytest.mark.slow
def test_baseline_planner_runs_one_iteration_through_the_graph(tmp_path, tiny_vit, monkeypatch):
    from transformers.models.vit.image_processing_pil_vit import ViTImageProcessorPil

    from profiling_agent.graph.builder import build_graph
    from profiling_agent.graph.checkpoint import open_checkpointer
    from profiling_agent.state import Context
    from profiling_agent.tools.models import embedded

    monkeypatch.setenv("PROFILING_AGENT_CACHE", str(tmp_path / "cache"))
    dataset = embedded.ensure_dataset()
    model_dir = tmp_path / "tiny"
    tiny_vit.config.id2label = {i: str(i) for i in range(10)}
    tiny_vit.config.label2id = {str(i): i for i in range(10)}
    tiny_vit.save_pretrained(model_dir)
    size = {"height": 16, "width": 16}
    ViTImageProcessorPil(size=size, image_mean=[0.5], image_std=[0.5]).save_pretrained(model_dir)
    inputs = {
        "model": {"ref": str(model_dir)},
        "dataset": {"ref": str(dataset), "subset": 64, "calibration": 16},
        "objective": {"planner": "l2", "ratio": 0.3, "iterations": 5, "quantize": "none", "max_acc_drop": 100},
    }
    graph = build_graph(checkpointer=open_checkpointer(tmp_path))
    ctx = Context(
        run_root=str(tmp_path), latency_repeats=2, latency_warmup=1, latency_batch=4, threads=1, backend="torch"
    )
    out = graph.invoke(inputs, {"configurable": {"thread_id": "t"}}, context=ctx, durability="sync")
    assert out["status"] == "done"
    assert [c["iteration"] for c in out["candidates"]] == [1]  # one iteration, not five
    assert out.get("sensitivity") is None  # no probe for a uniform plan
    assert "stopped after 1 iteration" in out["stop_reason"] or out["stop_reason"].startswith("objective met")
    cand = out["candidates"][0]
    assert cand["planner"] == "l2" and cand["status"] == "ok"
    units = {row["group"]: (row["units_before"], row["units_after"]) for row in cand["applied"]}
    assert units["layers.0.mlp"] == (64, 64 - 19) and units["layers.1.heads"] == (4, 3)
    plan = json.loads((tmp_path / "t" / "iter_01" / "plan.json").read_text())
    assert plan["planner"] == "l2" and {e["ratio"] for e in plan["plan"]["pruning"]} == {0.3}
    assert os.path.isdir(tmp_path / "t" / "best")
