"""Checkpoints written before a node was renamed (test_best -> evaluate_held_out) still resume."""

from __future__ import annotations

from langgraph.graph import END, START, StateGraph

from profiling_agent.graph.builder import build_graph
from profiling_agent.graph.checkpoint import close_checkpointer, follow_renamed_node, open_checkpointer
from profiling_agent.graph.cli.main import main
from profiling_agent.graph.review import pending_nodes
from profiling_agent.state import InputState, State

THREAD = "old-run"


def _old_checkpoint(root):
    """Save a thread as the graph before the rename left it: iterate done, test_best next."""
    saver = open_checkpointer(root)
    old = StateGraph(State, input_schema=InputState)
    old.add_node("iterate", lambda s: {"stop_reason": "iteration bound reached (1)", "run_path": str(root / THREAD)})
    old.add_node("test_best", lambda s: {})
    old.add_edge(START, "iterate")
    old.add_edge("iterate", "test_best")
    old.add_edge("test_best", END)
    config = {"configurable": {"thread_id": THREAD}}
    graph = old.compile(checkpointer=saver, interrupt_before=["test_best"])
    graph.invoke({}, config)
    assert graph.get_state(config).next == ("test_best",)
    (root / THREAD).mkdir()
    return saver, config


def test_a_thread_stopped_before_the_old_node_name_continues_under_the_new_one(tmp_path):
    saver, config = _old_checkpoint(tmp_path)
    graph = build_graph(checkpointer=saver)
    assert pending_nodes(graph.get_state(config)) == ()  # the old name is unknown to the graph as it is now
    assert follow_renamed_node(graph, saver, config) == "test_best"
    assert pending_nodes(graph.get_state(config)) == ("evaluate_held_out",)
    assert follow_renamed_node(graph, saver, config) is None  # once moved, nothing more to do
    close_checkpointer(saver)


def test_resume_runs_the_held_out_evaluation_of_an_old_thread(tmp_path, capsys):
    saver, _ = _old_checkpoint(tmp_path)
    close_checkpointer(saver)
    code = main(["resume", THREAD, "--run-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert "saved by an older version" in err and "resuming old-run at evaluate_held_out" in err, err
    saver = open_checkpointer(tmp_path)
    values = build_graph(checkpointer=saver).get_state({"configurable": {"thread_id": THREAD}}).values
    close_checkpointer(saver)
    assert code == 0 and values["status"] == "done"
    assert [h["node"] for h in values["history"]] == ["evaluate_held_out", "report"], values["history"]
