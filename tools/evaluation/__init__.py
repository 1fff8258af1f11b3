"""Judging models: accuracy and agreement, side-by-side latency, memory, and the best-candidate rules.

It may import every room before it (`runtimes`, `models`, `data`, `compression`, `recovery`, `profiling`) and
the top-level helpers. Planning, shape and reporting may import it.
"""
