"""The real work of the agents as plain functions, grouped in rooms; nodes call these, tests call them directly.

The top-level helpers (`io`, `device`, `hub`, `text`, `versions`, `interrupt`, `run_layout`: every path under a
run, `settings`: the settings' choices) import no room. The rooms, lowest
first: `runtimes`, `models`, `data`, `compression`, `recovery`, `profiling`, `evaluation`, `planning`, `shape` and
`reporting`. A module may import the top-level helpers, its own room and the rooms before it, never a room after
it, and nothing under tools imports nodes or graph. The typed records (`state`, `schemas`) may be imported anywhere, the
prompt templates by planning and shape. tests/unit/test_layout.py checks these rules and each room's docstring.
"""
