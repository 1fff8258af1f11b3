import re

import pytest
from helpers.search_trials import rounds

from profiling_agent.state import CompressionPlan, GroupRow, Objective, PlanningProblem, group_rows
from profiling_agent.tools.planning.deterministic import (
    PlannerConfig,
    effective_ratio,
    estimate_reduction,
    next_goal,
    plan_round,
)

GROUPS = [
    {"name": "layers.0.mlp", "kind": "structured", "module": "vit.layers.0.mlp.fc1", "units": 128, "min_units": 1},
    {"name": "layers.0.heads", "kind": "head", "module": "vit.layers.0.attention", "units": 4, "min_units": 1},
    {"name": "layers.1.mlp", "kind": "structured", "module": "vit.layers.1.mlp.fc1", "units": 128, "min_units": 1},
    {"name": "layers.1.heads", "kind": "head", "module": "vit.layers.1.attention", "units": 4, "min_units": 1},
]
COSTS = {
    "layers.0.mlp": {"params_share": 0.3, "macs_share": 0.3, "latency_share": 0.25},
    "layers.0.heads": {"params_share": 0.15, "macs_share": 0.2, "latency_share": 0.25},
    "layers.1.mlp": {"params_share": 0.3, "macs_share": 0.3, "latency_share": 0.25},
    "layers.1.heads": {"params_share": 0.15, "macs_share": 0.2, "latency_share": 0.25},
}
SENS = {
    "layers.0.mlp": {"damage": 0.01},
    "layers.0.heads": {"damage": 0.5},
    "layers.1.mlp": {"damage": 0.2},
    "layers.1.heads": {"damage": 0.05},
}


def _ratios(plan: CompressionPlan) -> dict[str, float]:
    out = {}
    for entry in plan.pruning:
        for g in GROUPS:
            if g["kind"] == entry.type and re.search(entry.layer, g["module"]):
                out[g["name"]] = entry.ratio
    return out


def test_effective_ratio_floors_and_keeps_min_units():
    assert effective_ratio(4, 1, 0.3) == 0.25
    assert effective_ratio(4, 1, 0.2) == 0.0
    assert effective_ratio(4, 1, 0.99) == 0.75
    assert effective_ratio(10, 1, 0.5) == 0.5


def test_planned_channel_widths_are_whole_blocks_and_the_engine_floor_removes_exactly_them():
    from profiling_agent.tools.compression.units import removed_units, unit_align
    from profiling_agent.tools.planning.ratio_solver import aligned_ratio

    assert [unit_align("structured", n) for n in (8, 16, 31, 32, 3072)] == [1, 8, 8, 16, 16]
    assert unit_align("head", 64) == 1  # heads are whole units already
    assert removed_units(64, 1, 0.3, 16) == 16  # 19 removed -> 45 kept -> 48 kept
    assert removed_units(64, 1, 0.1, 16) == 0  # 58 kept rounds back up to 64
    assert removed_units(16, 1, 0.34, 8) == 8  # 11 kept -> 8
    assert removed_units(64, 1, 0.99, 16) == 48  # at least one block stays
    assert removed_units(47, 1, 0.05, 16) == 0  # never more than the group has
    for units, ratio in ((16, 0.34), (32, 0.45), (64, 0.3), (3072, 0.437), (12, 0.3)):
        group = GroupRow(name="g", module="m", kind="structured", units=units, min_units=1)
        r = aligned_ratio(group, ratio)
        kept = units - removed_units(units, 1, r)  # what the engine does with the emitted ratio
        assert kept % unit_align("structured", units) == 0 and kept > 0, (units, ratio, kept)
    assert (
        aligned_ratio(GroupRow(name="g", module="m", kind="structured", units=64, min_units=1), 0.7, cap=0.7) == 0.5
    )  # 48 > cap
    assert aligned_ratio(GroupRow(name="g", module="m", kind="head", units=12, min_units=1), 0.3) == 3 / 12
    # the matched-budget bench plans in whole units, as its uniform and global peers do
    assert (
        aligned_ratio(GroupRow(name="g", module="m", kind="structured", units=64, min_units=1), 0.3, align=False)
        == 19 / 64
    )


def test_round_one_hits_the_target_estimate_and_prefers_insensitive_groups():
    objective = Objective(target="params", target_reduction=0.3, quantize="qint8")
    result = plan_round(PlanningProblem.of(GROUPS, COSTS, SENS, objective, []))
    ratios = _ratios(result.plan)
    assert result.target_estimate >= 0.3
    assert estimate_reduction(ratios, group_rows(GROUPS, COSTS, {}), "params") == pytest.approx(result.target_estimate)
    # same cost, lower damage -> higher ratio
    assert ratios["layers.0.mlp"] > ratios.get("layers.1.mlp", 0.0)
    # plans are valid by construction and every regex matches exactly one group
    CompressionPlan.model_validate(result.plan.model_dump())
    for entry in result.plan.pruning:
        assert sum(bool(re.search(entry.layer, g["module"])) and g["kind"] == entry.type for g in GROUPS) == 1
        assert entry.justification
    assert [q.dtype for q in result.plan.quantization] == ["qint8"]


def test_no_quantization_when_disabled():
    result = plan_round(PlanningProblem.of(GROUPS, COSTS, SENS, Objective(quantize="none"), []))
    assert result.plan.quantization == []


def test_feedback_backs_off_after_a_miss_and_pushes_after_a_hit():
    config = PlannerConfig()
    objective = Objective(target_reduction=0.4)
    goal, gamma, converged, _ = next_goal(rounds({"goal": 0.4, "gamma": 1.0, "passed": False}), objective, 0.7, config)
    assert goal < 0.4 and gamma > 1.0 and not converged
    goal2, gamma2, _, _ = next_goal(rounds({"goal": 0.4, "gamma": 1.0, "passed": True}), objective, 0.7, config)
    assert goal2 > 0.4 and gamma2 < 1.0
    # bisection between a hit and a miss
    hist = [{"goal": 0.2, "gamma": 1.0, "passed": True}, {"goal": 0.4, "gamma": 1.0, "passed": False}]
    goal3, _, _, _ = next_goal(rounds(*hist), objective, 0.7, config)
    assert goal3 == pytest.approx(0.3)
    # converged when the interval is tiny
    hist = [{"goal": 0.300, "gamma": 1.0, "passed": True}, {"goal": 0.305, "gamma": 1.0, "passed": False}]
    assert next_goal(rounds(*hist), objective, 0.7, config)[2] is True


def test_later_round_with_a_miss_prunes_less():
    objective = Objective(target_reduction=0.4)
    first = plan_round(PlanningProblem.of(GROUPS, COSTS, SENS, objective, []))
    second = plan_round(
        PlanningProblem.of(
            GROUPS,
            COSTS,
            SENS,
            objective,
            rounds({"goal": first.target_estimate, "gamma": first.gamma, "passed": False}),
        )
    )
    assert second.target_estimate < first.target_estimate


def test_no_groups_gives_quantization_only_plan():
    result = plan_round(PlanningProblem.of([], {}, {}, Objective(), []))
    assert result.plan.pruning == [] and result.plan.quantization


def test_quantization_dropped_after_it_measurably_slowed_the_model():
    objective = Objective(target="params", quantize="qint8")
    slow = [
        {"iteration": 1, "goal": 0.3, "gamma": 1.0, "passed": True, "quant_speedup": 0.7, "quant_speedup_batch": 0.8}
    ]
    result = plan_round(PlanningProblem.of(GROUPS, COSTS, SENS, objective, rounds(*slow)))
    assert result.plan.quantization == [] and "quantization dropped" in result.plan.rationale
    fast = [{**slow[0], "quant_speedup": 1.5, "quant_speedup_batch": 2.0}]
    assert plan_round(PlanningProblem.of(GROUPS, COSTS, SENS, objective, rounds(*fast))).plan.quantization
    # size is what quantization is for: kept even when slower
    sized = plan_round(PlanningProblem.of(GROUPS, COSTS, SENS, Objective(target="size"), rounds(*slow)))
    assert sized.plan.quantization


def test_after_quantization_cost_speed_the_same_pruning_is_repeated_without_it():
    objective = Objective(target="params", target_reduction=0.3, quantize="qint8")
    first = plan_round(PlanningProblem.of(GROUPS, COSTS, SENS, objective, []))
    slow = [
        {
            "iteration": 1,
            "goal": first.target_estimate,
            "gamma": first.gamma,
            "passed": True,
            "quant_speedup": 0.7,
            "quant_speedup_batch": 0.8,
        }
    ]
    second = plan_round(PlanningProblem.of(GROUPS, COSTS, SENS, objective, rounds(*slow)))
    assert second.plan.quantization == []
    assert [(e.layer, e.ratio) for e in second.plan.pruning] == [(e.layer, e.ratio) for e in first.plan.pruning]


def test_a_rejected_level_caps_the_search_even_where_accuracy_held():
    config, objective = PlannerConfig(), Objective(target_reduction=0.4)
    hist = [{"goal": 0.3, "gamma": 1.0, "passed": True}, {"goal": 0.3, "gamma": 1.0, "passed": False, "rejected": True}]
    goal, _, converged, _ = next_goal(rounds(*hist), objective, 0.7, config)
    assert goal < 0.3 and not converged


@pytest.mark.parametrize("refused", [{"passed": False, "rejected": True}, {"passed": False}])
def test_a_round_after_a_refused_plan_is_strictly_milder_even_when_whole_units_round_back_up(refused):
    # two heads of four: removable shares come in steps of a quarter, so half the refused goal rounds back up to it
    groups = [g for g in GROUPS if g["kind"] == "head"]
    costs = {g["name"]: {"params_share": 0.5, "macs_share": 0.5, "latency_share": 0.5} for g in groups}
    objective = Objective(target="params", target_reduction=0.25, quantize="none")
    first = plan_round(PlanningProblem.of(groups, costs, SENS, objective, []))
    history = [{"goal": first.target_estimate, "gamma": first.gamma, **refused}]
    second = plan_round(PlanningProblem.of(groups, costs, SENS, objective, rounds(*history)))
    assert 0 < first.target_estimate and second.target_estimate < first.target_estimate
    assert sum(_ratios(second.plan).values()) < sum(_ratios(first.plan).values())


def test_no_whole_unit_plan_between_a_kept_and_a_refused_goal_converges():
    groups = [g for g in GROUPS if g["name"] == "layers.0.heads"]  # one group of four heads: steps of a quarter
    costs = {"layers.0.heads": {"params_share": 1.0, "macs_share": 1.0, "latency_share": 1.0}}
    objective = Objective(target="params", target_reduction=0.6, quantize="none")
    history = [
        {"goal": 0.25, "gamma": 1.0, "passed": True},
        {"goal": 0.5, "gamma": 1.0, "passed": False, "rejected": True},
    ]
    result = plan_round(PlanningProblem.of(groups, costs, SENS, objective, rounds(*history)))
    assert result.converged and "no plan of whole heads and channels" in result.notes[0]
    assert result.target_estimate == pytest.approx(0.25)
