"""The searching loop: round k+1 bisects inside the measured interval on calibration trials corrected by validation."""

from __future__ import annotations

import pytest

from profiling_agent.state import CompressionPlan
from profiling_agent.tools.planning.search import AIM, bracket, prediction_correction, search_step


def _round(goal, passed, drop=None, predicted=None, **extra):
    return {"goal": goal, "passed": passed, "drop": drop, "predicted_drop": predicted, **extra}


def test_correction_is_measured_over_predicted_loss_of_the_latest_round():
    assert prediction_correction([]) is None
    assert prediction_correction([_round(0.37, False, 10.6, None)]) is None
    assert prediction_correction([_round(0.37, False, 10.6, 3.1)]) == pytest.approx(10.6 / 3.1)
    rounds = [_round(0.37, False, 10.6, 3.1), _round(0.2, True, 1.0, 2.0)]
    assert prediction_correction(rounds) == pytest.approx(0.5)
    assert prediction_correction([_round(0.3, False, 6.0, 0.0)]) == pytest.approx(6.0 / 0.5)  # floor on predicted
    assert prediction_correction([_round(0.3, True, -1.0, 2.0)]) == pytest.approx(0.25)  # floored, then clamped
    assert prediction_correction([_round(0.3, True, 0.0, 0.0)]) == pytest.approx(1.0)  # no evidence either way


def test_bracket_is_the_largest_pass_and_the_smallest_failure_above_it():
    assert bracket([_round(0.2, True)]) is None
    assert bracket([_round(0.37, False)]) == (0.0, 0.37)
    rounds = [_round(0.37, False), _round(0.18, True), _round(0.3, False), _round(0.1, True)]
    assert bracket(rounds) == (0.18, 0.3)


def _synthetic(true_drop):
    """A trial whose calibration loss is a known function of the goal the plan carries in its rationale."""
    calls = []

    def plan_at(goal):
        return CompressionPlan(rationale=str(goal))

    def trial(plan):
        goal = float(plan.rationale)
        calls.append(goal)
        return {"accuracy_drop_pp": true_drop(goal)}

    return plan_at, trial, calls


def test_search_lands_between_the_pass_and_the_failure_where_the_corrected_loss_fits_the_budget():
    calib = lambda g: max(0.0, g - 0.25) * 30.0  # noqa: E731  calibration loss of a plan at goal g
    # validation loses 3x what calibration predicts: round 1 at 37% predicted 3.6 pp and lost 10.8 pp
    history = [_round(0.37, False, 3 * calib(0.37), calib(0.37))]
    plan_at, trial, calls = _synthetic(calib)
    step = search_step(history, 2.0, plan_at, trial, steps=6)
    assert step is not None and step.correction == pytest.approx(3.0)
    assert step.cap == pytest.approx(AIM * 2.0 / 3.0)
    assert 0.0 < step.goal < 0.37 and all(0.0 < g < 0.37 for g in calls)
    # the chosen goal's corrected loss fits the budget, and it is close to the largest goal that does
    assert 3 * calib(step.goal) <= AIM * 2.0 + 1e-9
    largest = 0.25 + AIM * 2.0 / 3.0 / 30.0
    assert largest - step.goal < 0.37 / 2**6 + 1e-9
    assert step.goal > 0.37 / 2  # better than plain bisection, which would try 18.5%
    assert step.to_dict()["trials"] and "searching between" in step.why


def test_no_search_without_a_failure_or_a_prediction():
    plan_at, trial, calls = _synthetic(lambda g: 0.0)
    assert search_step([_round(0.3, True, 0.5, 0.2)], 2.0, plan_at, trial) is None
    assert search_step([_round(0.3, False, 5.0, None)], 2.0, plan_at, trial) is None
    assert calls == []


def test_when_no_trial_fits_the_goal_falls_below_the_smallest_failing_trial():
    history = [_round(0.4, False, 10.0, 5.0)]
    plan_at, trial, calls = _synthetic(lambda g: 50.0)
    step = search_step(history, 2.0, plan_at, trial, steps=3)
    assert step is not None and len(calls) == 3
    assert 0.0 < step.goal < min(calls)


def test_each_round_says_how_its_prediction_compared_with_validation():
    from profiling_agent.nodes.iterate import latency_check, prediction_check

    base = {"accuracy": 99.0}
    cand = {"planner_meta": {"predicted_drop": 3.1, "goal": 0.4}, "eval": {"accuracy": 88.4, "speedup": 2.0}}
    text = prediction_check(cand, base)
    assert "predicted a 3.10 pp loss" in text and "showed 10.60 pp" in text and "x3.42" in text
    assert prediction_check({"planner_meta": {}, "eval": cand["eval"]}, base) == ""
    assert latency_check(cand, base, "params") == ""
    lat = latency_check(cand, base, "latency")
    assert "predicted 40.0%" in lat and "measured 50.0% on torch" in lat and "+10.0%" in lat
