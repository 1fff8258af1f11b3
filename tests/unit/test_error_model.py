"""The error model of a predicted loss: paired intervals from the trial's images, corrected by earlier rounds."""

from __future__ import annotations

import pytest
from helpers.search_trials import rounds

from profiling_agent.state import CompressionPlan, Trial
from profiling_agent.tools.planning.backoff import back_off
from profiling_agent.tools.planning.error_model import (
    beyond_budget,
    fit_correction,
    history_correction,
    paired_interval,
    within_budget,
)


def test_a_zero_loss_trial_has_an_upper_end_above_zero_wider_on_fewer_images():
    widths = {}
    for n in (16, 64, 256):
        ok = [True] * (n * 3 // 4) + [False] * (n - n * 3 // 4)
        loss, low, high = paired_interval(ok, ok)  # the trial changed no prediction
        assert loss == 0.0 and low < 0.0 < high
        widths[n] = high
    assert widths[16] > widths[64] > widths[256] > 0.3
    assert widths[64] == pytest.approx(2.97, abs=0.05)  # half an image each way on 64 + 2 images


def test_the_interval_is_paired_per_image():
    base = [True] * 90 + [False] * 10
    worse = [False] * 10 + [True] * 80 + [False] * 10  # 10 images broken, none fixed: 10 pp lost
    loss, low, high = paired_interval(base, worse)
    assert loss == pytest.approx(10.0) and 3.0 < low < 10.0 < high < 17.0
    swapped = [False] * 10 + [True] * 80 + [True] * 10  # 10 broken, 10 fixed: no net loss, but wider than none
    loss2, low2, high2 = paired_interval(base, swapped)
    assert loss2 == 0.0 and high2 > paired_interval(base, base)[2]
    with pytest.raises(ValueError):
        paired_interval(base, base[:5])


def test_the_correction_from_none_one_and_two_earlier_rounds():
    none = fit_correction([])
    assert none(1.7) == pytest.approx(1.7) and none.pairs == 0
    one = fit_correction([(0.0, 5.11)])  # the round 2: predicted 0.00, measured 5.11
    assert one.as_list() == [5.11, 1.0] and one(0.0) == pytest.approx(5.11)
    two = fit_correction([(1.0, 3.0), (3.0, 7.0)])  # measured = 1 + 2 x predicted
    assert two.additive == pytest.approx(1.0) and two.multiplicative == pytest.approx(2.0)
    assert two.cap(5.0) == pytest.approx(2.0)
    same = fit_correction([(1.0, 3.0), (1.0, 5.0)])  # predictions that do not differ: additive alone
    assert same.as_list() == [3.0, 1.0]
    wild = fit_correction([(1.0, 9.0), (1.1, 0.0)])  # a negative slope is clamped, the intercept refitted
    assert wild.multiplicative == pytest.approx(0.25)
    unknown = {"goal": 0.0, "passed": False}  # rounds whose goal is not known: the additive term stays unscaled
    counted = history_correction(
        rounds(
            {**unknown, "predicted_drop": 1.56, "drop": 15.33},
            {**unknown, "predicted_drop": None, "drop": 4.0},
            {**unknown, "predicted_drop": 0.0, "drop": 1.0, "rejected": True},  # a reviewer's no measured nothing
        )
    )  # only the first round has both losses and no reviewer's no
    assert counted.pairs == 1 and counted.as_list() == [round(15.33 - 1.56, 3), 1.0] and counted.at_goal is None


def test_the_first_round_backs_off_when_the_upper_end_exceeds_the_cap():
    # every plan's trial loses nothing, but its interval's upper end grows with the goal (fewer agreeing images)
    def trial(plan):
        goal = float(plan.rationale)
        return Trial(accuracy_drop_pp=0.0, interval_pp=[-1.0, 10.0 * goal], params_reduction=goal)

    out = back_off(0.5, lambda g: CompressionPlan(rationale=str(g)), trial, cap=3.0, steps=4)
    assert out.backed_off and out.goal <= 0.3 + 1e-9  # a zero point loss did not pass the 50% plan
    assert out.intervals[round(out.goal, 4)][1] <= 3.0
    kept = back_off(0.2, lambda g: CompressionPlan(rationale=str(g)), trial, cap=3.0)
    assert not kept.backed_off and kept.goal == 0.2


def test_a_recovered_trial_is_rejected_only_when_its_whole_interval_misses_the_budget():
    assert within_budget(1.5, fit_correction([]), 2.0) and not within_budget(2.5, fit_correction([]), 2.0)
    assert beyond_budget(3.0, 1.0, 5.0, 2.0) == ""  # it might still pass
    reason = beyond_budget(8.0, 4.5, 11.5, 2.0)
    assert "wholly beyond the 2 pp budget" in reason and "not evaluated in full" in reason
