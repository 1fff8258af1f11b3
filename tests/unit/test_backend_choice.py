"""The delivered form of a candidate: fastest within the accuracy budget (ties: fixed order), and what planners read."""

from __future__ import annotations

from helpers.eval_records import candidate, evaluation, form
from helpers.search_trials import rounds

from profiling_agent.state import Objective
from profiling_agent.tools.evaluation.selection import (
    choose_form,
    quantization_cost_speed,
    torch_quantized_delivery,
)
from profiling_agent.tools.planning.quant_plan import slowed_round

BASE = evaluation(accuracy=90.0, params=1000, size_mb=4.0, latency_ms=2.0)


def v(name, acc, lat, mb, status="ok"):
    return form(name, status=status, accuracy=acc, latency_ms=lat, size_mb=mb)


def name_of(choice):
    return choice.chosen.name if choice is not None else None


VARIANTS = [
    v("torch_fp32", 89.5, 1.6, 2.0),
    v("torch_qint8", 89.0, 2.4, 0.6),
    v("ort_fp32", 89.5, 0.5, 2.0),
    v("ort_dynamic", 89.0, 0.3, 0.6),
    v("ort_static", 86.0, 0.2, 0.6),  # fastest, but 4 pp under the baseline
]


def test_fastest_within_budget_is_delivered():
    chosen = choose_form(VARIANTS, BASE, Objective(max_acc_drop=2.0))
    assert name_of(chosen) == "ort_dynamic"
    wider = choose_form(VARIANTS, BASE, Objective(max_acc_drop=5.0))
    assert name_of(wider) == "ort_static"


def test_ties_in_speed_follow_the_fixed_order_without_samples():
    tied = [v("ort_dynamic", 90.0, 1.00, 0.6), v("ort_fp32", 90.0, 1.01, 2.0), v("torch_fp32", 90.0, 1.5, 0.5)]
    assert name_of(choose_form(tied, BASE, Objective())) == "ort_fp32"  # within 2%: the simpler precision
    more_accurate = [v("ort_fp32", 90.0, 1.00, 2.0), v("ov_int8", 90.2, 1.01, 0.6)]
    assert name_of(choose_form(more_accurate, BASE, Objective())) == "ov_int8"  # validation accuracy first
    apart = [v("ort_fp32", 90.0, 1.10, 2.0), v("ort_dynamic", 90.0, 1.00, 0.6)]
    assert name_of(choose_form(apart, BASE, Objective())) == "ort_dynamic"


def test_size_target_prefers_the_smallest_within_budget():
    chosen = choose_form(VARIANTS, BASE, Objective(target="size", max_acc_drop=2.0))
    assert name_of(chosen) == "ort_dynamic"  # 0.6 MB like torch_qint8, but faster
    only_torch = choose_form(VARIANTS, BASE, Objective(target="size"), eligible=["torch_fp32", "torch_qint8"])
    assert name_of(only_torch) == "torch_qint8"


def test_failed_and_ineligible_variants_are_never_delivered():
    failed = [x.model_copy(update={"status": "failed"}) if x.name.startswith("ort_") else x for x in VARIANTS]
    assert name_of(choose_form(failed, BASE, Objective())) == "torch_fp32"
    assert name_of(choose_form(VARIANTS, BASE, Objective(), eligible=["torch_qint8"])) == "torch_qint8"
    assert choose_form(failed, BASE, Objective(), eligible=["ort_fp32", "ort_dynamic", "ort_static"]) is None
    assert choose_form([], BASE, Objective()) is None


def test_nothing_within_budget_delivers_the_most_accurate_then_fastest():
    over = [v("torch_fp32", 80.0, 1.6, 2.0), v("ort_fp32", 80.0, 0.5, 2.0), v("ort_static", 75.0, 0.2, 0.6)]
    assert name_of(choose_form(over, BASE, Objective(max_acc_drop=2.0))) == "ort_fp32"


def test_torch_quantization_cost_only_counts_when_torch_quantized_is_delivered():
    assert (
        torch_quantized_delivery("torch_qint8") and torch_quantized_delivery("torch") and torch_quantized_delivery(None)
    )
    assert not torch_quantized_delivery("ort_dynamic") and not torch_quantized_delivery("torch_fp32")
    slow_eval = evaluation(speedup=0.8, quant_speedup=0.7, quant_speedup_batch=0.8, delivered="torch_qint8")
    best = candidate(1, slow_eval, quantized=["a"])
    assert quantization_cost_speed(best, [best], Objective())
    ort = best.model_copy(update={"eval": slow_eval.model_copy(update={"delivered": "ort_dynamic"})})
    assert not quantization_cost_speed(ort, [ort], Objective())


def test_planner_keeps_quantization_when_onnx_runtime_was_delivered():
    slow = {"iteration": 1, "goal": 0.3, "gamma": 1.0, "passed": True, "quant_speedup": 0.7, "quant_speedup_batch": 0.8}
    assert slowed_round(rounds({**slow, "delivered": "torch_qint8"})) is not None
    assert slowed_round(rounds(slow)) is not None  # rounds recorded before variants: as before
    assert slowed_round(rounds({**slow, "delivered": "ort_static"})) is None
