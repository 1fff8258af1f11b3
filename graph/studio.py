"""The graph for `langgraph dev` (Studio), which supplies its own checkpointer."""

from profiling_agent.graph.builder import build_graph

graph = build_graph()
