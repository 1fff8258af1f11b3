"""The CLI's `runs` command: the threads under a run folder, and the ones whose process died by a signal."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from profiling_agent.graph.checkpoint import has_checkpoints, thread_ids, thread_summary
from profiling_agent.graph.cli.args import EXIT_OK
from profiling_agent.graph.cli.console import say
from profiling_agent.graph.cli.crashes import leftover_line
from profiling_agent.graph.cli.store import checkpoint_url, checkpoints, resume_hint
from profiling_agent.graph.thread_lock import thread_holder
from profiling_agent.tools.reporting.markdown import format_table


def cmd_runs(args: argparse.Namespace) -> int:
    """List the threads under a run folder."""
    from profiling_agent.graph.builder import (
        build_graph,
    )  # lazy: langgraph's runtime (langsmith, httpx); the CLI's flag check runs without it

    root = Path(args.run_dir).resolve()
    url = checkpoint_url(args)
    if not has_checkpoints(root, url):
        say(f"no runs in {root}")
        return EXIT_OK
    with checkpoints(root, url, read_only=True) as saver:
        graph = build_graph(checkpointer=saver, read_only=True)  # reads states: imports no step
        summaries = [thread_summary(graph, tid, thread_holder(saver, root, tid)) for tid in thread_ids(saver)]
    rows = [["thread", "status", "iteration", "next", "best", "top-1 %", "model", "updated"]]
    crashes = []
    for s in summaries:
        line = None if s["status"] == "done" or s["status"].startswith("running") else crash_of(args, root, s)
        if line is not None:
            crashes.append(line)
            s["status"] = "died"
        acc = s["best_accuracy"]
        rows.append(
            [
                s["thread_id"],
                s["status"],
                f"{s['iteration']}/{s['iterations'] or '-'}",
                ",".join(s["next"]) or "-",
                str(s["best_iteration"] or "-"),
                f"{acc:.2f}" if acc is not None else "-",
                str(s["model"]),
                s["updated"],
            ]
        )
    print("\n".join([format_table(rows), *crashes]))
    return EXIT_OK


def crash_of(args: argparse.Namespace, root: Path, summary: dict[str, Any]) -> str | None:
    """Return the line for a listed thread whose last process died by a signal (its fault file left), or None."""
    tid = summary["thread_id"]
    return leftover_line(root / tid, tid, ",".join(summary["next"]), resume_hint(args, tid))
