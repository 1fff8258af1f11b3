"""PostgreSQL checkpoints: LangGraph's PostgresSaver opened from a URL, its threads, and URLs safe to print."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from profiling_agent.graph.serde import state_serializer


class CheckpointStoreError(Exception):
    """The checkpoint database cannot be opened or is not a valid URL (one line, for the user)."""


SCHEMES = ("postgresql", "postgres")
CONNECT_TIMEOUT = 10  # seconds; used unless the URL sets connect_timeout
SETUP_LOCK = 0x5052_4F46_494C_4500  # advisory lock key serializing setup() of concurrent first runs ("PROFIL")
EXTRA_HINT = "PostgreSQL checkpoints need the postgres extra: pip install 'profiling-agent[postgres]'"


def redact(url: str) -> str:
    """Return `url` with its password (in the user part or a password= parameter) replaced by ***."""
    try:
        parts = urlsplit(url)
        netloc = parts.netloc
        if parts.password is not None:
            user, _, host = netloc.rpartition("@")
            netloc = f"{user.split(':', 1)[0]}:***@{host}"
        query = urlencode(
            [(k, "***" if k == "password" else v) for k, v in parse_qsl(parts.query, keep_blank_values=True)],
            safe="/:*",
        )
        return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))
    except ValueError:  # e.g. a bad port or bracket: say only what kind of URL it was
        return f"{url.split(':', 1)[0]}://..."


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0].strip() if text else type(exc).__name__


def check_url(url: str) -> None:
    """Refuse anything but a postgresql:// (or postgres://) URL.

    Raises:
        CheckpointStoreError: One line saying what a valid URL looks like.
    """
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if scheme not in SCHEMES:  # the rest is not echoed: it may hold a password
        what = f"scheme {scheme!r}" if scheme else "not a URL"
        raise CheckpointStoreError(
            f"invalid checkpoint URL ({what}): expected postgresql://USER[:PASSWORD]@HOST[:PORT]/DBNAME"
        )


def open_postgres(url: str) -> Any:
    """Connect to PostgreSQL and return a PostgresSaver whose tables exist (setup() run under a lock).

    The saver owns one autocommit connection (what PostgresSaver expects: `prepare_threshold=0`, dict rows);
    close it with `saver.conn.close()`.

    Raises:
        CheckpointStoreError: Malformed URL, unreachable server, failed setup, or the postgres extra missing.
    """
    check_url(url)
    try:
        import psycopg  # lazy: the optional postgres extra; a missing one is reported
        from langgraph.checkpoint.postgres import (
            PostgresSaver,
        )  # lazy: the optional postgres extra; a missing one is reported
        from psycopg.rows import dict_row  # lazy: the optional postgres extra; a missing one is reported
    except ImportError:
        raise CheckpointStoreError(EXTRA_HINT) from None
    try:
        params = psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.Error as exc:
        raise CheckpointStoreError(f"invalid checkpoint URL {redact(url)}: {_first_line(exc)}") from None
    extra: dict[str, Any] = {} if "connect_timeout" in params else {"connect_timeout": CONNECT_TIMEOUT}
    try:
        conn = psycopg.Connection.connect(url, autocommit=True, prepare_threshold=0, row_factory=dict_row, **extra)
    except psycopg.Error as exc:
        why = _first_line(exc)
        raise CheckpointStoreError(f"cannot connect to the checkpoint database {redact(url)}: {why}") from None

    saver = PostgresSaver(conn, serde=state_serializer())
    try:
        conn.execute("SELECT pg_advisory_lock(%s)", (SETUP_LOCK,))  # two first runs must not both create tables
        try:
            saver.setup()
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (SETUP_LOCK,))
    except psycopg.Error as exc:
        conn.close()
        raise CheckpointStoreError(f"cannot set up checkpoint tables in {redact(url)}: {_first_line(exc)}") from None
    return saver


def is_pool(conn: Any) -> bool:
    """Return True when a PostgresSaver's `conn` is a connection pool rather than one psycopg Connection."""
    import psycopg  # lazy: psycopg; graph.cli.store loads this module without it

    return not isinstance(conn, psycopg.Connection)


@contextmanager
def saver_connection(saver: Any) -> Iterator[Any]:
    """Yield a connection of a PostgresSaver: its own (under its lock), or one borrowed from its pool."""
    conn = saver.conn
    if is_pool(conn):
        with conn.connection() as borrowed:
            yield borrowed
    else:
        with saver.lock if hasattr(saver, "lock") else nullcontext():
            yield conn


def postgres_thread_ids(saver: Any) -> list[str]:
    """Return the thread ids a PostgresSaver holds, oldest first (checkpoint ids are time-ordered UUIDs)."""
    from psycopg.rows import tuple_row  # lazy: psycopg; graph.cli.store loads this module without it

    sql = "SELECT thread_id FROM checkpoints WHERE checkpoint_ns = '' GROUP BY thread_id ORDER BY MIN(checkpoint_id)"
    with saver_connection(saver) as conn, conn.cursor(row_factory=tuple_row) as cur:
        return [row[0] for row in cur.execute(sql).fetchall()]
