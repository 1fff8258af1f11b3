"""Past a met target: one more round while the budget left room, its goal the largest one its corrected trials allow."""

from __future__ import annotations

import pytest
from helpers.eval_records import candidate, evaluation
from helpers.search_trials import history_round as _round
from helpers.search_trials import synthetic as _synthetic

from profiling_agent.state import Objective
from profiling_agent.tools.evaluation.selection import push_due, select_best, stop_reason
from profiling_agent.tools.planning.error_model import RECOVERY_PRIOR, fit_correction, history_correction
from profiling_agent.tools.planning.search import PushBounds, push_step

BASE = evaluation(accuracy=90.0, params=1000)


def test_the_prior_slope_stands_until_two_rounds_differ():
    assert fit_correction([], prior_slope=0.2)(10.0) == pytest.approx(2.0)
    one = fit_correction([(5.0, 1.5)], [0.4], prior_slope=0.2)  # measured 1.5 where the trial said 5: +0.5 beside 0.2x
    assert (one.additive, one.multiplicative) == pytest.approx((0.5, 0.2))
    assert fit_correction([(5.0, 1.5)], [0.4]).as_list() == [-3.5, 1.0]  # without a prior: the additive term alone
    two = fit_correction([(2.0, 1.0), (6.0, 3.0)], [0.3, 0.4], prior_slope=0.2)  # two rounds differ: their own slope
    assert two.multiplicative == pytest.approx(0.5)
    assert history_correction([_round(0.37, True, -2.9, 0.0)], prior_slope=0.2).as_list() == [-2.9, 0.2]
    assert "recovery prior" in fit_correction([], prior_slope=0.2).describe()


def test_a_push_takes_the_largest_feasible_goal_when_its_corrected_trial_fits():
    history = [_round(0.37, True, -2.9, 0.0)]  # round 1 gained 2.9 pp where its trial said 0
    plan_at, trial, calls = _synthetic(lambda g: 20.0 * g, half=1.0)  # 12.6 pp before recovery at 63%
    step = push_step(history, PushBounds(2.0, 0.63, prior_slope=RECOVERY_PRIOR), plan_at, trial)
    assert step is not None and calls == pytest.approx([0.63]) and step.goal == pytest.approx(0.63)
    assert step.trials[0].corrected_pp == pytest.approx(-2.9 + RECOVERY_PRIOR * 13.6)
    assert "pushing above 37.0%" in step.why and "up to the largest feasible 63.0%" in step.why


def test_a_push_bisects_down_from_the_feasible_goal_and_keeps_the_largest_that_fits():
    history = [_round(0.4, True, 0.5, 0.5)]  # what the trial said, validation showed
    plan_at, trial, calls = _synthetic(lambda g: max(0.0, g - 0.5) * 20.0, half=0.5)
    step = push_step(history, PushBounds(2.0, 0.8), plan_at, trial)
    # a trial passes when 0.5 - 0.5 + loss + 0.5 <= 2: loss <= 1.5 pp, goals up to 57.5%
    assert calls == pytest.approx([0.8, 0.6, 0.5, 0.55])
    assert step is not None and step.goal == pytest.approx(0.55)
    assert all(t.corrected_pp <= 2.0 for t in step.trials if t.goal <= step.goal)


def test_a_push_whose_trials_all_fail_stays_at_the_goal_that_kept_the_budget():
    plan_at, trial, _ = _synthetic(lambda g: 50.0, half=1.0)
    step = push_step([_round(0.35, True, 0.0, 0.0)], PushBounds(2.0, 0.7, prior_slope=RECOVERY_PRIOR), plan_at, trial)
    assert step is not None and step.goal == pytest.approx(0.35) and "no trial above it passed" in step.why


def test_below_the_target_a_push_whose_trials_all_fail_steps_halfway_to_the_smallest_trial():
    plan_at, trial, calls = _synthetic(lambda g: 50.0, half=1.0)
    step = push_step([_round(0.35, True, 0.0, 0.0)], PushBounds(2.0, 0.75, target=0.6), plan_at, trial)
    assert calls == pytest.approx([0.75, 0.55, 0.45, 0.4])
    assert step is not None and step.goal == pytest.approx(0.375) and "halfway to the smallest trial" in step.why


def test_when_every_trial_fails_on_doubt_alone_the_largest_whose_corrected_loss_fits_is_taken():
    # a 0.5 pp budget on a small slice: a trial that lost nothing still has an upper end of 3 pp (x0.2: 0.6 pp)
    plan_at, trial, calls = _synthetic(lambda g: 0.0 if g < 0.7 else 10.0, half=3.0)
    step = push_step([_round(0.6, True, 0.0, 0.0)], PushBounds(0.5, 0.8, prior_slope=RECOVERY_PRIOR), plan_at, trial)
    assert calls == pytest.approx([0.8, 0.7, 0.65, 0.625])  # 0.8 fails on evidence (2 pp corrected), the rest on doubt
    assert step is not None and step.goal == pytest.approx(0.65) and "doubt" in step.why


def test_no_push_after_a_miss_without_a_pass_or_at_the_feasible_goal():
    plan_at, trial, calls = _synthetic(lambda g: 0.0, half=1.0)
    assert (
        push_step(
            [_round(0.4, True, 0.0, 0.0), _round(0.55, False, 3.0, 1.0)],
            PushBounds(2.0, 0.7),
            plan_at,
            trial,
        )
        is None
    )
    assert push_step([_round(0.4, False, 3.0, 1.0)], PushBounds(2.0, 0.7), plan_at, trial) is None
    assert push_step([_round(0.695, True, 0.0, 0.0)], PushBounds(2.0, 0.7), plan_at, trial) is None
    assert calls == []


def _run(*drops_and_params, objective):
    """Candidates (validation drop pp, params left) in order, the best selected, the last round's iteration."""
    cands = [
        candidate(i + 1, evaluation(accuracy=90.0 - drop, params=params))
        for i, (drop, params) in enumerate(drops_and_params)
    ]
    return select_best(cands, BASE, objective), cands, len(cands)


def test_a_met_target_with_half_the_budget_unused_gets_one_more_round():
    objective = Objective(target_reduction=0.35, max_acc_drop=2.0, iterations=2)
    best, cands, it = _run((0.4, 620), objective=objective)
    stop, note = stop_reason(best, cands, BASE, objective, it)
    assert stop == "" and "pushing past the target (round 1 of 1 allowed" in note
    # the push done (it kept the budget): the run stops at the one round allowed past the target
    best, cands, it = _run((0.4, 620), (0.8, 450), objective=objective.model_copy(update={"iterations": 5}))
    stop, _ = stop_reason(best, cands, BASE, objective.model_copy(update={"iterations": 5}), it)
    assert stop.startswith("objective met at iteration 2: 55.0% params reduction")


def test_no_push_without_room_rounds_or_leave():
    objective = Objective(target_reduction=0.35, max_acc_drop=2.0, iterations=2)
    best, cands, it = _run((1.2, 620), objective=objective)  # more than half the budget spent
    assert push_due(best, cands, BASE, objective, it) == "" and stop_reason(best, cands, BASE, objective, it)[0]
    best, cands, it = _run((0.0, 620), objective=objective)
    assert push_due(best, cands, BASE, objective.model_copy(update={"beyond_target": 0}), it) == ""
    assert push_due(best, cands, BASE, objective.model_copy(update={"iterations": 1}), it) == ""
    best, cands, it = _run((0.0, 700), objective=objective)  # 30%: the target is not met, the loop goes on as before
    assert push_due(best, cands, BASE, objective, it) == "" and stop_reason(best, cands, BASE, objective, it) == (
        "",
        "",
    )


def test_a_push_that_missed_the_budget_ends_the_pushing():
    objective = Objective(target_reduction=0.35, max_acc_drop=2.0, iterations=5, beyond_target=3)
    best, cands, it = _run((0.0, 620), (3.5, 400), objective=objective)
    assert best is not None and best.iteration == 1
    assert push_due(best, cands, BASE, objective, it) == ""
    best, cands, it = _run((0.0, 620), (0.5, 400), objective=objective)
    assert "round 2 of 3 allowed" in push_due(best, cands, BASE, objective, it)
