"""The searching loop: round k+1 bisects inside the measured interval on trials corrected by validation."""

from __future__ import annotations

import pytest
from helpers.eval_records import candidate, evaluation, form
from helpers.search_trials import history_round as _round
from helpers.search_trials import synthetic as _synthetic

from profiling_agent.tools.planning.search import bracket, prediction_correction, search_step


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
    rounds = [
        _round(0.37, False),
        _round(0.18, True),
        _round(0.3, False),
        _round(0.1, True),
    ]
    assert bracket(rounds) == (0.18, 0.3)


def test_search_keeps_the_largest_goal_whose_corrected_upper_end_fits_the_budget():
    calib = lambda g: max(0.0, g - 0.25) * 30.0  # noqa: E731  trial loss of a plan at goal g
    # two earlier rounds: validation lost 3x what the trial predicted -> multiplicative 3, additive 0
    history = [
        _round(0.37, False, 3 * calib(0.37), calib(0.37)),
        _round(0.3, False, 3 * calib(0.3), calib(0.3)),
    ]
    plan_at, trial, calls = _synthetic(calib, half=0.2)
    step = search_step(history, 2.0, plan_at, trial, steps=6)
    assert step is not None and step.correction.multiplicative == pytest.approx(3.0)
    assert step.correction.additive == pytest.approx(0.0, abs=1e-9)
    assert step.cap == pytest.approx(2.0 / 3.0)  # the upper end a trial may show
    assert 0.0 < step.goal < 0.3 and all(0.0 < g < 0.3 for g in calls)
    # the chosen goal's corrected upper end fits the budget, and it is close to the largest goal that does
    assert 3 * (calib(step.goal) + 0.2) <= 2.0 + 1e-9
    largest = 0.25 + (2.0 / 3.0 - 0.2) / 30.0
    assert largest - step.goal < 0.3 / 2**6 + 1e-9
    assert step.intervals[round(step.goal, 4)] == pytest.approx([calib(step.goal) - 0.2, calib(step.goal) + 0.2])
    assert step.to_record().trials and "searching between" in step.why


def test_one_earlier_round_corrects_by_the_additive_term_alone_scaled_by_the_goal():
    # predicted zero, validation lost 1.5 pp: a multiplicative term could not see it, the additive one does
    history = [_round(0.37, False, 1.5, 0.0)]
    plan_at, trial, calls = _synthetic(lambda g: 0.0, half=0.8)  # every trial predicts zero, upper end 0.8
    step = search_step(history, 2.0, plan_at, trial, steps=3)
    assert step is not None and step.correction.as_list() == [1.5, 1.0] and step.correction.at_goal == 0.37
    assert step.correction(0.8, 0.37) == pytest.approx(2.3)  # at the missed goal: 0.8 + 1.5, nothing passes there
    assert step.correction(0.8, 0.185) == pytest.approx(1.55)  # half the goal, half the additive term: it fits
    corrected = [t["corrected_pp"] for t in step.to_record().model_dump()["trials"]]
    assert calls == pytest.approx([0.185, 0.2775, 0.32375]) and corrected == pytest.approx(
        [1.55, 1.925, 2.1125], abs=1e-3
    )
    assert step.goal == pytest.approx(0.2775) and step.cap == pytest.approx(2.0 - 1.5 * 0.75)


def test_a_narrow_miss_is_not_charged_in_full_to_every_smaller_plan():
    # the tune half's bottleneck ResNet: round 1 at 35% predicted 0.00 on 128 trial images (upper end 1.5 pp with no
    # changed prediction) and validation lost 2.15 pp. Charging 2.15 pp to every smaller plan failed every trial on
    # doubt and the search fell to a tenth of the goal; the line through the measured loss aims at 0.8 x budget.
    history = [_round(0.35, False, 2.15, 0.0)]
    plan_at, trial, calls = _synthetic(lambda g: 0.0, half=1.5)
    step = search_step(history, 2.0, plan_at, trial, steps=4)
    assert step is not None and step.goal == pytest.approx(0.35 * 1.6 / 2.15)
    assert "line through the losses validation measured" in step.why
    # a trial below the line whose corrected loss itself misses the budget keeps the goal under it
    plan_at, trial, calls = _synthetic(lambda g: 3.0 if g > 0.1 else 0.0, half=1.5)
    step = search_step(history, 2.0, plan_at, trial, steps=4)
    assert step is not None and step.goal < min(g for g in calls if g > 0.1)


def test_no_search_without_a_failure():
    plan_at, trial, calls = _synthetic(lambda g: 0.0)
    assert search_step([_round(0.3, True, 0.5, 0.2)], 2.0, plan_at, trial) is None
    assert calls == []
    # a failure without a prediction: the trials are judged uncorrected
    step = search_step([_round(0.3, False, 5.0, None)], 2.0, plan_at, trial, steps=2)
    assert step is not None and step.correction.pairs == 0 and step.goal == pytest.approx(0.225)


def test_when_no_trial_fits_the_goal_falls_below_the_smallest_failing_trial():
    history = [_round(0.4, False, 10.0, 5.0)]
    plan_at, trial, calls = _synthetic(lambda g: 50.0)
    step = search_step(history, 2.0, plan_at, trial, steps=3)
    assert step is not None and len(calls) == 3
    assert 0.0 < step.goal < min(calls)


def test_each_round_says_how_its_prediction_compared_with_validation():
    from profiling_agent.tools.planning.round_check import check_message, round_check

    base = evaluation(accuracy=99.0)
    cand = candidate(1, evaluation(accuracy=88.4, speedup=2.0), planner_meta={"predicted_drop": 3.1, "goal": 0.4})
    check = round_check(cand, base, "params")
    text = check_message(check)
    assert "predicted a 3.10 pp loss" in text and "showed 10.60 pp" in text and "+7.50 pp off" in text
    assert check is not None and check.correction == pytest.approx(10.6 / 3.1, abs=0.01)
    assert check.predicted_latency_reduction is None and "latency" not in text
    assert round_check(candidate(1, cand.eval), base, "params") is None
    lat = round_check(cand, base, "latency")
    assert lat is not None and lat.measured_latency_reduction == pytest.approx(0.5)
    words = check_message(lat)
    assert "predicted 40.0%" in words and "measured 50.0% on torch" in words and "+10.0%" in words


def test_a_latency_target_is_measured_against_the_unpruned_model_in_the_delivered_form():
    """Quantization alone is not a latency reduction: the delivered int8 form is compared with the unpruned int8."""
    from profiling_agent.tools.evaluation.selection import reduction, same_form_latency
    from profiling_agent.tools.planning.round_check import round_check

    base = evaluation(accuracy=95.0, variants=[form("ort_dynamic", speedup=3.4)])
    beside = evaluation(accuracy=95.0, speedup=3.86, latency_ms=0.43, delivered="ort_dynamic")
    # the peer (the unpruned model's fastest form) was timed beside it: that timing wins
    timed = beside.model_copy(update={"peer": {"name": "ort_dynamic", "latency_ms": 0.50}})
    assert same_form_latency(timed, base) == (pytest.approx(0.14), "ort_dynamic", "timed beside it")
    # no peer of that form: the baseline's own ort_dynamic, both speedups against the same torch baseline
    value, delivered, against = same_form_latency(beside, base)
    assert value == pytest.approx(1 - 3.4 / 3.86) and against == "the baseline's forms"
    assert reduction(beside, base, "latency") == pytest.approx(value)
    # a torch delivery is measured against the torch baseline
    assert reduction(evaluation(speedup=2.0, delivered="torch_fp32"), base, "latency") == pytest.approx(0.5)
    # another form than the peer's: the peer timed beside it, scaled by the two forms' ratio in the baseline's timing
    forms = [form("ort_fp32", speedup=18.4, latency_ms=0.105), form("ort_dynamic", speedup=19.2, latency_ms=0.100)]
    peer = {"name": "ort_dynamic", "latency_ms": 0.50}
    fp32 = evaluation(accuracy=95.0, speedup=16.6, latency_ms=0.42, delivered="ort_fp32", peer=peer)
    value, delivered, against = same_form_latency(fp32, base.model_copy(update={"variants": forms}))
    assert value == pytest.approx(1 - 0.42 / 0.525) and delivered == "ort_fp32" and "ort_dynamic peer" in against
    check = round_check(candidate(1, timed, planner_meta={"goal": 0.112}), base, "latency")
    assert check is not None and check.latency_form == "ort_dynamic" and check.latency_error == pytest.approx(0.028)
