"""Measuring where a model spends: static MACs and params, operator and per-module timings, sensitivity probe.

It may import `runtimes`, `models`, `data`, `compression` (the sensitivity probe prunes a copy of the model) and
`recovery` (the fast probe refits as recovery does), and the top-level helpers.
"""
