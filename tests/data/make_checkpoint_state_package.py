"""Write checkpoint_state_package.sqlite: a thread paused before `second`, holding the typed state models.

Run once with the code of commit 5d74f3e, while the state was a package of modules (`state/records.py`,
`state/plans.py`, ...), so the checkpoint names every model by its module there
(`profiling_agent.state.records.Candidate`, `profiling_agent.state.graph_state.HistoryEvent`, ...) and has
`state_format` 1: `PYTHONPATH=<that checkout>/.typecheck python tests/data/make_checkpoint_state_package.py OUT_DIR`.
tests/unit/test_state_schema.py reads it back with today's code.
"""

import sys
from pathlib import Path

from langgraph.graph import END, START, StateGraph

from profiling_agent.graph.checkpoint import close_checkpointer, open_checkpointer
from profiling_agent.state import (
    AppliedGroup,
    ArtifactRef,
    Best,
    Candidate,
    CompressionPlan,
    DataRef,
    DatasetRef,
    EvalRecord,
    Fallback,
    GroupSensitivity,
    HistoryEvent,
    InputShape,
    InputState,
    LabelMap,
    LLMStep,
    ModelRef,
    Objective,
    PlannerMeta,
    PlannerMode,
    ProfileSummary,
    PruneEntry,
    RecoveryRecord,
    ReportRef,
    State,
    TestEval,
    VariantRecord,
)

THREAD = "state-package"
INPUT = {"model": {"ref": "embedded:vit-digits"}, "dataset": {"ref": "embedded:digits", "subset": 64}}


def _eval() -> EvalRecord:
    return EvalRecord(
        name="c1",
        accuracy=90.0,
        agreement=95.0,
        n_samples=64,
        latency_ms=1.5,
        latency_batch_ms=9.0,
        batch_size=16,
        baseline_latency_ms=2.0,
        speedup=1.33,
        memory_bytes=1000,
        size_mb=0.5,
        params=250,
        macs=1000,
        threads=1,
        variants=[VariantRecord(name="torch_fp32", backend="torch", status="ok", recipe={"exporter": "none"})],
    )


def _candidate(plan: CompressionPlan) -> dict:
    """A finished round's fields (shared by `Candidate` and `Best`)."""
    return {
        "iteration": 1,
        "status": "ok",
        "plan": plan,
        "planner": "deterministic",
        "planner_meta": PlannerMeta(goal=0.3, llm=LLMStep(model="m", structured={"mode": "json_schema"})),
        "applied": [
            AppliedGroup(
                group="blocks.1.mlp", module="blocks.1.mlp", kind="structured", ratio=0.3, units_before=8, units_after=6
            )
        ],
        "recovery": RecoveryRecord(requested="auto", method="reconstruct", consumers=2),
        "artifact": ArtifactRef(path="iter_01/artifact", sha256="0" * 64, size_bytes=10, params=250),
        "eval": _eval(),
    }


def typed_values() -> dict:
    """The state a first node returns: typed models of every module of the state package."""
    plan = CompressionPlan(pruning=[PruneEntry(layer="blocks\\.1\\.mlp", type="structured", ratio=0.3)])
    cand = Candidate(**_candidate(plan))
    planner = PlannerMode(requested="auto", mode="deterministic")
    return {
        "model": ModelRef(ref="embedded:vit-digits"),
        "dataset": DatasetRef(ref="embedded:digits", subset=64),
        "objective": Objective(),
        "labels": LabelMap(
            method="identical", dataset_to_model={"0": 0}, restricted=False, image_column="image", label_column="label"
        ),
        "data": DataRef(
            path="data.pt",
            sha256="1" * 64,
            n_eval=64,
            n_calib=32,
            image_column="image",
            label_column="label",
            seed=0,
            shape=[1, 8, 8],
        ),
        "input_shape": InputShape(channels=1, height=8, width=8, source="config"),
        "profile": ProfileSummary(
            totals={"params": 300}, env={"threads": 1}, operators=[{"op": "aten::linear", "self_ms": 1.5, "share": 0.3}]
        ),
        "sensitivity": {"blocks.1.mlp": GroupSensitivity(damage=0.1, ratio=0.3)},
        "baseline_eval": _eval(),
        "plan": plan,
        "current": cand,
        "candidates": [cand],
        "best": Best(**_candidate(plan), rule="budget", within_budget=True, reduction=0.25, accuracy_drop=0.5),
        "fallbacks": [Fallback(iteration=1, stage="parse", reason="no JSON in the answer")],
        "test_eval": TestEval(split="test", n_samples=64, baseline_accuracy=91.0, best_iteration=1, best_accuracy=90.0),
        "report": ReportRef(markdown="report.md"),
        "iteration": 1,
        "state_format": 1,
        "history": [
            HistoryEvent(node="acquire", time=1.0, message="loaded", safe_adapter=True),
            HistoryEvent(node="analyze", iteration=1, time=2.0, message="planned", planner_choice=planner),
        ],
    }


def graph(saver, second=lambda state: {}):
    """The two-node graph the checkpoint was written by (paused before `second`)."""
    builder = StateGraph(State, input_schema=InputState)
    builder.add_node("first", lambda state: typed_values())
    builder.add_node("second", second)
    builder.add_edge(START, "first")
    builder.add_edge("first", "second")
    builder.add_edge("second", END)
    return builder.compile(checkpointer=saver, interrupt_before=["second"])


if __name__ == "__main__":
    root = Path(sys.argv[1])
    root.mkdir(parents=True, exist_ok=True)
    saver = open_checkpointer(root)
    graph(saver).invoke(INPUT, {"configurable": {"thread_id": THREAD}})
    close_checkpointer(saver)
