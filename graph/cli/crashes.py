"""The CLI's word on native crashes: a run (or its child process) that died by a signal, in one line with its step."""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from profiling_agent.graph.review import pending_nodes
from profiling_agent.tools import interrupt

EARLIER_DIR = "earlier"  # under RUN/crash/: fault files a resume has reported (kept as evidence)


class StepCrashed(Exception):
    """A child process of a step died by a signal; the message names the run, the step, the signal and the file."""


# faulthandler's first line names the signal in words (CPython Modules/faulthandler.c, `faulthandler_handlers`)
FAULT_WORDS = {
    "Segmentation fault": "SIGSEGV",
    "Bus error": "SIGBUS",
    "Aborted": "SIGABRT",
    "Illegal instruction": "SIGILL",
    "Floating-point exception": "SIGFPE",
}


@dataclass(frozen=True)
class FaultRecord:
    """A fault file a process left behind: whose it was and how that process ended."""

    path: Path
    role: str  # "run" (the CLI's process) or "child"
    pid: int
    how: str  # the signal ("SIGSEGV", ...), or "" for an empty file (killed before it could remove it)


def signal_of(text: str) -> str:
    """Return the signal a fault file's first line names ("SIGSEGV", ...), "" for an empty file."""
    first = text.lstrip().split("\n", 1)[0] if text.strip() else ""
    if not first:
        return ""
    return next((name for words, name in FAULT_WORDS.items() if words in first), "a fatal signal")


def leftovers(run_path: str | Path) -> list[FaultRecord]:
    """Return the fault files left in a run's crash folder (newest first), empty children's excluded.

    An empty child's file is no record (a child stopped by its parent has no time to remove it); an empty run
    file is: the run's own process was killed.
    """
    folder = interrupt.crash_dir(run_path)
    found: list[FaultRecord] = []
    for path in sorted(folder.glob("faulthandler-*.log"), key=lambda p: p.stat().st_mtime, reverse=True):
        match = interrupt.FAULT_FILE_NAME.match(path.name)
        if match is None:
            continue
        how = signal_of(path.read_text(encoding="utf-8", errors="replace"))
        if how or match.group(1) == interrupt.RUN_ROLE:
            found.append(FaultRecord(path, match.group(1), int(match.group(2)), how))
    return found


def set_aside(run_path: str | Path) -> list[Path]:
    """Move every fault file left in a run's crash folder to crash/earlier/ (empty ones are removed).

    A resume calls it once it has reported them, so they are not reported again; returns the kept files' new paths.
    """
    folder = interrupt.crash_dir(run_path)
    kept: list[Path] = []
    for path in folder.glob("faulthandler-*.log"):
        if interrupt.discard_if_empty(path):
            continue
        target = folder / EARLIER_DIR / path.name
        target.parent.mkdir(exist_ok=True)
        os.replace(path, target)
        kept.append(target)
    return kept


def crash_line(thread_id: str, record: FaultRecord, step: str, resume: str) -> str:
    """Return the line naming how a run's process (or its child) died, in which step, its fault file and the resume.

    Args:
        thread_id: The run's thread.
        record: The fault file the process left (`tools.leftovers`).
        step: The step it was in (the thread's pending nodes), "" when unknown.
        resume: The command that resumes the thread.
    """
    who = f"run {thread_id}" if record.role == interrupt.RUN_ROLE else f"run {thread_id}: a child process"
    where = f" in step {step}" if step else ""
    if record.how:
        return f"{who} died by {record.how}{where}: stack in {record.path}; resume with `{resume}`"
    return (
        f"{who} was killed{where} (SIGKILL or the out-of-memory killer: its fault file {record.path} is empty); "
        f"resume with `{resume}`"
    )


def leftover_line(run_path: Path, thread_id: str, step: str, resume: str) -> str | None:
    """Return the line for the newest fault a run left in RUN/crash/ (a fault before a kill), or None when none."""
    found = leftovers(run_path)
    if not found:
        return None
    record = next((r for r in found if r.how), found[0])
    return crash_line(thread_id, record, step, resume)


def set_aside_line(run_path: Path, thread_id: str, step: str, resume: str) -> str | None:
    """Set a run's fault records aside (`set_aside`) and return the line for the newest, naming its new place.

    Returns None when the run left none. A resume says it once: the next `runs` lists the thread as usual.
    """
    found = leftovers(run_path)
    if not found:
        return None
    record = next((r for r in found if r.how), found[0])
    set_aside(run_path)
    moved = interrupt.crash_dir(run_path) / EARLIER_DIR / record.path.name
    return crash_line(thread_id, replace(record, path=moved) if record.how else record, step, resume)


def step_crashed(graph: Any, config: dict[str, Any], exc: interrupt.ChildCrashed) -> StepCrashed:
    """Turn a child's crash into the error naming the step it happened in (the thread's pending nodes)."""
    step = ", ".join(pending_nodes(graph.get_state(config)))
    where = f": stack in {exc.fault_file}" if exc.fault_file else " (no fault record: killed)"
    thread_id = config["configurable"]["thread_id"]
    return StepCrashed(f"run {thread_id}: a child process of step {step} died by {exc.how}{where}")
