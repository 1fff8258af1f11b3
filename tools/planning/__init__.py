"""Choosing what to compress: the planners, the planning round and its calibration trials, and the plan guard.

The deterministic planner, the LLM planner with its tools and client, and human review live here.
It may import every room before it (`runtimes`, `models`, `data`, `compression`, `recovery`, `profiling`,
`evaluation`), the top-level helpers and the prompt templates. Only shape and reporting may import it.
"""
