"""The CLI's view of the checkpoint store: which one (SQLite or a PostgreSQL URL), opening it, and its hints."""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from profiling_agent.graph.checkpoint import CHECKPOINT_URL_ENV, close_checkpointer, open_checkpointer
from profiling_agent.graph.checkpoint_pg import redact
from profiling_agent.graph.review import resume_command


def checkpoint_url(args: argparse.Namespace) -> str | None:
    """Return the PostgreSQL URL to keep checkpoints in: --checkpoint-url, else the environment, else None."""
    return getattr(args, "checkpoint_url", None) or os.environ.get(CHECKPOINT_URL_ENV) or None


def shown_url(args: argparse.Namespace) -> str | None:
    """Return --checkpoint-url as a hint may print it (password redacted); None when the flag was not given."""
    url = getattr(args, "checkpoint_url", None)
    return redact(url) if url else None


@contextmanager
def checkpoints(root: Path, url: str | None, *, read_only: bool = False) -> Iterator[Any]:
    """Open the run root's checkpointer (SQLite, or PostgreSQL at `url`) for the block, then close it."""
    saver = open_checkpointer(root, url, read_only=read_only)
    try:
        yield saver
    finally:
        close_checkpointer(saver)


def store_name(root: Path, url: str | None) -> str:
    """Name the checkpoint store in a message: the redacted URL, or the run root."""
    return redact(url) if url else str(root)


def runs_hint(args: argparse.Namespace) -> str:
    """Return the `profiling-agent runs` command that lists the threads of the store in use."""
    shown = shown_url(args)
    return (
        f"profiling-agent runs --checkpoint-url {shown}" if shown else f"profiling-agent runs --run-dir {args.run_dir}"
    )


def resume_hint(args: argparse.Namespace, thread_id: str) -> str:
    """Return the command that resumes `thread_id` with the same --run-dir and --checkpoint-url."""
    return resume_command(thread_id, args.run_dir, shown_url(args))
