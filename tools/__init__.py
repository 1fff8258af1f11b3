"""The real work of the agents as plain functions, grouped by concern; nodes call these, tests call them directly.

Layers, lowest first; a module imports only from its own layer or the ones before it, never back:
the top-level helpers (`io`, `device`, `hub`), then `models`, `data`, `compression`, `recovery`, `profiling`,
`evaluation`, `planning` and `reporting`. `state.py` (schemas) may be imported from any layer.
"""
