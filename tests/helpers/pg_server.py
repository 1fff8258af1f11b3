"""A throwaway PostgreSQL server for tests: initdb and pg_ctl in a temporary folder, listening on 127.0.0.1."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import uuid
from pathlib import Path

# initdb refuses to run as root: as root the server runs as one of these unprivileged users (first that exists)
SERVER_USERS = ("postgres", "nobody")


def find_bin_dir() -> Path | None:
    """Return the folder holding initdb, pg_ctl and postgres (PATH first, then Debian's layout), or None."""
    candidates = [Path(p).resolve().parent for p in filter(None, [shutil.which("initdb")])]
    candidates += [Path(p) for p in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)]
    for folder in candidates:
        if all((folder / name).exists() for name in ("initdb", "pg_ctl", "postgres")):
            return folder
    return None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class PgServer:
    """One PostgreSQL cluster in a temporary folder, trust authentication, fsync off; `url` is its admin URL."""

    def __init__(self, bin_dir: Path) -> None:
        self.bin_dir = bin_dir
        # as root the server user must reach the folder: /tmp, not a TMPDIR that may sit in a private directory
        self.dir = Path(tempfile.mkdtemp(prefix="profiling-agent-pg-", dir="/tmp" if os.geteuid() == 0 else None))
        self.data = self.dir / "data"
        self.url = ""
        self._as: dict = {}
        if os.geteuid() == 0:
            user = next((u for u in SERVER_USERS if _user_exists(u)), None)
            if user is None:
                raise RuntimeError(f"running as root and none of the users {SERVER_USERS} exists to run PostgreSQL")
            entry = pwd.getpwnam(user)
            os.chown(self.dir, entry.pw_uid, entry.pw_gid)
            self._as = {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}
        os.chmod(self.dir, 0o700)

    def _run(self, *args: str) -> subprocess.CompletedProcess:
        env = {**os.environ, "LC_ALL": "C", "PGTZ": "UTC"}
        return subprocess.run(
            [str(self.bin_dir / args[0]), *args[1:]],
            cwd=self.dir,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            **self._as,
        )

    def start(self) -> str:
        """Create the cluster and start it on a free port; return the admin URL."""
        initdb = ["initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-locale"]
        done = self._run(*initdb, "--no-sync")
        if done.returncode:
            raise RuntimeError(f"initdb failed: {done.stderr[-2000:]}")
        for _ in range(5):  # a free port can be taken between the probe and the server's bind: try another
            port = _free_port()
            opts = f"-c listen_addresses=127.0.0.1 -p {port} -k {self.dir} -c fsync=off -c full_page_writes=off"
            log = str(self.dir / "server.log")
            done = self._run("pg_ctl", "-D", str(self.data), "-l", log, "-w", "-t", "60", "-o", opts, "start")
            if done.returncode == 0:
                self.url = f"postgresql://postgres@127.0.0.1:{port}/postgres"
                return self.url
        log_file = self.dir / "server.log"
        log = log_file.read_text(errors="replace")[-2000:] if log_file.exists() else ""
        raise RuntimeError(f"pg_ctl start failed: {done.stderr[-1000:]} {log}")

    def new_database(self) -> str:
        """Create an empty database; return its URL."""
        import psycopg

        name = f"t_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url.rsplit("/", 1)[0] + f"/{name}"

    def stop(self) -> None:
        """Stop the server (immediate: nothing in it is kept) and remove its folder."""
        if self.data.exists():
            self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.dir, ignore_errors=True)


def _user_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True
