"""Write checkpoint_format0.sqlite: a thread paused before `second`, holding the typed state models.

Run once with the code before the state package split (commit a274902, `state.py` one module), so the checkpoint
names every model `profiling_agent.state.NAME` and has no `state_format` (format 0):
`PYTHONPATH=<that checkout>/.typecheck python tests/data/make_checkpoint_format0.py OUT_DIR`.
tests/unit/test_state_schema.py reads it back with today's code.
"""

import sys
from pathlib import Path

from langgraph.graph import END, START, StateGraph

from profiling_agent.graph.checkpoint import close_checkpointer, open_checkpointer
from profiling_agent.state import (
    ArtifactRef,
    Candidate,
    CompressionPlan,
    EvalRecord,
    GroupSensitivity,
    InputState,
    LLMStep,
    PlannerMeta,
    PlannerMode,
    ProfileSummary,
    PruneEntry,
    State,
    VariantRecord,
)

THREAD = "presplit"


def typed_values() -> dict:
    """The state a first node returns: typed models, as LangGraph keeps them in its channels."""
    ev = EvalRecord(
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
        peer={"name": "ort_dynamic", "latency_ms": 1.2},
        timing={"wall_over_cpu": 1.01},
    )
    plan = CompressionPlan(pruning=[PruneEntry(layer="blocks\\.1\\.mlp", type="structured", ratio=0.3)])
    cand = Candidate(
        iteration=1,
        status="ok",
        plan=plan,
        planner="deterministic",
        planner_meta=PlannerMeta(goal=0.3, llm=LLMStep(model="m", structured={"mode": "json_schema"})),
        artifact=ArtifactRef(path="iter_01/artifact", sha256="0" * 64, size_bytes=10, params=250),
        eval=ev,
    )
    planner = PlannerMode(requested="auto", mode="deterministic").model_dump()
    return {
        "profile": ProfileSummary(
            totals={"params": 300}, env={"threads": 1}, operators=[{"op": "aten::linear", "self_ms": 1.5, "share": 0.3}]
        ),
        "sensitivity": {"blocks.1.mlp": GroupSensitivity(damage=0.1, ratio=0.3)},
        "plan": plan,
        "current": cand,
        "candidates": [cand],
        "baseline_eval": ev,
        "iteration": 1,
        "history": [{"node": "analyze", "iteration": 1, "time": 1.0, "message": "planned", "planner": planner}],
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
    graph(saver).invoke({}, {"configurable": {"thread_id": THREAD}})
    close_checkpointer(saver)
