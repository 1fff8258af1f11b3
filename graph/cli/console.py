"""The CLI's console output: progress bars from stream events and the final comparison table."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from profiling_agent.graph.cli.args import EXIT_FAILED, EXIT_INTERRUPTED
from profiling_agent.graph.cli.crashes import step_crashed
from profiling_agent.graph.cli.store import resume_hint
from profiling_agent.tools import interrupt, run_layout
from profiling_agent.tools.io import read_json
from profiling_agent.tools.reporting.markdown import comparison_rows, format_table, test_lines


def say(message: str) -> None:
    """Print one line of progress to stderr."""
    print(message, file=sys.stderr, flush=True)


def step_time(item: dict[str, Any]) -> str:
    """Return a history event's " (spent 12.3 s, expected 10 s)", or "" when it carries no step time."""
    spent = item.get("spent_s")
    if spent is None:
        return ""
    expected = item.get("expected_s")
    return f" ({spent:.1f} s" + (f", expected {expected:.0f} s)" if expected is not None else ")")


class _Progress:
    """Render custom progress events as tqdm bars on stderr and node updates as log lines."""

    def __init__(self) -> None:
        from tqdm import tqdm  # lazy: tqdm; the CLI's flag check and `runs` run without it

        self._tqdm = tqdm
        self._bars: dict[str, Any] = {}
        self._enabled = sys.stderr.isatty()

    def progress(self, event: dict[str, Any]) -> None:
        task, total = event.get("task", ""), int(event.get("total") or 0)
        if not self._enabled or total <= 1:
            return
        bar = self._bars.get(task)
        if bar is None:
            bar = self._bars[task] = self._tqdm(total=total, desc=task, leave=False, file=sys.stderr)
        bar.n = int(event.get("done", 0))
        bar.set_postfix_str(str(event.get("label", ""))[:40])
        bar.refresh()
        if bar.n >= total:
            bar.close()
            self._bars.pop(task, None)

    def update(self, node: str, values: dict[str, Any] | None) -> None:
        for item in (values or {}).get("history") or []:
            it = item.get("iteration")
            prefix = f"[{item.get('node', node)}" + (f" #{it}" if it else "") + "]"
            say(f"{prefix} {item.get('message', '')}{step_time(item)}")

    def close(self) -> None:
        for bar in self._bars.values():
            bar.close()


def drive_graph(
    graph: Any, payload: Any, config: dict[str, Any], context: Any, banner: list[str] | None = None
) -> None:
    """Stream the graph to the console; `banner` is printed once the first node succeeds (bad input stays one line).

    Raises:
        StepCrashed: A child process of a step died by a signal (the step and its fault file named).
    """
    progress = _Progress()
    banner = list(banner or [])
    try:
        for mode, chunk in graph.stream(
            payload, config, context=context, stream_mode=["updates", "custom"], durability="sync"
        ):
            if mode == "custom" and isinstance(chunk, dict) and chunk.get("kind") == "progress":
                progress.progress(chunk)
            elif mode == "updates" and isinstance(chunk, dict):
                while banner:
                    say(banner.pop(0))
                for node, values in chunk.items():
                    progress.update(node, values if isinstance(values, dict) else None)
    except interrupt.ChildCrashed as exc:
        raise step_crashed(graph, config, exc) from None
    finally:
        progress.close()


def final_table(run_path: Path) -> str:
    """Render the comparison table and the held-out lines of a finished run as console text."""
    result = read_json(run_path / run_layout.RESULT)
    lines = [format_table(comparison_rows(result)), ""]
    best = result.get("best")
    if best:
        lines.append(
            f"best: iteration {best['iteration']} ({best['rule']} rule"
            + ("" if best.get("within_budget") else ", NOT within the accuracy budget")
            + f"), {best['reduction']:.1%} {result['objective']['target']} reduction, "
            f"{best['accuracy_drop']:+.2f} pp validation accuracy drop; saved in {run_path / 'best'}"
            + (f" as {best['delivered']} ({best.get('delivery_note')})" if best.get("delivered") else "")
        )
        lines += [line for line in test_lines(result) if line]
    if result.get("outcome"):
        lines.append(f"target: {result['outcome']['statement']}")
    lines.append(f"stopped: {result.get('stop_reason')}")
    lines.append(f"report: {run_path / run_layout.REPORT_MD}   result: {run_path / run_layout.RESULT}")
    return "\n".join(lines)


def resume_line(args: argparse.Namespace) -> str:
    """Return "resume with `...`" for a run or resume command with a thread, else ""."""
    tid = getattr(args, "thread_id", None)
    return f"resume with `{resume_hint(args, tid)}`" if tid and args.command in ("run", "resume") else ""


def stopped_line(args: argparse.Namespace, how: str) -> str:
    """Return the line printed when a signal stops the CLI: what stopped it and how to resume."""
    hint = resume_line(args)
    head = "interrupted" if how in ("", "SIGINT") else f"stopped by {how}"
    return f"{head}: {hint}" if hint else head


def force_exit(args: argparse.Namespace) -> Any:
    """Return the handler of a second Ctrl-C/SIGTERM: stop at once (every file is written atomically)."""

    def force(how: str) -> None:
        say(stopped_line(args, how) + " (stopped at once)")
        interrupt.disable_fault_file()  # no fault: the fault file goes (one left behind would read as a killed run)
        os._exit(EXIT_INTERRUPTED)

    return force


def fault(args: argparse.Namespace, message: str) -> int:
    """Print a fault of the machine (exit 1) in one line, with the resume command when a run was going."""
    hint = resume_line(args)
    say(f"profiling-agent: error: {message}" + (f" (then {hint})" if hint else ""))
    return EXIT_FAILED
