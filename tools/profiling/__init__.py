"""Measuring where a model spends: static MACs and params, operator and per-module timings, sensitivity probe.

It may import `models`, `data` and `compression` (the sensitivity probe prunes a copy of the model).
"""
