"""Checkpointers (SQLite under the run root, or PostgreSQL by URL), and helpers to list and inspect threads."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.sqlite import SqliteSaver

DB_NAME = "checkpoints.sqlite"
CHECKPOINT_URL_ENV = "PROFILING_AGENT_CHECKPOINT_URL"


def open_checkpointer(run_root: str | Path, url: str | None = None) -> BaseCheckpointSaver:
    """Open the checkpointer of a run root; one database holds every thread.

    Args:
        run_root: The folder holding one sub-folder per thread. Without `url` the checkpoints go to
            RUN_ROOT/checkpoints.sqlite (created if missing).
        url: A PostgreSQL URL (`postgresql://user:password@host:port/dbname`): LangGraph's PostgresSaver on that
            database instead, its tables created if missing. Run folders still live under `run_root`.

    Raises:
        CheckpointStoreError: The URL is malformed, the server cannot be reached, or the postgres extra is missing.
    """
    if url:
        from profiling_agent.graph.checkpoint_pg import open_postgres

        return open_postgres(url)
    root = Path(run_root)
    root.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(root / DB_NAME, check_same_thread=False)
    saver = SqliteSaver(conn)
    saver.setup()
    return saver


def close_checkpointer(saver: BaseCheckpointSaver) -> None:
    """Close the checkpointer's database connection (a no-op for one without a `conn`)."""
    conn = getattr(saver, "conn", None)
    if conn is not None:
        conn.close()


def is_postgres(saver: BaseCheckpointSaver) -> bool:
    """Return True when `saver` is LangGraph's PostgresSaver (or a subclass)."""
    return any(cls.__name__ == "PostgresSaver" for cls in type(saver).__mro__)


def has_checkpoints(run_root: str | Path, url: str | None = None) -> bool:
    """Return whether a checkpoint store exists: always for a URL, else whether RUN_ROOT/checkpoints.sqlite does."""
    return bool(url) or (Path(run_root) / DB_NAME).exists()


def thread_ids(saver: BaseCheckpointSaver) -> list[str]:
    """Return the thread ids stored in the database, oldest first."""
    if is_postgres(saver):
        from profiling_agent.graph.checkpoint_pg import postgres_thread_ids

        return postgres_thread_ids(saver)
    cur = saver.conn.execute("SELECT thread_id, MIN(rowid) FROM checkpoints GROUP BY thread_id ORDER BY 2")
    return [row[0] for row in cur.fetchall()]


def thread_summary(graph: Any, thread_id: str) -> dict[str, Any]:
    """Summarize one thread's latest checkpoint: status, iteration, next nodes, best candidate."""
    snapshot = graph.get_state({"configurable": {"thread_id": thread_id}})
    values = snapshot.values or {}
    best = values.get("best") or {}
    nxt = list(dict.fromkeys(t.name for t in snapshot.tasks or ()))  # next misses a step whose writes were saved
    status = values.get("status", "new")
    if nxt:
        status = "waiting for approval" if any(t.interrupts for t in snapshot.tasks) else "interrupted"
    return {
        "thread_id": thread_id,
        "status": status,
        "next": nxt,
        "iteration": values.get("iteration", 0),
        "iterations": (values.get("objective") or {}).get("iterations"),
        "model": (values.get("model") or {}).get("ref"),
        "best_iteration": best.get("iteration"),
        "best_accuracy": (best.get("eval") or {}).get("accuracy"),
        "updated": (snapshot.created_at or "")[:19],
    }
