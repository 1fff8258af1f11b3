"""Telling the user: result.json, the console and Markdown tables, report.html and its plots.

It may import every room below it; only nodes and the CLI import it.
"""
