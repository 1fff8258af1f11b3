"""Telling the user: result.json, the console and Markdown tables, report.html and its plots.

It may import every room before it (`runtimes`, `models`, `data`, `compression`, `recovery`, `profiling`,
`evaluation`, `planning`, `shape`) and the top-level helpers. It is the top room: only nodes, graph and the CLI
import it.
"""
