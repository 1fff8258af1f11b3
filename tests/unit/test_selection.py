from helpers.eval_records import candidate, evaluation

from profiling_agent.graph.routing import after_analyze, after_iterate, after_prune, after_quantize
from profiling_agent.state import Context, Objective, State
from profiling_agent.tools.evaluation.selection import objective_met, reduction, select_best

BASE = evaluation(accuracy=90.0, params=1000, macs=5000, size_mb=4.0, latency_ms=2.0, speedup=1.0)


def cand(it, acc, params, lat=1.0, status="ok"):
    ev = evaluation(
        accuracy=acc, params=params, macs=params * 5, size_mb=params / 250, latency_ms=lat, speedup=2.0 / lat
    )
    return candidate(it, ev if status == "ok" else None, status=status)


def test_paper_rule_prefers_accuracy_then_params_then_latency():
    cands = [cand(1, 89.0, 500), cand(2, 89.5, 800), cand(3, 89.5, 700, lat=1.5), cand(4, 89.5, 700, lat=1.2)]
    best = select_best(cands, BASE, Objective(select="paper"))
    assert best is not None and best.iteration == 4 and best.rule == "paper"


def test_budget_rule_takes_largest_reduction_within_budget():
    cands = [cand(1, 89.0, 500), cand(2, 85.0, 200), cand(3, 88.5, 400)]
    best = select_best(cands, BASE, Objective(select="budget", max_acc_drop=2.0))
    assert best is not None and best.iteration == 3 and best.within_budget and abs(best.reduction - 0.6) < 1e-9


def test_budget_rule_without_fitting_candidate_flags_it():
    best = select_best([cand(1, 80.0, 500), cand(2, 82.0, 600)], BASE, Objective(max_acc_drop=1.0))
    assert best is not None and best.iteration == 2 and best.within_budget is False


def test_failed_candidates_are_ignored():
    assert select_best([cand(1, 0, 0, status="failed")], BASE, Objective()) is None


def test_latency_reduction_uses_side_by_side_speedup():
    assert abs(reduction(evaluation(speedup=2.0), BASE, "latency") - 0.5) < 1e-9


def test_objective_met_needs_budget_and_target():
    obj = Objective(max_acc_drop=1.0, target_reduction=0.4)
    good = select_best([cand(1, 89.5, 500)], BASE, obj)
    assert objective_met(good, BASE, obj)
    short = select_best([cand(1, 89.5, 700)], BASE, obj)
    assert not objective_met(short, BASE, obj)


def test_routing_enforces_the_iteration_bound():
    s = State(objective=Objective(iterations=3), iteration=3)
    assert after_iterate(s) == "evaluate_held_out"
    assert after_iterate(State(objective=Objective(iterations=3), iteration=2)) == "analyze"
    assert after_iterate(State(iteration=1, stop_reason="objective met")) == "evaluate_held_out"
    assert after_prune(State(current={"iteration": 1, "status": "failed"})) == "iterate"
    assert after_prune(State(current={"iteration": 1, "status": "ok"})) == "recover"
    assert after_quantize(State(current={"iteration": 1, "status": "failed"})) == "iterate"
    assert after_quantize(State(current={"iteration": 1, "status": "ok"})) == "evaluate"
    assert after_analyze(State(stop_reason="converged")) == "evaluate_held_out"
    assert after_analyze(State()) == "prune"


def test_result_reports_the_final_joint_latency_for_every_candidate():
    from profiling_agent.state import ArtifactRef, Best, DatasetRef, ModelRef
    from profiling_agent.tools.reporting.records import RunRecords
    from profiling_agent.tools.reporting.result import build_result

    ev = evaluation(latency_ms=5.0, latency_batch_ms=9.0, speedup=0.5, size_mb=1.0, memory_bytes=10, params=100)
    artifact = ArtifactRef(path="iter_01/c", sha256="0", size_bytes=1, params=100)
    records = RunRecords(
        thread_id="t",
        model=ModelRef(),
        dataset=DatasetRef(),
        objective=Objective(planner="deterministic"),
        baseline_eval=ev.model_copy(update={"latency_ms": 2.5, "speedup": 1.0}),
        candidates=[candidate(1, ev, artifact=artifact)],
        best=Best(
            iteration=1, eval=ev, artifact=artifact, rule="paper", within_budget=True, reduction=0.5, accuracy_drop=0
        ),
    )
    final = {
        "baseline": {"latency_ms": 4.0, "latency_batch_ms": 8.0},
        "iter_01": {"latency_ms": 2.0, "latency_batch_ms": 6.0},
    }
    result = build_result(records, final)
    for row in (result["candidates"][0], result["best"]):
        assert row["latency_ms"] == 2.0 and row["speedup"] == 2.0 and row["round_latency_ms"] == 5.0
    assert result["baseline"]["latency_ms"] == 4.0 and result["thread_id"] == "t"


def test_the_final_timing_times_every_unpruned_form_that_kept_the_budget_and_is_kept_for_the_report(tmp_path):
    from profiling_agent.state import Candidate, EvalRecord, Objective, VariantRecord
    from profiling_agent.tools.evaluation.final_latency import (
        FINAL_FILE,
        final_latency,
        kept_final,
        unpruned_contenders,
    )
    from profiling_agent.tools.io import write_json_atomic

    peer = {"name": "ort_dynamic", "path": "baseline_forms/ort_dynamic", "latency_ms": 1.5, "latency_batch_ms": 20.0}
    forms = [
        VariantRecord(name="torch_fp32", backend="torch", status="ok", accuracy=90.0, path="baseline"),
        VariantRecord(name="ort_dynamic", backend="onnxruntime", status="ok", accuracy=89.5, path=peer["path"]),
        VariantRecord(name="ov_bf16", backend="openvino", status="ok", accuracy=89.8, path="baseline_forms/ov_bf16"),
        VariantRecord(name="ov_int8", backend="openvino", status="ok", accuracy=80.0, path="baseline_forms/ov_int8"),
        VariantRecord(name="ort_static", backend="onnxruntime", status="failed", path="baseline_forms/x"),
    ]
    base = EvalRecord(
        name="baseline",
        accuracy=90.0,
        agreement=100.0,
        n_samples=8,
        latency_ms=9.0,
        latency_batch_ms=90.0,
        batch_size=16,
        baseline_latency_ms=9.0,
        speedup=1.0,
        memory_bytes=1,
        size_mb=1.0,
        params=10,
        macs=10,
        threads=1,
        peer=peer,
        variants=forms,
    )
    # ov_int8 lost 10 pp (outside a 1 pp budget), ort_static failed, torch_fp32 is the baseline itself
    assert unpruned_contenders(base, Objective(max_acc_drop=1.0)) == {
        "ort_dynamic": "baseline_forms/ort_dynamic",
        "ov_bf16": "baseline_forms/ov_bf16",
    }
    assert unpruned_contenders(base, None) == {"ort_dynamic": "baseline_forms/ort_dynamic"}  # the recorded peer
    artifact = {"path": "iter_01/c", "sha256": "0", "size_bytes": 1, "params": 10}
    one = Candidate(iteration=1, status="ok", artifact=artifact, eval=base.model_copy(update={"name": "iter_01"}))
    # nothing to time without images or a finished candidate
    assert final_latency([one], one.artifact, base, Context(), root=tmp_path, images=None) == ({}, {})
    kept = {"baseline": {"latency_ms": 9.0}, "iter_01": {"latency_ms": 1.0}, "unpruned_ov_bf16": {"latency_ms": 0.8}}
    write_json_atomic(tmp_path / FINAL_FILE, {"candidates": ["iter_01"], "latency": kept, "timing": {"busy": False}})
    assert kept_final(tmp_path, ["iter_01", "iter_02"]) is None  # timed other candidates: timed again
    # the held-out step timed it; the report reads it back without loading a model (the paths do not exist)
    again = final_latency([one], one.artifact, base, Context(), root=tmp_path, images=lambda: None)
    assert again == (kept, {"busy": False})


def test_a_delivered_form_other_than_the_peer_has_its_unpruned_twin_timed_at_the_end():
    from profiling_agent.state import Candidate, EvalRecord, VariantRecord
    from profiling_agent.tools.evaluation.final_latency import same_form_paths

    peer = {"name": "ort_dynamic", "path": "baseline_forms/ort_dynamic", "latency_ms": 0.11, "latency_batch_ms": 0.8}
    forms = [
        VariantRecord(name="ort_fp32", backend="onnxruntime", status="ok", path="baseline_forms/ort_fp32"),
        VariantRecord(name="ort_static", backend="onnxruntime", status="failed", path="baseline_forms/x"),
    ]
    base = EvalRecord(name="baseline", accuracy=90.0, agreement=100.0, n_samples=8, latency_ms=2.0,
                      latency_batch_ms=9.0, batch_size=16, baseline_latency_ms=2.0, speedup=1.0, memory_bytes=1,
                      size_mb=1.0, params=10, macs=10, threads=1, peer=peer, variants=forms)  # fmt: skip
    timing = {"busy": False, "wall_over_cpu": 1.0}
    ev = base.model_copy(update={"name": "iter_01", "latency_ms": 0.08, "latency_batch_ms": 0.5, "speedup": 25.0,
                                 "baseline_latency_ms": 2.0, "baseline_latency_batch_ms": 9.0, "timing": timing,
                                 "delivered": "ort_fp32", "peer": {**peer, "latency_ms": 0.1}})  # fmt: skip
    artifact = {"path": "iter_01/c", "sha256": "0", "size_bytes": 1, "params": 10}
    delivered = {**artifact, "path": "iter_01/variants/ort_fp32"}
    one = Candidate(iteration=1, status="ok", artifact=artifact, eval=ev, delivered=delivered)
    assert same_form_paths([one], base) == {"ort_fp32": "baseline_forms/ort_fp32"}
    on_peer = one.model_copy(update={"eval": ev.model_copy(update={"delivered": "ort_dynamic"})})
    assert same_form_paths([on_peer], base) == {}
    failed_form = one.model_copy(update={"eval": ev.model_copy(update={"delivered": "ort_static"})})
    assert same_form_paths([failed_form], base) == {}  # the unpruned form never built: nothing to time
    torch_delivery = one.model_copy(
        update={"delivered": None, "eval": ev.model_copy(update={"delivered": "torch_fp32"})}
    )
    assert same_form_paths([torch_delivery], base) == {}  # the baseline itself is timed already


def test_quantization_that_slowed_the_best_model_earns_one_more_round():
    from profiling_agent.tools.evaluation.selection import quantization_cost_speed

    slow = candidate(1, evaluation(speedup=0.7, quant_speedup=0.6, quant_speedup_batch=0.8))
    quantized = [candidate(1, quantized=["a"])]
    assert quantization_cost_speed(slow, quantized, Objective(target="params"))
    assert not quantization_cost_speed(slow, quantized, Objective(target="size"))
    assert not quantization_cost_speed(slow, [*quantized, candidate(2, quantized=[])], Objective())
    fast = candidate(1, evaluation(speedup=1.3, quant_speedup=0.9, quant_speedup_batch=0.9))
    assert not quantization_cost_speed(fast, quantized, Objective())


def test_budget_rule_breaks_reduction_ties_by_speed():
    a, b = cand(1, 89.9, 500, lat=4.0), cand(2, 89.5, 500, lat=1.0)
    best = select_best([a, b], BASE, Objective(select="budget"))
    assert best is not None and best.iteration == 2
