"""Issue 10's check: with recovery a trained bottleneck ResNet keeps a 2 pp budget at fewer parameters."""

from __future__ import annotations

import pytest
from helpers.quick_assets import FAST_LATENCY

from profiling_agent.graph.builder import build_graph
from profiling_agent.graph.checkpoint import open_checkpointer
from profiling_agent.state import Context

pytestmark = pytest.mark.slow
FAST = {**FAST_LATENCY, "backend": "torch"}


def _run(tmp_path, quick_resnet, recover: str):
    model, dataset, _ = quick_resnet
    inputs = {
        "model": {"ref": str(model)},
        "dataset": {"ref": str(dataset), "subset": 160, "calibration": 32, "test_subset": 160},
        "objective": {"iterations": 2, "max_acc_drop": 2.0, "quantize": "none", "target_reduction": 0.5},
    }
    graph = build_graph(checkpointer=open_checkpointer(tmp_path))
    context = Context(run_root=str(tmp_path), recover=recover, recover_steps=60, **FAST)
    return graph.invoke(inputs, {"configurable": {"thread_id": recover}}, context=context, durability="sync")


def test_recovery_lets_a_trained_resnet_shrink_within_a_2pp_budget_where_one_shot_pruning_does_not(
    tmp_path, quick_resnet
):
    with_recovery = _run(tmp_path, quick_resnet, "auto")
    one_shot = _run(tmp_path, quick_resnet, "none")
    best = with_recovery["best"]
    assert best and best["within_budget"] and best["reduction"] >= 0.3  # measured: -45.0% params
    # one-shot pruning of the same model under the same budget stops far short of it. Its plan weighs groups by their
    # timed latency shares, so it varies between runs: measured -15.3% or -22.9% at its best, against -45.0%
    within = [c for c in one_shot["candidates"] if c.get("eval") and c["eval"]["accuracy"] >= _floor(one_shot)]
    assert all(c["params_after"] > best["params_after"] for c in within)
    assert one_shot["best"] is None or one_shot["best"]["reduction"] <= best["reduction"] - 0.15


def _floor(out) -> float:
    return out["baseline_eval"]["accuracy"] - out["objective"]["max_acc_drop"]
