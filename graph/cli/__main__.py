"""`python -m profiling_agent.graph.cli`: the same entry point as the `profiling-agent` command."""

from profiling_agent.graph.cli.main import entry

entry()
