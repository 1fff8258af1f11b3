"""Checkpointers (SQLite under the run root, or PostgreSQL by URL), and helpers to list and inspect threads."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Any, cast
from urllib.parse import quote

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.sqlite import SqliteSaver
from pydantic import BaseModel

from profiling_agent.graph.checkpoint_pg import open_postgres, postgres_thread_ids
from profiling_agent.graph.serde import state_serializer
from profiling_agent.schemas.migrations import RENAMED_NODES
from profiling_agent.schemas.migrations import pending as pending_migrations

DB_NAME = "checkpoints.sqlite"
CHECKPOINT_URL_ENV = "PROFILING_AGENT_CHECKPOINT_URL"


class CheckpointFormatError(ValueError):
    """A checkpoint's state format is newer than this version's (`STATE_FORMAT`): resume it with its own version.

    A ValueError, so the CLI says it in one line with the bad-input exit code.
    """


class CheckpointDatabaseError(RuntimeError):
    """The checkpoint database cannot be opened or read (damaged, or not a database): a fault, exit code 1."""


def writable(folder: str | Path) -> bool:
    """Return whether files can be created in `folder` (tried, so a read-only mount is caught even for root)."""
    probe = Path(folder) / f".write-test-{os.getpid()}"
    try:
        probe.write_bytes(b"")
        probe.unlink()
    except OSError:
        return False
    return True


def _damaged(path: Path, exc: sqlite3.Error) -> CheckpointDatabaseError:
    return CheckpointDatabaseError(
        f"checkpoint database {path} cannot be read ({exc}): it is damaged or not a checkpoint database, and the "
        "runs it held cannot be resumed (their folders beside it stay)"
    )


def _open_read_only(path: Path) -> sqlite3.Connection:
    """Open a SQLite file for reading only; a WAL file in a read-only folder is read as immutable."""
    uri = f"file:{quote(str(path))}"
    try:
        conn = sqlite3.connect(f"{uri}?mode=ro", uri=True, check_same_thread=False)
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
        return conn
    except sqlite3.OperationalError:  # WAL needs its -shm file, which a read-only folder cannot hold
        return sqlite3.connect(f"{uri}?immutable=1", uri=True, check_same_thread=False)


def open_checkpointer(run_root: str | Path, url: str | None = None, *, read_only: bool = False) -> BaseCheckpointSaver:
    """Open the checkpointer of a run root; one database holds every thread.

    Args:
        run_root: The folder holding one sub-folder per thread. Without `url` the checkpoints go to
            RUN_ROOT/checkpoints.sqlite (created if missing).
        url: A PostgreSQL URL (`postgresql://user:password@host:port/dbname`): LangGraph's PostgresSaver on that
            database instead, its tables created if missing. Run folders still live under `run_root`.
        read_only: Only read (SQLite: the file is opened read-only and never set up, so a read-only run folder can
            be listed and inspected).

    Raises:
        CheckpointStoreError: The URL is malformed, the server cannot be reached, or the postgres extra is missing.
        CheckpointDatabaseError: The SQLite file is damaged or not a database (the message names it).
    """
    if url:
        return open_postgres(url)
    root = Path(run_root)
    path = root / DB_NAME
    conn = None
    try:
        if read_only:
            conn = _open_read_only(path)
            conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
            saver = SqliteSaver(conn, serde=state_serializer())
            saver.is_setup = True  # setting up writes (journal mode, tables): a reader must not
            return saver
        root.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(path, check_same_thread=False)
        saver = SqliteSaver(conn, serde=state_serializer())
        saver.setup()
        return saver
    except sqlite3.DatabaseError as exc:
        if conn is not None:
            conn.close()
        if isinstance(exc, sqlite3.OperationalError) and "readonly" in str(exc):
            raise
        raise _damaged(path, exc) from None


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
        return postgres_thread_ids(saver)
    if not isinstance(saver, SqliteSaver):
        raise TypeError(f"cannot list the threads of a {type(saver).__name__}: SQLite or PostgreSQL only")
    try:
        cur = saver.conn.execute("SELECT thread_id, MIN(rowid) FROM checkpoints GROUP BY thread_id ORDER BY 2")
    except sqlite3.OperationalError as exc:
        if "no such table" in str(exc):  # a read-only open of a database nothing was ever saved in
            return []
        raise
    return [row[0] for row in cur.fetchall()]


def thread_summary(graph: Any, thread_id: str, holder: str | None = None) -> dict[str, Any]:
    """Summarize one thread's latest checkpoint: status, iteration, next nodes, best candidate.

    `holder` names the process running the thread now (graph.thread_lock.thread_holder): its status is "running",
    not "interrupted".
    """
    snapshot = graph.get_state({"configurable": {"thread_id": thread_id}})
    # a channel holds a typed record or, as written by a node or an older version, its dict
    values = {k: v.model_dump() if isinstance(v, BaseModel) else v for k, v in (snapshot.values or {}).items()}
    best = values.get("best") or {}
    nxt = list(dict.fromkeys(t.name for t in snapshot.tasks or ()))  # next misses a step whose writes were saved
    status = values.get("status", "new")
    if holder:
        status = f"running ({holder})"
    elif nxt:
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


def saved_format(saver: BaseCheckpointSaver, config: dict[str, Any]) -> int:
    """Return the state format a thread's latest checkpoint was written in (0: before formats were numbered)."""
    saved = saver.get_tuple(cast(RunnableConfig, config))
    values = (saved.checkpoint.get("channel_values") or {}) if saved else {}
    return int(values.get("state_format") or 0)


def _waits_for(saver: BaseCheckpointSaver, config: dict[str, Any], node: str) -> bool:
    """Return whether the thread's latest checkpoint holds a pending trigger of `node`."""
    saved = saver.get_tuple(cast(RunnableConfig, config))
    return saved is not None and f"branch:to:{node}" in (saved.checkpoint.get("channel_values") or {})


def follow_renamed_node(graph: Any, saver: BaseCheckpointSaver, config: dict[str, Any]) -> str | None:
    """Move a thread that stopped before a since-renamed node onto its new name; return the old name, or None.

    The checkpoint's pending trigger names the old node, which the graph no longer has: re-running the router of
    the node before it (with no new values) triggers the node under its new name, so `resume` continues there.
    The renames are `schemas/migrations.py`'s `RENAMED_NODES`.
    """
    for old, before in RENAMED_NODES.items():
        if _waits_for(saver, config, old):
            graph.update_state(config, None, as_node=before)
            return old
    return None


def migrate_checkpoint(graph: Any, saver: BaseCheckpointSaver, config: dict[str, Any]) -> list[str]:
    """Apply the migrations a resumed thread's state format needs; return what each one changed, in words.

    The shapes of records (renamed history keys) are upgraded when the state is read; what needs the graph (a
    pending trigger naming a renamed node) is upgraded here. A thread keeps its format (stamping it would need a
    state update that moves the graph), so an older thread is checked again on each resume: every step is a no-op
    once done.

    Raises:
        CheckpointFormatError: The checkpoint was written by a newer version (a format this one does not know).
    """
    try:
        steps = pending_migrations(saved_format(saver, config))
    except ValueError as exc:
        raise CheckpointFormatError(str(exc)) from None
    done = []
    for step in steps:
        for old, before in step.renamed_nodes.items():
            if _waits_for(saver, config, old):
                graph.update_state(config, None, as_node=before)
                done.append(f"the pending node {old} continues under its new name")
    return done
