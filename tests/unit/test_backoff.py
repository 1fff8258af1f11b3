from profiling_agent.state import BackoffTrial, CompressionPlan, Trial
from profiling_agent.tools.planning.backoff import back_off, drop_cap


def _setup(collapse_above: float):
    planned = []

    def plan_at(goal):
        planned.append(goal)
        return CompressionPlan(rationale=f"{goal:.4f}")

    def trial(plan):
        goal = float(plan.rationale)
        return Trial(accuracy_drop_pp=60.0 if goal > collapse_above else goal * 10, params_reduction=goal)

    return plan_at, trial, planned


def test_a_plan_that_passes_is_kept_after_one_trial():
    plan_at, trial, planned = _setup(collapse_above=0.9)
    out = back_off(0.4, plan_at, trial, cap=5.0)
    assert out.goal == 0.4 and not out.backed_off and planned == [0.4] and len(out.trials) == 1


def test_a_collapsing_plan_backs_off_to_the_largest_passing_goal():
    plan_at, trial, _ = _setup(collapse_above=0.25)  # 40% collapses (-60 pp): the probe alone could not tell
    out = back_off(0.4, plan_at, trial, cap=5.0, steps=4)
    assert out.backed_off and 0.0 < out.goal <= 0.25
    assert all(t.calib_drop_pp <= 5.0 for t in out.trials if t.goal == round(out.goal, 4))
    assert out.trials[0] == BackoffTrial(goal=0.4, calib_drop_pp=60.0, params_reduction=0.4)


def test_nothing_passes_keeps_the_smallest_goal_tried():
    plan_at, trial, _ = _setup(collapse_above=-1.0)
    out = back_off(0.4, plan_at, trial, cap=5.0, steps=3)
    assert out.goal == min(t.goal for t in out.trials)


def test_cap_is_twice_the_budget_within_bounds():
    assert drop_cap(2.0) == 4.0 and drop_cap(0.5) == 3.0 and drop_cap(10.0) == 8.0
