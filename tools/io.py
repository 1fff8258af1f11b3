"""Atomic file writes, JSON helpers and content hashes for run artifacts."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO

FAULT_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO})  # a full disk, a full quota, a failing disk


class MachineFault(BaseException):
    """A fault of the machine (a full disk or quota, an I/O error) while writing a named file: the run stops.

    Not an `Exception` (like `interrupt.Interrupted`): a step that records a failure and goes on (`except
    Exception`: a form that failed, a report chart) never swallows it, so a full disk never becomes a "failed
    form" that a run delivers around. The CLI prints it in one line with the file and the resume command (exit 1).

    Attributes:
        errno: The OSError's errno (ENOSPC, EDQUOT, EIO; another errno where a caller names its own fault).
        strerror: Its text ("No space left on device").
        filename: The file or folder that could not be written.
        what: What could not be done ("could not write a run file").
    """

    def __init__(self, code: int, strerror: str, filename: str | os.PathLike, what: str = "could not write a file"):
        super().__init__(code, strerror, str(filename), what)
        self.errno, self.strerror, self.filename, self.what = code, strerror, str(filename), what

    def __str__(self) -> str:
        return f"{self.what} ({self.strerror}): {self.filename}"


def fault_errno(exc: BaseException) -> int | None:
    """Return the machine-fault errno behind `exc` (itself, its cause or context), else None.

    An OSError carries it; libraries that wrap a failed write in their own error (OpenVINO, torch's C++ writers)
    keep only its text, so the message is matched against the errno's text too.
    """
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, MachineFault):
            return current.errno
        if isinstance(current, OSError) and current.errno in FAULT_ERRNOS:
            return current.errno
        text = str(current)
        for code in FAULT_ERRNOS:
            if os.strerror(code) in text:
                return code
        current = current.__cause__ or current.__context__
    return None


def failed_file(exc: BaseException, default: str | os.PathLike) -> str:
    """Return the file the OSError behind `exc` names (itself, its cause or context), else `default`."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, (OSError, MachineFault)) and current.filename:
            return str(current.filename)
        current = current.__cause__ or current.__context__
    return str(default)


def machine_fault(exc: BaseException, filename: str | os.PathLike, what: str = "could not write a file") -> None:
    """Raise `MachineFault` naming `filename` when `exc` is a fault of the machine; return for any other error.

    Call it in an `except` block that would otherwise record a failure and go on (`failed_file` finds the file
    the error itself names). A `MachineFault` is raised again as it is.
    """
    if isinstance(exc, MachineFault):
        raise exc
    code = fault_errno(exc)
    if code is not None:
        raise MachineFault(code, os.strerror(code), filename, what) from exc


THREAD_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")  # a run's folder name under the run root


def check_thread_id(thread_id: str) -> str:
    """Return `thread_id` when it is safe as a folder name under the run root, else raise ValueError.

    Letters, digits, `.`, `_` and `-`, starting with a letter or digit, at most 128 characters: no path
    separator, no `..`, nothing hidden, so a run can never write outside its run root.
    """
    if not THREAD_ID.fullmatch(thread_id) or ".." in thread_id:
        raise ValueError(
            f"invalid thread id {thread_id!r}: use letters, digits, '.', '_' and '-' (at most 128, starting with a "
            "letter or digit; no '/' or '..')"
        )
    return thread_id


def _umask() -> int:
    """Return the process umask without changing it (Linux: /proc; elsewhere set and restore it)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def shared_mode(path: str | os.PathLike) -> None:
    """Add the permissions the umask allows (0666 for a file, 0777 for a folder) to `path` and what it holds.

    mkstemp/mkdtemp create 0600/0700 and some writers (safetensors 0.8) write 0600: a colleague could not read the
    run. Plain open/mkdir honour the umask; this makes every run file do so.
    """
    mask = _umask()
    for item in [Path(path), *(Path(path).rglob("*") if Path(path).is_dir() else [])]:
        mode = item.lstat().st_mode
        if not item.is_symlink():
            os.chmod(item, (mode & 0o7777) | ((0o777 if item.is_dir() else 0o666) & ~mask))


def write_atomic(path: str | os.PathLike, write: Callable[[BinaryIO], Any], *, durable: bool = True) -> None:
    """Call `write(handle)` on a temp file beside `path`, then os.replace it: readers never see half a file.

    `durable` fsyncs before the rename (artifacts); a cache that can be rebuilt may skip it.

    Raises:
        MachineFault: A durable write hit a full disk, a full quota or an I/O error (`path` named).
        OSError: Any other failed write, and a cache's (`durable=False`) full disk, with `path` as its filename
            (a write through the handle names no file).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # colleagues may read run files as the umask allows
        with os.fdopen(fd, "wb") as handle:
            write(handle)
            if durable:
                handle.flush()
                os.fsync(handle.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        if durable:
            machine_fault(exc, path, "could not write a run file")
        if exc.filename is None or str(exc.filename) == tmp:
            raise OSError(exc.errno, exc.strerror or str(exc), str(path)) from exc
        raise
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_bytes_atomic(path: str | os.PathLike, data: bytes) -> None:
    """Write `data` to `path` through a temp file and os.replace (fsynced), so readers never see half a file."""
    write_atomic(path, lambda handle: handle.write(data))


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Write UTF-8 text atomically."""
    write_bytes_atomic(path, text.encode("utf-8"))


def write_json_atomic(path: str | os.PathLike, obj: Any) -> None:
    """Write `obj` as indented JSON atomically."""
    write_text_atomic(path, json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n")


def read_json(path: str | os.PathLike) -> Any:
    """Read a JSON file."""
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


@contextmanager
def atomic_dir(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temp folder beside `path`; on success it replaces `path` as a whole.

    A node that re-runs after a resume therefore overwrites the same folder, and a crash mid-write
    leaves the previous folder (or none) instead of a half-written one.

    Raises:
        MachineFault: The block or the move hit a full disk, a full quota or an I/O error (the failed file named,
            else `path`).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        yield tmp
        shared_mode(tmp)
        if path.exists():
            old = path.with_name(f".{path.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(path, old)
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        named = failed_file(exc, path)
        if named.startswith(str(tmp)):  # the staged copy is gone: name the file as it would have been
            named = str(path) + named[len(str(tmp)) :]
        machine_fault(exc, named, "could not write a run folder")
        raise


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    """Hex sha256 of one file."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def hash_tensor(digest: Any, tensor: Any) -> None:
    """Feed a tensor's shape, dtype and bytes (as held on the CPU) into a hashlib `digest`."""
    data = tensor.detach().cpu().contiguous()
    digest.update(str((tuple(data.shape), str(data.dtype))).encode())
    digest.update(data.numpy().tobytes())


def sha256_path(path: str | os.PathLike) -> str:
    """Hex sha256 of a file, or of a folder's files (relative names and contents, sorted)."""
    path = Path(path)
    if path.is_file():
        return sha256_file(path)
    digest = hashlib.sha256()
    for file in sorted(p for p in path.rglob("*") if p.is_file()):
        digest.update(file.relative_to(path).as_posix().encode())
        digest.update(b"\0")
        digest.update(sha256_file(file).encode())
    return digest.hexdigest()
