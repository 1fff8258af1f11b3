"""The time budget's planner (tools/planning/time_budget.py) on synthetic step times: fits, cuts in order, resumes."""

from __future__ import annotations

from profiling_agent.tools.planning import time_budget as tb

FULL = tb.Knobs(rounds=3, trials=4, recover_minutes=2.0, backend="auto")
SETUP = [("acquire", 0, 2.0), ("resolve_input_shape", 0, 1.0), ("prepare_data", 0, 2.0)]
SETUP += [("profile", 0, 20.0), ("probe_sensitivity", 0, 10.0), ("measure_baseline", 0, 40.0)]
ROUND1 = [("analyze", 1, 30.0), ("prune", 1, 2.0), ("recover", 1, 100.0), ("quantize", 1, 1.0)]
ROUND1 += [("evaluate", 1, 20.0), ("iterate", 1, 0.1)]


def test_no_budget_keeps_the_settings():
    plan = tb.plan_budget(None, tb.Progress([], gmacs=17.6), FULL)
    assert (plan.rounds, plan.trials, plan.recover_minutes, plan.backend, plan.cuts) == (3, 4, 2.0, "auto", [])
    assert plan.expected_s > 0


def test_a_budget_that_fits_cuts_nothing():
    progress = tb.Progress(SETUP + ROUND1)
    left = tb.plan_budget(None, progress, FULL).expected_s
    plan = tb.plan_budget(progress.spent() + left + 1, progress, FULL)
    assert plan.cut == [] and plan.rounds == 3


def test_cuts_follow_the_stated_order_and_fit():
    """Each smaller budget adds the next cut (trials, recovery, forms, rounds); what is kept fits when it can."""
    progress = tb.Progress(SETUP + ROUND1)
    spent = progress.spent()
    full_left = tb.plan_budget(None, progress, FULL).expected_s
    seen: list[list[str]] = []
    for share in (0.99, 0.8, 0.6, 0.45, 0.3, 0.1):
        plan = tb.plan_budget(spent + share * full_left, progress, FULL)
        assert plan.cut == list(tb.CUT_ORDER[: len(plan.cut)]), plan.cut  # a prefix of the order
        if plan.cut:
            assert plan.expected_s <= share * full_left + 1e-6 or plan.rounds == 1
        seen.append(plan.cut)
    assert [len(c) for c in seen] == sorted(len(c) for c in seen)  # a smaller budget never cuts less
    assert seen[0] == ["trials"] and seen[-1] == list(tb.CUT_ORDER)


def test_recovery_gets_what_the_rest_leaves():
    """With trials cut, the distillation cap is the largest that fits, between the floor and the full cap."""
    progress = tb.Progress(SETUP + ROUND1)
    full_left = tb.plan_budget(None, progress, FULL).expected_s
    plan = tb.plan_budget(progress.spent() + 0.8 * full_left, progress, FULL)
    assert plan.cut[:2] == ["trials", "recovery"]
    assert tb.MIN_RECOVER_MINUTES < plan.recover_minutes < FULL.recover_minutes
    assert abs(plan.expected_s - 0.8 * full_left) < 0.05 * full_left  # it spends what is left, no less


def test_a_resume_counts_the_time_already_spent():
    """The same budget cuts more after a first round spent (a resume reads the steps' seconds from the history)."""
    budget = 600.0
    fresh = tb.plan_budget(budget, tb.Progress(SETUP), FULL)
    resumed = tb.plan_budget(budget, tb.Progress(SETUP + ROUND1 + [("analyze", 2, 400.0)]), FULL)
    assert resumed.spent_s > fresh.spent_s
    assert len(resumed.cut) > len(fresh.cut)
    assert resumed.rounds >= 2  # the round in progress finishes


def test_round_steps_are_estimated_from_this_run():
    """A measured step replaces its prior: a slow measured recovery makes the later ones expected slow too."""
    progress = tb.Progress(SETUP + ROUND1)
    steps = tb.expected(progress, FULL, FULL)
    assert steps[("recover", 2)] == 100.0 and steps[("evaluate", 3)] == 20.0
    assert ("profile", 0) not in steps and ("evaluate_held_out", 0) in steps
    knobs = tb.Knobs(3, 1, 2.0, "openvino")
    cut = tb.expected(progress, knobs, FULL)
    assert cut[("evaluate", 2)] == 20.0 * tb.FORMS_CUT
    assert cut[("analyze", 2)] < steps[("analyze", 2)]


def test_the_priors_scale_with_the_model():
    small, large = tb.Progress([], gmacs=0.01), tb.Progress([], gmacs=17.6)
    assert tb.step_estimate("profile", large, FULL, FULL) > 10 * tb.step_estimate("profile", small, FULL, FULL)


def test_no_round_fits_keeps_one():
    plan = tb.plan_budget(1.0, tb.Progress(SETUP), FULL)
    assert plan.rounds == 1 and plan.cut == list(tb.CUT_ORDER)
    assert tb.another_round_fits(plan, tb.Progress(SETUP))
    assert not tb.another_round_fits(plan, tb.Progress(SETUP + ROUND1))


def test_no_cap_is_the_largest_cap():
    full = tb.Knobs(rounds=2, trials=4, recover_minutes=0.0, backend="auto")
    plan = tb.plan_budget(None, tb.Progress(SETUP), full)
    assert plan.recover_minutes == 0.0 and plan.cut == []
    tight = tb.plan_budget(200.0, tb.Progress(SETUP), full)
    assert "recovery" in tight.cut and tight.recover_minutes > 0
    assert any("no cap" in c for c in tight.cuts)
