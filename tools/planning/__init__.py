"""Choosing what to compress: the deterministic planner, the LLM planner, its tools and client, and the plan guard.

It may import every room before it (`runtimes`, `models`, `data`, `compression`, `recovery`, `profiling`,
`evaluation`), the top-level helpers and the prompt templates. Only shape and reporting may import it.
"""
