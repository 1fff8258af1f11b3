"""Wire the agents into the ProfilingAgent state machine."""

from __future__ import annotations

from langgraph.graph import END, START, StateGraph
from langgraph.types import Checkpointer

from profiling_agent.graph import routing
from profiling_agent.nodes.acquire import acquire
from profiling_agent.nodes.analyze import analyze
from profiling_agent.nodes.approve import approve
from profiling_agent.nodes.budget import timed
from profiling_agent.nodes.evaluate import evaluate
from profiling_agent.nodes.held_out import evaluate_held_out
from profiling_agent.nodes.iterate import iterate
from profiling_agent.nodes.measure_baseline import measure_baseline
from profiling_agent.nodes.prepare_data import prepare_data
from profiling_agent.nodes.probe import probe
from profiling_agent.nodes.profile import profile
from profiling_agent.nodes.prune import prune
from profiling_agent.nodes.quantize import quantize
from profiling_agent.nodes.recover import recover
from profiling_agent.nodes.report import report
from profiling_agent.nodes.resolve_shape import resolve_shape
from profiling_agent.state import Context, InputState, State


def build_graph(checkpointer: Checkpointer = None):
    """Build and compile the graph; pass a checkpointer (e.g. SqliteSaver) to make runs resumable."""
    builder = StateGraph(State, context_schema=Context, input_schema=InputState)
    nodes = {
        "acquire": acquire,
        "resolve_input_shape": resolve_shape,
        "prepare_data": prepare_data,
        "profile": profile,
        "probe_sensitivity": probe,
        "measure_baseline": measure_baseline,
        "analyze": analyze,
        "approve": approve,
        "prune": prune,
        "recover": recover,
        "quantize": quantize,
        "evaluate": evaluate,
        "iterate": iterate,
        "evaluate_held_out": evaluate_held_out,
        "report": report,
    }
    # every step runs with the time budget's knobs and records its spent and expected seconds (nodes/budget.py)
    for name, node in nodes.items():
        builder.add_node(name, timed(name, node))

    builder.add_edge(START, "acquire")
    builder.add_edge("acquire", "resolve_input_shape")
    builder.add_edge("resolve_input_shape", "prepare_data")
    builder.add_edge("prepare_data", "profile")
    builder.add_edge("profile", "probe_sensitivity")
    builder.add_edge("probe_sensitivity", "measure_baseline")
    builder.add_edge("measure_baseline", "analyze")
    # a converged planner has nothing new to try: straight to the report; objective.approve pauses for a human
    builder.add_conditional_edges("analyze", routing.after_analyze)
    # a rejected plan skips pruning, quantization and evaluation: iterate records it
    builder.add_conditional_edges("approve", routing.after_approve)
    # a plan the engine could not apply skips quantization and evaluation: iterate records the failure
    builder.add_conditional_edges("prune", routing.after_prune)
    # recovery never fails a candidate (it keeps the one-shot weights), and quantization follows it
    builder.add_edge("recover", "quantize")
    builder.add_conditional_edges("quantize", routing.after_quantize)
    builder.add_edge("evaluate", "iterate")
    # the iterative pruning loop (paper, Algorithm 1), bounded in the routing function
    builder.add_conditional_edges("iterate", routing.after_iterate)
    # the held-out test images are read once, after the loop has chosen: they never steer it
    builder.add_edge("evaluate_held_out", "report")
    builder.add_edge("report", END)
    return builder.compile(checkpointer=checkpointer, name="profiling_agent")
