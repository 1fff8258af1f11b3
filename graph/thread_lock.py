"""One runner per thread: a lock held while a process runs a thread, released when that process dies.

SQLite checkpoints: an exclusive `flock` on RUN_ROOT/.locks/THREAD.lock (the kernel drops it with the process).
PostgreSQL checkpoints: a session-level advisory lock on the checkpointer's connection (the server drops it with
the connection, so with the process). A second runner gets `ThreadBusy` naming the holder and has written nothing.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any
from urllib.parse import quote

from profiling_agent.graph.checkpoint import is_postgres
from profiling_agent.graph.checkpoint_pg import is_pool

LOCKS_DIR = ".locks"
HOLDER_WAIT = 2.0  # seconds to wait for a just-started holder to write its name into the lock file
# seconds to retry an advisory lock: the server frees a killed holder's lock once it notices the closed connection
DEAD_HOLDER_WAIT = 2.0
APP_PREFIX = "profiling-agent"
PEEK_WAIT = 0.3  # seconds a runner retries the lock, so `runs` peeking at it (a shared lock) never refuses it


class ThreadBusy(Exception):
    """Another process is running this thread (one line naming the holder)."""

    def __init__(self, thread_id: str, holder: str) -> None:
        super().__init__(f"thread {thread_id} is already being run by {holder}: wait for it to finish, or stop it")
        self.thread_id, self.holder = thread_id, holder


def _me() -> dict[str, Any]:
    return {"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%d %H:%M:%S")}


def _describe(holder: dict[str, Any]) -> str:
    if not holder.get("pid"):
        return "another process"
    where = f" on {holder['host']}" if holder.get("host") else ""
    since = f" since {holder['since']}" if holder.get("since") else ""
    return f"pid {holder['pid']}{where}{since}"


def lock_path(run_root: str | Path, thread_id: str) -> Path:
    """Return the lock file of a thread whose checkpoints are in RUN_ROOT/checkpoints.sqlite."""
    return Path(run_root) / LOCKS_DIR / f"{quote(thread_id, safe='')}.lock"


def _read_holder(fd: int) -> dict[str, Any]:
    """Read the holder's JSON from the lock file, waiting briefly if it has locked but not yet written it."""
    deadline = time.monotonic() + HOLDER_WAIT
    while True:
        raw = os.pread(fd, 4096, 0)
        try:
            return json.loads(raw)
        except ValueError:
            if time.monotonic() > deadline:
                return {}
            time.sleep(0.02)


@contextmanager
def file_lock(path: Path, thread_id: str) -> Iterator[None]:
    """Hold an exclusive flock on `path` (created if missing) for the block; write who holds it into the file.

    Raises:
        ThreadBusy: Another open file description (another process) holds the lock.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + PEEK_WAIT
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:  # not a `runs` peeking for a moment: a runner holds it
                    raise ThreadBusy(thread_id, _describe(_read_holder(fd))) from None
                time.sleep(0.02)
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(_me()).encode(), 0)
        yield
    finally:
        os.close(fd)  # closing the only descriptor releases the flock


def advisory_key(thread_id: str) -> int:
    """Return the signed 64-bit advisory lock key of a thread (a hash of its id)."""
    digest = hashlib.blake2b(f"{APP_PREFIX}:{thread_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def _pg_holder(conn: Any, key: int) -> dict[str, Any]:
    """Name the session holding advisory lock `key`: the pid and host in its application_name, else its backend."""
    from psycopg.rows import tuple_row  # lazy: psycopg; the CLI's flag check runs without it

    sql = (
        "SELECT a.application_name, a.pid, a.client_addr::text, a.backend_start FROM pg_locks l"
        " JOIN pg_stat_activity a ON a.pid = l.pid WHERE l.locktype = 'advisory' AND l.granted"
        " AND l.classid = %s AND l.objid = %s AND l.objsubid = 1"
    )
    unsigned = key & 0xFFFF_FFFF_FFFF_FFFF  # pg_locks splits a bigint key into two unsigned 32-bit halves
    with conn.cursor(row_factory=tuple_row) as cur:
        row = cur.execute(sql, (unsigned >> 32, unsigned & 0xFFFF_FFFF)).fetchone()
    if row is None:  # released between our attempt and this query
        return {}
    app, backend, client, started = row
    holder = {"pid": f"{backend} (database backend)", "host": client}
    try:
        holder = json.loads(app[len(APP_PREFIX) + 1 :]) if (app or "").startswith(APP_PREFIX + " ") else holder
    except ValueError:
        pass
    holder["since"] = started.astimezone().strftime("%Y-%m-%d %H:%M:%S") if started else None  # local time
    return holder


@contextmanager
def _advisory(conn: Any, guard: Any, thread_id: str) -> Iterator[None]:
    """Hold the thread's session advisory lock on `conn`; `guard` serializes each statement with other users."""
    key = advisory_key(thread_id)
    me = {"pid": os.getpid(), "host": socket.gethostname()[:24]}
    name = f"{APP_PREFIX} {json.dumps(me, separators=(',', ':'))}"[:63]  # application_name: at most 63 bytes
    with guard:
        conn.execute("SELECT set_config('application_name', %s, false)", (name,))
    deadline = time.monotonic() + DEAD_HOLDER_WAIT
    while True:
        with guard:
            row = conn.execute("SELECT pg_try_advisory_lock(%s) AS got", (key,)).fetchone()
            if row["got"] if isinstance(row, dict) else row[0]:
                break
            if time.monotonic() > deadline:
                raise ThreadBusy(thread_id, _describe(_pg_holder(conn, key)))
        time.sleep(0.1)
    try:
        yield
    finally:
        _unlock(conn, guard, key)


def _unlock(conn: Any, guard: Any, key: int) -> None:
    """Release the advisory lock; a broken connection has released it already (and must not hide an error)."""
    import psycopg  # lazy: psycopg; the CLI's flag check runs without it

    try:
        with guard:
            conn.execute("SELECT pg_advisory_unlock(%s)", (key,))
    except psycopg.Error:
        pass


@contextmanager
def advisory_lock(saver: Any, thread_id: str) -> Iterator[None]:
    """Hold a session advisory lock for the thread on a PostgresSaver's connection for the block.

    The lock lives on the connection the checkpoints are written through (or, for a pool, on a connection kept
    for the block), so it lasts exactly as long as this runner can write. The connection's application_name
    carries this process's pid and host, so a refused runner can name it.

    Raises:
        ThreadBusy: Another session holds the thread's lock.
    """
    conn = saver.conn
    if is_pool(conn):  # keep one of the pool's connections for the block
        with conn.connection() as held, _advisory(held, nullcontext(), thread_id):
            yield
    else:
        with _advisory(conn, saver.lock, thread_id):
            yield


@contextmanager
def thread_lock(saver: Any, run_root: str | Path, thread_id: str) -> Iterator[None]:
    """Make this process the only runner of `thread_id` for the block: the lock that fits the checkpointer.

    Args:
        saver: The checkpointer the thread lives in (SqliteSaver or PostgresSaver).
        run_root: The run root (where the SQLite lock files live).
        thread_id: The thread to run.

    Raises:
        ThreadBusy: Another process runs the thread; nothing has been written.
    """
    if is_postgres(saver):
        with advisory_lock(saver, thread_id):
            yield
    else:
        with file_lock(lock_path(run_root, thread_id), thread_id):
            yield


def _file_holder(path: Path) -> str | None:
    """Describe the process holding the lock file `path`, or None when no process does (or there is no file)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # a runner's exclusive lock refuses this at once
        except BlockingIOError:
            return _describe(_read_holder(fd))
        return None
    finally:
        os.close(fd)  # releases the shared lock, if taken


def thread_holder(saver: Any, run_root: str | Path, thread_id: str) -> str | None:
    """Describe the process running `thread_id` now ("pid 4242 on HOST since ..."), or None when none is.

    Reads the lock without taking it from a runner: `runs` uses it to tell a running thread from an interrupted one.
    """
    if not is_postgres(saver):
        return _file_holder(lock_path(run_root, thread_id))

    key = advisory_key(thread_id)
    if is_pool(saver.conn):
        with saver.conn.connection() as conn:
            holder = _pg_holder(conn, key)
    else:
        with saver.lock:
            holder = _pg_holder(saver.conn, key)
    return _describe(holder) if holder else None
