"""Wire the agents into the ProfilingAgent state machine."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from langgraph.graph import END, START, StateGraph
from langgraph.types import Checkpointer

from profiling_agent.graph import routing
from profiling_agent.nodes.budget import timed
from profiling_agent.state import Context, InputState, State

# the steps in order: node name -> "module:function" under profiling_agent.nodes (imported by `build_graph`)
STEPS = {
    "acquire": "acquire:acquire",
    "resolve_input_shape": "resolve_shape:resolve_shape",
    "prepare_data": "prepare_data:prepare_data",
    "profile": "profile:profile",
    "probe_sensitivity": "probe:probe",
    "measure_baseline": "measure_baseline:measure_baseline",
    "analyze": "analyze:analyze",
    "approve": "approve:approve",
    "prune": "prune:prune",
    "recover": "recover:recover",
    "quantize": "quantize:quantize",
    "evaluate": "evaluate:evaluate",
    "iterate": "iterate:iterate",
    "evaluate_held_out": "held_out:evaluate_held_out",
    "report": "report:report",
}


def step(name: str) -> Callable[..., dict[str, Any]]:
    """Return step `name`'s node function, importing its module (the steps import torch and the runtimes)."""
    module, function = STEPS[name].split(":")
    found: Callable[..., dict[str, Any]] = getattr(importlib.import_module(f"profiling_agent.nodes.{module}"), function)
    return found


def not_run(state: State) -> dict[str, Any]:
    """Stand in for every step of a graph built to read checkpoints (`build_graph(read_only=True)`): never runs."""
    raise RuntimeError("this graph was built to read checkpoints: build it with read_only=False to run a step")


def build_graph(checkpointer: Checkpointer = None, *, read_only: bool = False):
    """Build and compile the graph; pass a checkpointer (e.g. SqliteSaver) to make runs resumable.

    With `read_only` the graph has the same steps and edges but imports none of the steps (torch, transformers and
    the runtimes cost seconds to import): enough to read a thread's state and pending steps (`runs`), never to run.
    """
    builder = StateGraph(State, context_schema=Context, input_schema=InputState)
    if read_only:
        for name in STEPS:
            builder.add_node(name, not_run)
    else:
        # every step runs with the time budget's knobs and records its spent and expected seconds (nodes/budget.py)
        for name in STEPS:
            builder.add_node(name, timed(name, step(name)))

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
