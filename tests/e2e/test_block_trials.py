"""Round 1's block-set trials: which sets are tried, which one is kept, and the recipe after removing blocks."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from helpers.tiny import seeded, vit_config
from transformers import ViTForImageClassification

from profiling_agent.state import CompressionPlan, Objective, PlanningProblem, Trial, group_rows
from profiling_agent.tools.compression.families import adapter_for
from profiling_agent.tools.evaluation.metrics import mean_kl
from profiling_agent.tools.planning.block_trials import block_sets, choose_block_set
from profiling_agent.tools.planning.deterministic import Steering, plan_round
from profiling_agent.tools.planning.round import RoundData, tried_block_sets
from profiling_agent.tools.recovery.policy import BATCH, DEPTH_BATCH, DEPTH_LR, LR, auto_recipe

DAMAGE = {"layers.0.block": 1.0, "layers.1.block": 0.5, "layers.2.block": 0.05, "layers.3.block": 0.3}


@pytest.fixture(scope="module")
def planned():
    """A 4-layer tiny ViT's planner groups, costs (a layer is a fifth of the latency) and probe damage."""
    model = seeded(ViTForImageClassification, vit_config(num_hidden_layers=4))
    adapter = adapter_for(model)
    groups = [dataclasses.asdict(g) for g in (*adapter.prunable_groups(model), *adapter.block_groups(model))]
    costs = {g["name"]: {"latency_share": 0.2 if g["kind"] == "block" else 0.01} for g in groups}
    sensitivity = {g["name"]: {"damage": DAMAGE.get(g["name"], 0.001)} for g in groups}
    return groups, costs, sensitivity


def _latency(groups, costs):
    return {g["name"]: costs[g["name"]]["latency_share"] for g in groups}


def test_the_planners_set_comes_first_then_the_other_sets_of_as_many_blocks_cheapest_first(planned):
    groups, costs, sensitivity = planned
    chosen = ["layers.3.block", "layers.2.block"]
    sets = block_sets(group_rows(groups, costs, sensitivity), 0.5, chosen, limit=4)
    # probe cost per set = damage / 0.2 summed: (1, 2) 2.75, (1, 3) 4.0, (0, 2) 5.25, (0, 3) 6.5, (0, 1) 7.5
    assert sets == [
        ["layers.2.block", "layers.3.block"],
        ["layers.1.block", "layers.2.block"],
        ["layers.1.block", "layers.3.block"],
        ["layers.0.block", "layers.2.block"],
    ]
    assert len(block_sets(group_rows(groups, costs, sensitivity), 0.5, chosen)) == 6  # every pair
    assert block_sets(group_rows(groups, costs, sensitivity), 0.5, []) == []
    # a stack gives at most half its blocks: three of four layers is no set at all, so the planner's stays alone
    three = ["layers.1.block", "layers.2.block", "layers.3.block"]
    assert block_sets(group_rows(groups, costs, sensitivity), 0.5, three) == [three]


def test_the_set_closest_to_the_baseline_after_its_trial_is_kept_and_ties_keep_the_cheaper(planned):
    groups, costs, sensitivity = planned
    objective = Objective(target="latency", target_reduction=0.4)
    sets = [["layers.2.block", "layers.3.block"], ["layers.1.block", "layers.2.block"], ["layers.0.block"]]
    kl = {("layers.2.block", "layers.3.block"): 0.3, ("layers.1.block", "layers.2.block"): 0.1}

    def plan_for(names):
        result = plan_round(PlanningProblem.of(groups, costs, sensitivity, objective, []), steer=Steering(blocks=names))
        return result.plan, result.target_estimate

    def trial(plan):
        blocks = tuple(sorted(e.layer.strip("^$").replace("\\", "").split(".", 1)[1] + ".block"
                              for e in plan.pruning if e.type == "block"))  # fmt: skip
        return Trial(kl_to_baseline=kl.get(blocks, 0.1), accuracy_drop_pp=1.0)

    best, records, plans = choose_block_set(sets + [["layers.0.block", "layers.1.block"]], plan_for, trial, 0.4)
    # the one-block set cannot reach the goal (width is 1% of the latency here): it would win by removing less
    assert best == 1 and [r.kl for r in records] == [0.3, 0.1, 0.1]  # the third ties the second: later, not kept
    assert [r.blocks for r in records] == [sets[0], sets[1], ["layers.0.block", "layers.1.block"]]
    assert records[1].estimate >= 0.4 and len(plans) == 3
    assert choose_block_set(sets, plan_for, trial, 0.4, limit=1) == (0, [], [])  # one set: nothing to choose

    def failing(plan):
        if any("layers\\.1" in e.layer for e in plan.pruning):
            raise RuntimeError("pruning failed\nwith a traceback")
        return trial(plan)

    best, records, _ = choose_block_set(sets[:2], plan_for, failing, 0.4)
    assert best == 0 and records[1].kl is None and records[1].error == "pruning failed"  # its first line


def test_a_set_is_tried_when_its_estimate_reaches_the_target_even_below_the_planners_own():
    plan = CompressionPlan(pruning=[], quantization=[], rationale="")
    estimates = {"a": 0.455, "b": 0.439, "c": 0.385, "d": 0.395}  # the zoo ResNet's sets: 45.5% and 43.9%
    tried = []

    def trial(p):
        tried.append(p)
        return Trial(kl_to_baseline=0.1, accuracy_drop_pp=0.0)

    _, records, _ = choose_block_set([["a"], ["b"], ["c"], ["d"]], lambda n: (plan, estimates[n[0]]), trial, 0.4)
    assert [r.blocks for r in records] == [["a"], ["b"], ["d"]]  # c falls 1.5 points short of the 40% target
    _, records, _ = choose_block_set([["c"], ["a"], ["d"]], lambda n: (plan, estimates[n[0]]), trial, 0.4)
    assert [r.blocks for r in records] == [["c"], ["a"], ["d"]]  # the planner's own short of it sets the floor


def test_a_given_block_set_is_the_one_planned_and_width_fills_the_rest_of_the_goal(planned):
    groups, costs, sensitivity = planned
    objective = Objective(target="latency", target_reduction=0.4)
    own = plan_round(PlanningProblem.of(groups, costs, sensitivity, objective, []))
    assert {e.layer for e in own.plan.pruning if e.type == "block"} == {
        r"^vit\.layers\.2$",
        r"^vit\.layers\.3$",
    }
    forced = plan_round(
        PlanningProblem.of(groups, costs, sensitivity, objective, []), steer=Steering(blocks=["layers.0.block"])
    )
    assert [e.layer for e in forced.plan.pruning if e.type == "block"] == [r"^vit\.layers\.0$"]
    assert any(e.type != "block" for e in forced.plan.pruning)  # one block short of the goal: width adds what it can
    assert forced.target_estimate < own.target_estimate - 0.1  # (1% of the latency per width group here)


def test_round_one_keeps_the_trials_best_set_and_says_why(planned):
    groups, costs, sensitivity = planned
    objective = Objective(target="latency", target_reduction=0.4)
    result = plan_round(PlanningProblem.of(groups, costs, sensitivity, objective, []))
    calls = []

    def evaluator(n):
        calls.append(n)

        def evaluate(plan):
            removed = {e.layer for e in plan.pruning if e.type == "block"}
            return Trial(kl_to_baseline=0.05 if r"^vit\.layers\.1$" in removed else 0.2, accuracy_drop_pp=2.0)

        return evaluate

    data = RoundData(PlanningProblem.of(groups, costs, sensitivity, objective, []))
    kept, records = tried_block_sets(result, data, evaluator)
    assert calls == [4] and len(records) == 4 and records[0].blocks == ["layers.2.block", "layers.3.block"]
    assert records[1].blocks == ["layers.1.block", "layers.2.block"]
    assert r"^vit\.layers\.1$" in {e.layer for e in kept.plan.pruning}
    assert "Blocks chosen by trial" in kept.plan.rationale
    assert tried_block_sets(result, data, lambda n: None) == (result, None)
    assert tried_block_sets(result, data, None) == (result, None)


def test_after_removing_blocks_auto_distils_at_a_higher_rate_and_batch_on_a_small_model():
    assert auto_recipe(0.0, 0, 100_000) == (LR, BATCH)
    assert auto_recipe(0.0, 0, 100_000, removed_blocks=2) == (DEPTH_LR, DEPTH_BATCH)
    assert auto_recipe(5e-4, 16, 100_000, removed_blocks=2) == (5e-4, 16)  # what the user set stays
    assert auto_recipe(0.0, 0, 90_000_000, removed_blocks=2) == (LR, BATCH)  # a big model: as before


def test_mean_kl_is_zero_for_the_same_logits_and_reads_only_the_allowed_classes():
    ref = torch.tensor([[2.0, 0.0, -1.0], [0.0, 1.0, 0.0]])
    assert mean_kl(ref, ref) == pytest.approx(0.0, abs=1e-7)
    other = ref.clone()
    other[:, 2] += 5.0  # a class outside the dataset's labels
    assert mean_kl(ref, other) > 0.5 and mean_kl(ref, other, allowed_ids=[0, 1]) == pytest.approx(0.0, abs=1e-7)


def _width_buys_nothing(real):
    """Wrap `latency_model.cached_table`: the measured table with every width group's time kept at ratio 0's."""

    def table(*args, **kwargs):
        measured = real(*args, **kwargs)
        return {**measured, "groups": {k: [v[0]] * len(v) for k, v in measured["groups"].items()}}

    return table


def test_class_ids_of_logits_are_what_predict_gives_so_a_kl_trial_needs_one_forward_pass():
    from profiling_agent.tools.evaluation.metrics import class_ids, predict
    from profiling_agent.tools.runtimes.forward import batched_logits

    model = seeded(ViTForImageClassification, vit_config(num_hidden_layers=1))
    pixels = torch.randn(9, 1, 16, 16, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        logits = batched_logits(model, pixels, batch_size=4)
    for allowed in (None, [1, 3], torch.tensor([0, 2, 3])):
        assert torch.equal(class_ids(logits, allowed), predict(model, pixels, allowed_ids=allowed))
    assert set(class_ids(logits, [1, 3]).tolist()) <= {1, 3}


@pytest.mark.slow
def test_a_latency_run_tries_block_sets_in_round_one_and_applies_the_closest(tmp_path, monkeypatch):
    import json

    from profiling_agent.graph.cli.main import main
    from profiling_agent.tools.profiling import latency_model, planning_latency

    # Whether width alone reaches 20% on a 0.05 ms model is the timing of the machine at hand (it did on CI's, where
    # the plan then removed no block and nothing was tried); with the table flat in width, only blocks reach it.
    # ONNX Runtime's forms have such a table and build in a fraction of OpenVINO's time (torch's plan reads none).
    monkeypatch.setattr(latency_model, "cached_table", _width_buys_nothing(latency_model.cached_table))
    monkeypatch.setattr(planning_latency, "records_dir", lambda: tmp_path / "records")  # not the machine's record
    code = main(["run", "--model", "embedded:resnet-digits", "--target", "latency", "--target-reduction", "0.2",
                 "--iterations", "1", "--recover-steps", "8", "--subset", "120", "--test-subset", "120",
                 "--repeats", "2", "--threads", "1", "--run-dir", str(tmp_path), "--thread-id", "trials",
                 "--backend", "onnxruntime"])  # fmt: skip
    assert code == 0
    (cand,) = json.loads((tmp_path / "trials" / "result.json").read_text())["candidates"]
    trials = cand["block_trials"]
    assert len(trials) >= 2 and all(isinstance(t["kl"], float) and t["kl"] >= 0 for t in trials)
    best = min(trials, key=lambda t: t["kl"])
    applied = {e["layer"] for e in cand["plan"]["pruning"] if e["type"] == "block"}
    assert len(applied) == len(best["blocks"]) and all(
        any(name.removesuffix(".block").replace(".", "\\.") in layer for layer in applied) for name in best["blocks"]
    )
