"""Matched budgets: the knob solver hits its budget; Torch-Pruning's global ranking prunes through our engine."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from budget import solve_knob
from estimate import estimate_pruning
from global_pruning import global_removals, removal_entries, unit_scores

from profiling_agent.tools.compression.baselines import uniform_entries
from profiling_agent.tools.compression.families import adapter_for
from profiling_agent.tools.compression.pruning import prune_model
from profiling_agent.tools.models.sizes import count_params


def test_the_solver_hits_a_smooth_budget_within_tolerance():
    solved = solve_knob(lambda k: 0.8 * k**2, 0.3, 0.0, 1.0)
    assert solved.matched and abs(solved.reduction - 0.3) <= 0.01
    assert solved.reduction == pytest.approx(0.8 * solved.knob**2)


def test_a_step_function_is_matched_when_a_step_lands_near_the_budget():
    steps = lambda k: math.floor(k * 50) / 50  # noqa: E731  (2-point steps)
    solved = solve_knob(steps, 0.305, 0.0, 0.95)
    assert solved.matched and abs(solved.reduction - 0.305) <= 0.01


def test_a_jump_over_the_budget_is_reported_unmatched_with_the_closest_reduction():
    jump = lambda k: 0.1 if k < 0.5 else 0.4  # noqa: E731
    solved = solve_knob(jump, 0.3, 0.0, 1.0)
    assert not solved.matched and solved.reduction == 0.4  # |0.4 - 0.3| < |0.1 - 0.3|
    assert any(r == 0.1 for _, r in solved.tried) and any(r == 0.4 for _, r in solved.tried)


def test_bad_targets_are_refused():
    with pytest.raises(ValueError, match="target"):
        solve_knob(lambda k: k, 1.2, 0.0, 1.0)
    with pytest.raises(ValueError, match="interval"):
        solve_knob(lambda k: k, 0.2, 0.5, 0.5)


@pytest.mark.parametrize("fixture", ["tiny_vit", "tiny_resnet"])
def test_uniform_pruning_solved_to_a_budget_removes_that_fraction(request, fixture):
    model = request.getfixturevalue(fixture)
    adapter = adapter_for(model)
    kinds = {g.kind for g in adapter.prunable_groups(model)}

    def reduction(ratio: float) -> float:
        return estimate_pruning(model, uniform_entries(kinds, ratio, "l2"), adapter=adapter)["params_fraction_removed"]

    solved = solve_knob(reduction, 0.2, 1e-4, 0.95)
    pruned = copy.deepcopy(model)
    report = prune_model(pruned, uniform_entries(kinds, solved.knob, "l2"), torch.zeros(1, 1, 16, 16))
    actual = 1 - report.params_after / report.params_before
    assert actual == pytest.approx(solved.reduction, abs=1e-9)  # the estimate the solver used is exact
    # tiny models move in big steps; the solver lands on the closest one
    assert abs(actual - 0.2) == pytest.approx(min(abs(r - 0.2) for _, r in solved.tried), abs=1e-12)


@pytest.mark.parametrize("criterion", ["magnitude", "taylor"])
def test_torch_pruning_global_ranking_removes_its_units_through_our_engine(tiny_vit, criterion):
    torch.manual_seed(0)
    pixels, labels = torch.randn(8, 1, 16, 16), torch.randint(0, 10, (8,))
    before = {k: v.clone() for k, v in tiny_vit.state_dict().items()}
    scores = unit_scores(tiny_vit, pixels[:1], criterion, pixels=pixels, labels=labels)
    assert all(v.equal(tiny_vit.state_dict()[k]) for k, v in before.items())  # scoring changes nothing
    assert all(p.grad is None for p in tiny_vit.parameters())
    groups = adapter_for(tiny_vit).prunable_groups(tiny_vit)
    assert set(scores) == {g.name for g in groups}
    for g in groups:  # normalized per group as Torch-Pruning's normalizer="mean" does
        assert scores[g.name].shape == (g.units,) and scores[g.name].mean() == pytest.approx(1.0)
    removals = global_removals(groups, scores, 0.3)
    pool = sum(g.units for g in groups)
    assert sum(len(u) for u in removals.values()) == math.floor(0.3 * pool)
    for g in groups:
        assert g.units - len(removals[g.name]) >= max(1, g.min_units)
        kept = [s for u, s in enumerate(scores[g.name].tolist()) if u not in removals[g.name]]
        gone = [scores[g.name][u].item() for u in removals[g.name]]
        assert not gone or not kept or max(gone) <= max(kept)  # never drops a group's best unit before a worse
    entries = removal_entries(groups, removals)
    estimate = estimate_pruning(tiny_vit, entries)
    pruned = copy.deepcopy(tiny_vit)
    report = prune_model(pruned, entries, pixels[:1], chosen=removals)
    assert {row.group: row.removed for row in report.applied} == {
        name: units for name, units in removals.items() if units
    }
    assert count_params(pruned) == estimate["params_after"]
    assert torch.isfinite(pruned(pixel_values=pixels).logits).all()


def test_chosen_units_that_disagree_with_the_entries_are_refused(tiny_vit):
    from profiling_agent.tools.compression.units import PruneError

    group = adapter_for(tiny_vit).prunable_groups(tiny_vit)[0]
    entries = removal_entries([group], {group.name: [0, 1]})
    with pytest.raises(PruneError, match="do not match"):
        prune_model(copy.deepcopy(tiny_vit), entries, torch.zeros(1, 1, 16, 16), chosen={group.name: [0]})
