"""SQLite checkpointer under the run root, and helpers to list and inspect threads."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from langgraph.checkpoint.sqlite import SqliteSaver

DB_NAME = "checkpoints.sqlite"


def open_checkpointer(run_root: str | Path) -> SqliteSaver:
    """Open (creating) RUN_ROOT/checkpoints.sqlite; one database holds every thread of that run root."""
    root = Path(run_root)
    root.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(root / DB_NAME, check_same_thread=False)
    saver = SqliteSaver(conn)
    saver.setup()
    return saver


def thread_ids(saver: SqliteSaver) -> list[str]:
    """Return the thread ids stored in the database, oldest first."""
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
