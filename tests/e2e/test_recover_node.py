"""The recover step in the graph: none leaves the pruned weights alone; auto records accuracy before and after."""

from __future__ import annotations

import pytest
import torch
from helpers.quick_assets import FAST_LATENCY

from profiling_agent.graph.builder import build_graph
from profiling_agent.graph.checkpoint import open_checkpointer
from profiling_agent.state import Context

pytestmark = pytest.mark.slow
FAST = {**FAST_LATENCY, "backend": "torch"}


def _run(tmp_path, quick_resnet, thread: str, **ctx):
    model, dataset, _ = quick_resnet
    inputs = {
        "model": {"ref": str(model)},
        "dataset": {"ref": str(dataset), "subset": 96, "calibration": 16, "test_subset": 64},
        "objective": {"planner": "l2", "ratio": 0.6, "iterations": 1, "quantize": "none"},
    }
    graph = build_graph(checkpointer=open_checkpointer(tmp_path))
    config = {"configurable": {"thread_id": thread}}
    context = Context(run_root=str(tmp_path), **FAST, **ctx)
    return graph.invoke(inputs, config, context=context, durability="sync")


def _weights(path):
    from safetensors.torch import load_file

    return load_file(str(path / "model.safetensors"))


def test_recover_none_leaves_the_pruned_weights_untouched(tmp_path, quick_resnet):
    out = _run(tmp_path, quick_resnet, "off", recover="none")
    cand = out["candidates"][0]
    assert cand["status"] == "ok" and cand["recovered"] is None
    assert cand["recovery"]["method"] == "none" and cand["eval"]["accuracy_before_recovery"] is None
    # the candidate's evaluated weights (best/ holds the unpruned model when this one misses the budget)
    pruned, delivered = (
        _weights(tmp_path / "off" / cand["pruned"]["path"]),
        _weights(tmp_path / "off" / cand["artifact"]["path"]),
    )
    assert pruned.keys() == delivered.keys()
    assert all(torch.equal(pruned[k], delivered[k]) for k in pruned)


def test_recover_auto_refits_and_distills_and_records_before_and_after(tmp_path, quick_resnet):
    out = _run(tmp_path, quick_resnet, "auto", recover="auto", recover_steps=12)
    cand = out["candidates"][0]
    record = cand["recovery"]
    assert record["method"] == "reconstruct+distill" and record["steps"] == 12 and record["consumers"] > 0
    assert record["fit_error_after"] < record["fit_error_before"]
    assert "split 'train'" in record["note"] and record["train_images"] > 0
    assert cand["eval"]["accuracy_before_recovery"] is not None
    pruned, recovered = _weights(tmp_path / "auto" / cand["pruned"]["path"]), _weights(tmp_path / "auto" / "best")
    assert any(not torch.equal(pruned[k], recovered[k]) for k in pruned)
    report = (tmp_path / "auto" / "report.md").read_text()
    assert "val before recovery %" in report


def test_a_slow_pass_of_the_one_shot_weights_is_left_out_and_says_why(tmp_path, quick_resnet, monkeypatch):
    from profiling_agent.tools.evaluation import candidate_eval, scoring

    costs = []
    estimate = candidate_eval.before_recovery_cost
    monkeypatch.setattr(candidate_eval, "before_recovery_cost", lambda *a: costs.append(estimate(*a)) or costs[-1])
    monkeypatch.setattr(scoring, "MIN_PASS_S", 0.0)  # every pass counts as slow here: the estimate decides nothing
    cand = _run(tmp_path, quick_resnet, "slow", recover="reconstruct")["candidates"][0]
    assert cand["recovered"] is not None and cand["eval"]["accuracy_before_recovery"] is None
    assert "accuracy before recovery not measured" in cand["eval"]["before_recovery_note"]
    assert len(costs) == 1 and costs[0] > 0  # the real estimate was made (what it costs: bench/time_to_result.py)


def test_a_recovery_finished_before_an_interruption_is_reused_not_redone(tmp_path, quick_resnet, monkeypatch):
    """The recover step ran to the end but its checkpoint was lost (a double Ctrl-C): the re-run reuses its result."""
    from profiling_agent.tools.recovery import candidate

    model, dataset, _ = quick_resnet
    inputs = {
        "model": {"ref": str(model)},
        "dataset": {"ref": str(dataset), "subset": 96, "calibration": 16, "test_subset": 64},
        "objective": {"planner": "l2", "ratio": 0.6, "iterations": 1, "quantize": "none"},
    }
    graph = build_graph(checkpointer=open_checkpointer(tmp_path))
    config = {"configurable": {"thread_id": "again"}}
    context = Context(run_root=str(tmp_path), **FAST, recover="auto", recover_steps=12)
    graph.invoke(inputs, config, context=context, durability="sync", interrupt_after=["recover"])
    first = graph.get_state(config).values["candidates"] or [graph.get_state(config).values["current"]]
    before = next(s for s in graph.get_state_history(config) if s.next == ("recover",))

    def never(*args, **kwargs):
        raise AssertionError("distillation ran again")

    monkeypatch.setattr(candidate, "distill", never)
    graph.invoke(None, before.config, context=context, durability="sync", interrupt_after=["recover"])
    values = graph.get_state(config).values
    again = values["current"]
    assert again["recovered"] == first[0]["recovered"] and again["recovery"] == first[0]["recovery"]
    assert again["recovery"]["steps"] == 12
    assert "reused, not redone" in values["history"][-1]["message"]


def test_an_explicit_step_count_cut_by_the_time_cap_says_so_and_how_to_lift_it(tmp_path, quick_resnet):
    out = _run(tmp_path, quick_resnet, "capped", recover="distill", recover_steps=400, recover_minutes=0.002)
    record = out["candidates"][0]["recovery"]
    assert record["steps_planned"] == 400 and record["steps"] < 400
    lift = (
        f"the 0.002-minute cap per candidate (--recover-minutes) cut distillation to {record['steps']} of 400 steps "
        "(--recover-steps 400); run them all with --recover-minutes 0 (no cap) or a larger value"
    )
    assert lift in record["note"]  # result.json's candidates[].recovery is this record
    assert any(lift in h["message"] for h in out["history"] if h["node"] == "recover")  # the console's line
    result = (tmp_path / "capped" / "result.json").read_text()
    assert "--recover-minutes 0 (no cap)" in result
