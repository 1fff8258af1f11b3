"""The run's verdict on its target: met, or missed by how much, measured where the model ships."""

from __future__ import annotations

import pytest
from helpers.eval_records import evaluation, form

from profiling_agent.state import Best, Objective
from profiling_agent.tools.planning.deterministic import PlannerConfig, next_goal
from profiling_agent.tools.reporting.markdown import backend_lines
from profiling_agent.tools.reporting.outcome import target_outcome

BASE = evaluation(accuracy=95.0, params=1000, variants=[form("ort_dynamic", speedup=3.0)])
LATENCY, PARAMS = Objective(target="latency", target_reduction=0.4), Objective(target="params", target_reduction=0.4)


def _best(reduction, iteration=1, **ev):
    record = evaluation(accuracy=94.5, **ev)
    return Best(
        iteration=iteration, rule="budget", within_budget=True, reduction=reduction, accuracy_drop=0.5, eval=record
    )


def test_a_latency_target_missed_says_by_how_much_and_on_which_form():
    best = _best(0.115, delivered="ort_dynamic", speedup=3.39, latency_ms=0.5)
    out = target_outcome(best, BASE, LATENCY)
    assert out["met"] is False and out["missed_by"] == pytest.approx(0.285)
    assert out["form"] == "ort_dynamic" and out["against"] == "the baseline's forms"
    assert "missed by 28.5%" in out["statement"] and "unpruned model's ort_dynamic" in out["statement"]


def test_a_latency_outcome_is_stated_from_the_final_joint_timing_when_it_has_both_models():
    best = _best(0.278, iteration=3, delivered="ort_dynamic", speedup=5.5, latency_ms=0.2)
    final = {
        "iter_03": {"latency_ms": 0.15, "latency_batch_ms": 0.8},
        "unpruned_ort_dynamic": {"latency_ms": 0.25, "latency_batch_ms": 1.6},
    }
    out = target_outcome(best, BASE, LATENCY, final)
    assert out["measured"] == pytest.approx(0.4) and out["met"] is True and out["round_measured"] == 0.278
    assert out["measured_batch"] == pytest.approx(0.5) and "at the end of the run" in out["statement"]
    other = {"iter_03": final["iter_03"], "unpruned_ort_fp32": final["unpruned_ort_dynamic"]}  # not the same form
    kept = target_outcome(best, BASE, LATENCY, other)
    assert kept["measured"] == 0.278 and "round_measured" not in kept


def test_a_met_target_and_no_candidate():
    out = target_outcome(_best(0.42), BASE, PARAMS)
    assert out["met"] is True and out["missed_by"] == 0.0 and "target met" in out["statement"]
    none = target_outcome(None, BASE, PARAMS)
    assert none["met"] is False and none["measured"] is None and "no candidate" in none["statement"]


def test_round_one_says_when_the_target_is_out_of_reach_of_the_profile():
    objective = Objective(target="latency", target_reduction=0.4)
    goal, _, converged, why = next_goal([], objective, feasible=0.134, config=PlannerConfig())
    assert goal == pytest.approx(0.134) and not converged and "cannot be reached" in why
    _, _, _, reachable = next_goal([], objective, feasible=0.9, config=PlannerConfig())
    assert "cannot be reached" not in reachable


def test_the_report_names_the_profile_the_planners_read():
    backend = {"planned_on": "ov_int8", "forms_ms": {"ort_dynamic": 2.0, "ov_int8": 1.5},
               "failed": {"ov_fp32": "RuntimeError: no"}, "latency_table": "ov_int8"}  # fmt: skip
    (line,) = backend_lines(backend)
    assert "planners read ov_int8" in line and "ort_dynamic 2.00 ms" in line and "ov_fp32 failed" in line
    assert "latency table measured on ov_int8" in line
    assert "torch eager only" in backend_lines(None)[0]


def test_a_latency_outcome_from_the_final_timing_carries_its_paired_interval():
    best = _best(0.3, delivered="ort_dynamic", speedup=5.5, latency_ms=0.2)
    final = {
        "iter_01": {"latency_ms": 1.0, "latency_batch_ms": 8.0, "samples_ms": [1.0, 1.02, 0.98, 1.0, 1.01]},
        "unpruned_ort_dynamic": {"latency_ms": 2.0, "latency_batch_ms": 16.0, "samples_ms": [2.0, 2.1, 1.9, 2.0, 2.0]},
    }
    out = target_outcome(best, BASE, LATENCY, final)
    low, high = out["measured_ci"]
    assert out["measured"] == 0.5 and low <= 0.5 <= high and low > 0.4
    assert "95% interval" in out["statement"] and "paired repeats" in out["statement"]
