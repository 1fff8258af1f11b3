"""One measurement per claim: every ratio a run states lies inside the interval stored beside it."""

from __future__ import annotations

import random
import statistics

import numpy as np
import pytest
from helpers.eval_records import evaluation, form

from profiling_agent.state import Best, EvalRecord, Objective
from profiling_agent.tools.evaluation.bootstrap import paired_delta_ci
from profiling_agent.tools.evaluation.delivery import delivery_summary, summary_line
from profiling_agent.tools.evaluation.latency import paired_ratio, paired_reduction
from profiling_agent.tools.reporting.interval_check import ratios_outside_intervals
from profiling_agent.tools.reporting.outcome import target_outcome

# seven interleaved repeats whose ratio of medians (11.49x) lies above the paired median's bootstrap interval
PEER = [8.08, 11.35, 11.18, 9.09, 11.83, 8.65, 10.56]
MINE = [0.919, 0.826, 1.04, 0.884, 1.119, 0.91, 1.011]
TORCH = [100.0, 104.0, 98.0, 101.0, 99.0, 103.0, 100.5]
EVAL_KEYS = set(EvalRecord.model_fields)


def _row(samples):
    return {"latency_ms": statistics.median(samples), "latency_batch_ms": 8 * statistics.median(samples),
            "samples_ms": samples}  # fmt: skip


def _final():
    return {"baseline": _row(TORCH), "iter_01": _row(MINE), "unpruned_ort_dynamic": _row(PEER)}


def _records():
    objective = Objective(max_acc_drop=2.0, target="latency", target_reduction=0.5)
    peer = {"name": "ort_dynamic", "accuracy": 89.5, "latency_ms": 10.0, "path": "baseline_forms/ort_dynamic"}
    variants = [form("torch_fp32", accuracy=90.0, latency_ms=100.0), form("ort_dynamic", accuracy=89.5, speedup=10.0)]
    base = evaluation(name="baseline", accuracy=90.0, latency_ms=100.0, variants=variants, peer=peer)
    final = _final()
    ev = evaluation(name="iter_01", accuracy=89.0, latency_ms=final["iter_01"]["latency_ms"], delivered="ort_dynamic",
                    speedup=10.9, peer=peer, acc_delta_ci=[-2.5, 0.5])  # fmt: skip
    best = {**ev.model_dump(), "iteration": 1, "within_budget": True, "accuracy_drop": 1.0, "reduction": 0.9}
    return objective, base, best, final


def _outcome(objective, base, best, final):
    """`target_outcome` of the state's Best behind result.json's `best` row."""
    record = evaluation(**{k: v for k, v in best.items() if k in EVAL_KEYS})
    keep = ("iteration", "within_budget", "accuracy_drop", "reduction")
    state_best = Best(rule="budget", eval=record, **{k: best[k] for k in keep})
    return target_outcome(state_best, base, objective, final)


def test_the_ratio_of_medians_can_lie_outside_the_paired_interval():
    """The bug: a report stated the two medians' ratio beside the interval of the paired median."""
    paired = paired_ratio(_row(PEER), _row(MINE))
    assert paired is not None
    medians = statistics.median(PEER) / statistics.median(MINE)
    assert medians > paired["ci"][1]  # 11.49x against an interval ending near 10.75x: two measurements
    assert paired["ci"][0] <= paired["ratio"] <= paired["ci"][1]


def test_the_delivery_states_the_paired_median_inside_its_interval():
    objective, base, best, final = _records()
    summary = delivery_summary(best, base.model_dump(), objective, final, {"final_peer": base.peer})
    assert summary is not None
    for key in ("vs_quantization_only", "vs_original_torch"):
        paired = summary[f"{key}_ci"]
        assert summary[key] == paired["ratio"] and paired["ci"][0] <= summary[key] <= paired["ci"][1]
    low, high = summary["vs_quantization_only_ci"]["ci"]
    assert f"{summary['vs_quantization_only']:.2f}x quantization only" in summary_line(summary)
    assert f"(95% interval {low:.2f}-{high:.2f})" in summary_line(summary)


def test_a_latency_outcome_is_the_paired_reduction_inside_its_interval():
    objective, base, best, final = _records()
    out = _outcome(objective, base, best, final)
    low, high = out["measured_ci"]
    assert low <= out["measured"] <= high
    paired = paired_ratio(final["unpruned_ort_dynamic"], final["iter_01"])
    assert paired is not None and out["measured"] == paired_reduction(paired)[0]
    assert f"reduction {out['measured']:.1%}" in out["statement"]


def test_the_result_check_finds_a_point_outside_and_passes_the_fixed_result():
    objective, base, best, final = _records()
    summary = delivery_summary(best, base.model_dump(), objective, final, {"final_peer": base.peer})
    outcome = _outcome(objective, base, best, final)
    result = {"baseline": base.model_dump(), "best": best, "candidates": [best], "delivery": summary,
              "outcome": outcome}  # fmt: skip
    assert ratios_outside_intervals(result) == []
    stale = {**summary, "vs_quantization_only": round(statistics.median(PEER) / statistics.median(MINE), 4)}
    (line,) = ratios_outside_intervals({**result, "delivery": stale})
    assert line.startswith("delivery.vs_quantization_only: 11.49") and "outside its interval" in line
    lost = {**best, "accuracy": 86.0}  # 4 pp below the baseline beside a change interval of [-2.5, +0.5]
    assert len(ratios_outside_intervals({**result, "candidates": [lost]})) == 1


@pytest.mark.parametrize("repeats", [3, 4, 5, 7, 10])
def test_a_paired_ratio_holds_its_estimate_whatever_the_samples(repeats):
    rng = random.Random(repeats)
    for _ in range(200):
        slow = [rng.lognormvariate(2.0, 0.3) for _ in range(repeats)]
        fast = [rng.lognormvariate(0.0, 0.3) for _ in range(repeats)]
        paired = paired_ratio({"samples_ms": slow}, {"samples_ms": fast})
        assert paired is not None
        low, high = paired["ci"]
        assert low <= paired["ratio"] <= high
        reduction, (r_low, r_high) = paired_reduction(paired)
        assert r_low <= reduction <= r_high


def test_an_accuracy_change_holds_its_estimate_after_rounding():
    rng = np.random.default_rng(0)
    for n in (3, 7, 30, 301):
        for _ in range(50):
            base, cand = rng.random(n) < 0.8, rng.random(n) < 0.8
            point = round(100.0 * (cand.mean() - base.mean()), 6)  # as held_out_eval stores it
            low, high = paired_delta_ci(cand, base, resamples=200)
            assert low <= point <= high
