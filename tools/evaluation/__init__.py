"""Judging models: accuracy and agreement, side-by-side latency, memory, and the best-candidate rules.

It may import every room below it (`models`, `data`, `compression`, `profiling`).
"""
