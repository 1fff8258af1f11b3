"""Choosing what to compress: the deterministic planner, the LLM planner, its tools and client, and the plan guard.

It may import every room below it; nothing below imports it.
"""
