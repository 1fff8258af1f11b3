"""Delivery policy: best/ never holds a candidate outside the budget; quantization alone wins over useless pruning."""

from __future__ import annotations

from helpers.eval_records import BASE_REF, BASE_VARIANTS, form
from helpers.eval_records import delivery_baseline as _baseline
from helpers.eval_records import delivery_best as _best

from profiling_agent.state import Best, Objective
from profiling_agent.tools.evaluation.delivery import (
    choose_delivery,
    delivery_note,
    delivery_summary,
    quantization_only_peer,
    summary_line,
)


def test_the_peer_is_the_fastest_unpruned_form_within_the_budget():
    objective = Objective(max_acc_drop=2.0)
    peer = _baseline(objective).peer or {}
    assert peer["name"] == "ort_dynamic" and peer["path"] == "baseline_forms/ort_dynamic"  # ov_int8 lost 5 pp
    assert quantization_only_peer(BASE_VARIANTS, _baseline(objective), Objective(max_acc_drop=6.0))["name"] == "ov_int8"


def test_the_peer_is_one_the_backend_choice_could_deliver():
    """Under --backend openvino the ONNX Runtime forms (built as OpenVINO's source) are no peer; torch counts."""
    objective = Objective(max_acc_drop=2.0)
    base = _baseline(objective)
    assert quantization_only_peer(BASE_VARIANTS, base, objective, "openvino")["name"] == "torch_fp32"  # ov_int8 lost 5
    wide = Objective(max_acc_drop=6.0)
    assert quantization_only_peer(BASE_VARIANTS, base, wide, "openvino")["name"] == "ov_int8"
    assert quantization_only_peer(BASE_VARIANTS, base, wide, "onnxruntime")["name"] == "ort_dynamic"
    assert quantization_only_peer(BASE_VARIANTS, base, wide, "torch")["name"] == "torch_fp32"


def test_a_candidate_outside_the_budget_is_never_delivered():
    objective = Objective(max_acc_drop=2.0)
    best = _best(objective, accuracy=80.0, latency=1.0, peer_latency=4.0, reduction=0.4)
    picked, why = choose_delivery(best, _baseline(objective), BASE_REF, objective)
    assert picked is not None and picked.eval is not None and picked.delivered is not None
    assert picked.iteration == 0 and picked.within_budget
    assert picked.delivered.path == "baseline_forms/ort_dynamic" and picked.eval.delivered == "ort_dynamic"
    assert "past the budget" in why and "quantization-only form is delivered" in why
    Best.model_validate(picked.model_dump())  # a valid state record: evaluate_held_out and report load it


def test_pruning_that_adds_no_speed_delivers_the_quantization_only_form():
    objective = Objective(max_acc_drop=2.0, target="latency")
    best = _best(objective, accuracy=89.5, latency=4.0, peer_latency=4.04, reduction=0.6)  # within the 2% tie
    picked, why = choose_delivery(best, _baseline(objective), BASE_REF, objective)
    assert picked is not None and picked.eval is not None
    assert picked.iteration == 0 and "pruning added no speed" in why
    summary = delivery_summary(
        {**picked.eval.model_dump(), "iteration": 0}, _baseline(objective).model_dump(), objective
    )
    assert summary["pruning_added"] is False and summary["vs_quantization_only"] == 1.0
    assert "of the unpruned model" in summary_line(summary)


def test_a_faster_pruned_candidate_is_delivered_and_its_ratio_stated():
    objective = Objective(max_acc_drop=2.0)
    best = _best(objective, accuracy=89.0, latency=2.0, peer_latency=4.0, reduction=0.4)
    picked, why = choose_delivery(best, _baseline(objective), BASE_REF, objective)
    assert picked is not None and picked.iteration == 1
    assert "2.00x faster than quantizing the unpruned model alone" in why
    final = {"baseline": {"latency_ms": 10.0}, "unpruned_ort_dynamic": {"latency_ms": 4.0}}
    assert best.eval is not None
    result_best = {**best.eval.model_dump(), "iteration": 1}
    base = _baseline(objective).model_dump()
    summary = delivery_summary(result_best, base, objective, final, {"busy": True, "factor": 1.5})
    assert summary["vs_original_torch"] == 5.0 and summary["vs_quantization_only"] == 2.0
    assert summary["timings_flagged"] and "TIMINGS FLAGGED" in summary_line(summary)


def test_a_params_target_keeps_a_slower_pruned_model_that_reaches_it():
    objective = Objective(max_acc_drop=2.0, target="params", target_reduction=0.4)
    best = _best(objective, accuracy=89.0, latency=4.5, peer_latency=4.0, reduction=0.45)
    picked, why = choose_delivery(best, _baseline(objective), BASE_REF, objective)
    assert picked is not None and picked.iteration == 1 and "is what the params target asks for" in why


def test_without_runtime_forms_the_unpruned_torch_model_is_the_fallback():
    objective = Objective(max_acc_drop=2.0)
    base = _baseline(objective).model_copy(update={"variants": [], "peer": None})
    best = _best(objective, accuracy=70.0, latency=1.0, peer_latency=0.0, reduction=0.5)
    picked, _ = choose_delivery(best, base, BASE_REF, objective)
    assert picked is not None and picked.eval is not None and picked.artifact is not None
    assert picked.iteration == 0 and picked.delivered is None and picked.artifact.path == "baseline"
    assert picked.eval.delivered == "torch_fp32" and picked.eval.accuracy == 90.0


def test_the_note_never_calls_an_out_of_budget_form_fastest():
    chosen = form("ort_dynamic", speedup=0.18)
    note = delivery_note(chosen, False, [], "auto")
    assert "fastest" not in note and "no form of this candidate kept the accuracy budget" in note
    assert delivery_note(chosen, True, ["ov_int8: boom"], "auto").startswith("fastest measured form within")


def test_the_final_verdict_picks_the_fastest_in_budget_unpruned_form_of_the_final_timing():
    """Round 0 took ort_dynamic as the peer; timed side by side at the end, ov_fp32 is faster than the candidate."""
    from profiling_agent.tools.evaluation.delivery import final_peer

    objective = Objective(max_acc_drop=2.0, target="latency")
    variants = [
        *BASE_VARIANTS,
        form("ov_fp32", accuracy=89.5, latency_ms=5.0, size_mb=4.0, path="baseline_forms/ov_fp32"),
    ]
    base = _baseline(objective).model_copy(update={"variants": variants})
    assert (base.peer or {})["name"] == "ort_dynamic"  # the baseline's own measurement
    best = _best(objective, accuracy=89.0, latency=2.0, peer_latency=4.0, reduction=0.4)
    assert choose_delivery(best, base, BASE_REF, objective)[0].iteration == 1  # the round said 2x faster
    latency = {
        "baseline": {"latency_ms": 10.0, "latency_batch_ms": 50.0},
        "iter_01": {"latency_ms": 1.6, "latency_batch_ms": 8.0},
        "unpruned_ort_dynamic": {"latency_ms": 2.0, "latency_batch_ms": 9.0},
        "unpruned_ov_fp32": {"latency_ms": 1.0, "latency_batch_ms": 6.0},
        "unpruned_ov_int8": {"latency_ms": 0.5, "latency_batch_ms": 3.0},  # faster, but 5 pp lost: no peer
    }
    peer = final_peer(latency, base, objective)
    assert peer is not None and peer["name"] == "ov_fp32" and peer["latency_ms"] == 1.0
    assert peer["chosen_from"] == "final side-by-side timing"
    picked, why = choose_delivery(best, base, BASE_REF, objective, (latency, {"final_peer": peer}))
    assert picked is not None and picked.iteration == 0 and picked.within_budget
    assert picked.delivered is not None and picked.delivered.path == "baseline_forms/ov_fp32"
    assert "pruning added no speed: 0.62x" in why
    assert picked.eval is not None
    row = {**picked.eval.model_dump(), "iteration": 0}
    summary = delivery_summary(row, base.model_dump(), objective, latency, {"final_peer": peer})
    assert summary["quantization_only"]["name"] == "ov_fp32" and summary["vs_original_torch"] == 10.0
    assert summary["quantization_only"]["chosen_from"] == "final side-by-side timing"
    # timed faster than that peer at the end too: the candidate stays
    faster = {**latency, "iter_01": {"latency_ms": 0.5, "latency_batch_ms": 3.0}}
    assert choose_delivery(best, base, BASE_REF, objective, (faster, {"final_peer": peer}))[0].iteration == 1


def test_a_speed_up_whose_paired_interval_holds_one_says_no_measurable_difference():
    from profiling_agent.tools.reporting.speed import delivered_speed, speed_sentence

    objective = Objective(max_acc_drop=2.0)
    best = _best(objective, accuracy=89.0, latency=1.0, peer_latency=1.05, reduction=0.4)
    assert best.eval is not None
    final = {
        "baseline": {"latency_ms": 10.0, "samples_ms": [10.0, 10.2, 9.9, 10.1, 10.0]},
        "iter_01": {"latency_ms": 1.0, "samples_ms": [1.0, 1.2, 0.9, 1.1, 1.0]},
        "unpruned_ort_dynamic": {"latency_ms": 1.05, "samples_ms": [1.1, 1.0, 1.2, 1.0, 1.05]},
    }
    summary = delivery_summary(
        {**best.eval.model_dump(), "iteration": 1, "within_budget": True},
        _baseline(objective).model_dump(),
        objective,
        final,
        {},
    )
    quant = summary["vs_quantization_only_ci"]
    assert summary["vs_quantization_only"] == 1.05 and quant["ci"][0] < 1.0 < quant["ci"][1]
    assert summary["verdict"].startswith(
        "no measurable difference from quantizing the unpruned model alone: 1.05x, the median of 5 paired repeats"
    )
    assert "faster than quantizing" not in summary_line(summary) and "95% interval" in summary_line(summary)
    assert summary["vs_original_torch_ci"]["ci"][0] > 1.0  # 10x the torch model: clearly measured
    sentence = speed_sentence(delivered_speed({"best": {"speedup": 10.0}, "delivery": summary}))
    assert "no measurable difference" in sentence and "faster than" not in sentence
    contended = {"contended": True, "reference": {"slowdown": 1.4, "tolerance": 0.1}}
    flagged = delivery_summary(
        {**best.eval.model_dump(), "iteration": 1, "within_budget": True},
        _baseline(objective).model_dump(),
        objective,
        final,
        contended,
    )
    assert flagged["timings_flagged"] and "1.4x its quiet time" in summary_line(flagged)
    assert "TIMINGS FLAGGED: a reference workload ran 1.4x" in speed_sentence(
        delivered_speed({"best": {"speedup": 10.0}, "delivery": flagged})
    )


def test_a_latency_target_delivers_the_peer_when_the_final_paired_interval_reaches_one():
    """Under a latency target, a candidate only 1.05x the peer by the medians but not measurably faster is not
    delivered: the same seed then delivers the same file whichever way the noise fell."""
    from profiling_agent.tools.evaluation.delivery import final_peer

    objective = Objective(max_acc_drop=2.0, target="latency")
    base = _baseline(objective)
    best = _best(objective, accuracy=89.0, latency=1.0, peer_latency=1.5, reduction=0.4)
    noisy = {
        "baseline": {"latency_ms": 10.0, "latency_batch_ms": 50.0, "samples_ms": [10.0, 10.2, 9.9, 10.1, 10.0]},
        "iter_01": {"latency_ms": 1.0, "latency_batch_ms": 5.0, "samples_ms": [1.0, 1.3, 0.8, 1.2, 0.9]},
        "unpruned_ort_dynamic": {
            "latency_ms": 1.05,
            "latency_batch_ms": 5.2,
            "samples_ms": [1.2, 1.0, 1.0, 0.9, 1.1],
        },
    }
    peer = final_peer(noisy, base, objective)
    assert peer is not None and peer["name"] == "ort_dynamic"
    picked, why = choose_delivery(best, base, BASE_REF, objective, (noisy, {"final_peer": peer}))
    assert picked is not None and picked.iteration == 0 and "no measurable speed" in why
    clear = {**noisy, "iter_01": {**noisy["iter_01"], "latency_ms": 0.5, "samples_ms": [0.5, 0.52, 0.49, 0.5, 0.51]}}
    assert choose_delivery(best, base, BASE_REF, objective, (clear, {"final_peer": peer}))[0].iteration == 1
    params = Objective(max_acc_drop=2.0, target="params", target_reduction=0.4)  # the rule is latency's only
    assert choose_delivery(best, base, BASE_REF, params, (noisy, {"final_peer": peer}))[0].iteration == 1
