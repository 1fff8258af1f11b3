"""How a run's process and its children end: a cooperative stop on Ctrl-C or SIGTERM, a record of a native crash.

Nodes run in LangGraph's worker thread, where a signal's KeyboardInterrupt never arrives; the main thread would
wait for the whole step. `request_stop` sets a process-wide flag and makes every later torch module forward
raise `Interrupted`, so training, probing, distillation, evaluation and export stop at their next forward pass
(or at an explicit `check()` between steps) with nothing half-written: the step is re-run by a resume.

A child process never takes part: a forked one gets the default SIGINT/SIGTERM actions back at once
(`os.register_at_fork`; the stop signals are held back across the fork, so one that arrives before that still
ends it), and a spawned one is started by `run_in_child`, so a Ctrl-C, which
reaches the whole process group, ends a child quietly and only the run prints its one line.

Native crashes: a run's process (the CLI's `run` or `resume`, `fault_log`) keeps RUN/crash/faulthandler-run-<pid>.log
open for the whole run and points `$PROFILING_AGENT_FAULT_DIR` at that folder, so the child processes it starts
(`run_in_child`, the ranks of a distributed job) keep faulthandler-child-<pid>.log there; forked workers inherit
their parent's. faulthandler writes into the file only when the process dies by SIGSEGV, SIGBUS, SIGABRT, SIGILL or
SIGFPE (the fatal error, then at most 100 frames of each of at most 100 threads: a few kilobytes). A process that
ends any other way removes its empty file, so a file left behind is a record: with text, a native fault; empty, the
process was killed (SIGKILL, the out-of-memory killer) before it could tidy up.
"""

from __future__ import annotations

import faulthandler
import multiprocessing
import os
import re
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

_stop = threading.Event()
_reason: list[str] = []
_hook: list[Any] = []  # the torch forward pre-hook handle while a stop is requested
_handling: list[bool] = []  # non-empty while `stop_on_signals` has its handler installed


class Interrupted(KeyboardInterrupt):
    """A stop was requested (Ctrl-C or SIGTERM); raised inside the running step at its next check.

    A KeyboardInterrupt, so `except Exception` in a step (which records a failure and goes on) never swallows it.
    """


def _raise_on_forward(module: Any, args: Any) -> None:
    raise Interrupted(stop_reason() or "stop requested")


def request_stop(reason: str = "interrupted") -> None:
    """Ask every running step to stop: `check()` and every torch module forward raise `Interrupted` from now on."""
    if not _stop.is_set():
        _reason[:] = [reason]
        _stop.set()
    torch = sys.modules.get("torch")  # no torch loaded yet: nothing can be running a forward pass
    if torch is not None and not _hook:
        _hook.append(torch.nn.modules.module.register_module_forward_pre_hook(_raise_on_forward))


def stop_requested() -> bool:
    """Return whether a stop has been requested."""
    return _stop.is_set()


def stop_reason() -> str:
    """Return why a stop was requested ("" when none was)."""
    return _reason[0] if _reason and _stop.is_set() else ""


def check() -> None:
    """Raise `Interrupted` when a stop has been requested (call it between the steps of a long loop)."""
    if _stop.is_set():
        raise Interrupted(stop_reason())


def clear() -> None:
    """Forget a stop request (for a process that goes on after handling one, e.g. tests)."""
    _stop.clear()
    _reason.clear()
    while _hook:
        _hook.pop().remove()


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def child_signals() -> None:
    """Give SIGINT and SIGTERM their default actions (a child process of a run: end quietly, never raise).

    The initializer of every spawned worker pool (`run_in_child`); forked children get it through
    `os.register_at_fork`. A signal held back while the child started (`run_in_child`) ends it now.
    """
    for sig in STOP_SIGNALS:
        try:
            signal.signal(sig, signal.SIG_DFL)
        except (ValueError, OSError):  # not the main thread of the child: nothing of ours is installed there
            pass
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


def _child_main(conn: Any, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
    child_signals()
    fault_file_from_env()  # a native fault leaves every thread's stack in the run's crash folder
    try:
        reply: tuple[bool, Any] = (True, fn(*args))
    except BaseException as exc:  # noqa: BLE001 - raised again in the parent
        reply = (False, exc)
    try:
        conn.send(reply)
    except Exception:  # noqa: BLE001 - an error that cannot be pickled goes back as its text
        conn.send((False, RuntimeError(f"{type(reply[1]).__name__}: {reply[1]}")))
    conn.close()
    disable_fault_file(CHILD_ROLE)


def run_in_child(fn: Callable[..., Any], *args: Any) -> Any:
    """Return `fn(*args)` run in a fresh spawned process that takes no part in the run's stop (its error raised here).

    The calling thread holds SIGINT and SIGTERM back while the child starts (a spawned child inherits the mask), so
    a Ctrl-C while its interpreter starts cannot print a traceback; `child_signals` then gives them their default
    actions, so a Ctrl-C ends the child quietly. A stop request (`request_stop`) ends the child and raises
    `Interrupted` here within moments.

    The child writes its fault file into `$PROFILING_AGENT_FAULT_DIR` when the run set one (`fault_log`).

    Raises:
        Interrupted: A stop was requested before or while the child ran, or a stop signal ended the child.
        ChildCrashed: Another signal ended the child before it answered (a native fault, or SIGKILL); it names
            the child's fault file.
        ChildProcessError: The child ended without an answer and without a signal.
    """
    check()
    context = multiprocessing.get_context("spawn")
    answer, sender = context.Pipe(duplex=False)
    child = context.Process(target=_child_main, args=(sender, fn, args))  # not daemonic: it may start its own
    held = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        child.start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
    sender.close()
    try:
        while not answer.poll(0.2):
            check()
        try:
            ok, value = answer.recv()
        except EOFError:  # the child ended without answering: stopped by a signal, or crashed
            child.join(5)
            check()
            if child.exitcode is not None and -child.exitcode in STOP_SIGNALS:
                # Ctrl-C or SIGTERM reached the child before the main thread's handler recorded the stop: the
                # same stop, seen here first (the handler still raises it in the main thread)
                raise Interrupted(f"the child process was stopped by {signal.Signals(-child.exitcode).name}") from None
            if child.exitcode is not None and child.exitcode < 0:
                raise ChildCrashed(signal_name(child.exitcode), child_fault_file(child.pid)) from None
            raise ChildProcessError(f"the child process ended without an answer (exit code {child.exitcode})") from None
    finally:
        if child.is_alive():
            child.terminate()
        child.join(5)
        answer.close()
        child_fault_file(child.pid)  # an empty one (no fault) is removed; one with a fault stays
    if not ok:
        raise value
    return value


_fork_mask: list[set[int | signal.Signals]] = []  # the forking thread's signal mask while a fork is under way


def _before_fork() -> None:
    # held back across the fork: a Ctrl-C that reaches the new child before its handlers are reset stays pending
    # there (with our handler still installed it would only set Python's flag, and SIG_DFL would then drop it)
    if _handling:
        _fork_mask.append(signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS))


def _after_fork_in_parent() -> None:
    if _fork_mask:
        signal.pthread_sigmask(signal.SIG_SETMASK, _fork_mask.pop())


def _after_fork_in_child() -> None:
    _fork_mask.clear()
    if _handling:
        _handling.clear()
        child_signals()  # default actions, then unblocked: a signal held back during the fork ends the child now


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent, after_in_child=_after_fork_in_child)


@contextmanager
def stop_on_signals(on_second: Callable[[str], None] | None = None, grace_s: float = 0.0) -> Iterator[None]:
    """Turn SIGINT and SIGTERM into a cooperative stop for the block (main thread only; elsewhere a no-op).

    The first signal requests a stop and raises `Interrupted` in the main thread (so SIGTERM ends a run like
    Ctrl-C); a second one, or `grace_s` seconds without the block having ended, calls `on_second(signal name)`,
    which may end the process at once (a step stuck in library code that never reaches a check). Previous
    handlers and the flag are restored after the block.

    Args:
        on_second: Called on a repeated signal while the running step winds down (None: ignore repeats).
        grace_s: Seconds after the first signal before `on_second` is called anyway (0: never).
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    timers: list[threading.Timer] = []

    def handle(signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        if _stop.is_set():
            if on_second is not None:
                on_second(name)
            return
        request_stop(name)
        if on_second is not None and grace_s > 0:
            timer = threading.Timer(grace_s, on_second, args=(name,))
            timer.daemon = True
            timers.append(timer)
            timer.start()
        raise Interrupted(name)

    previous = {sig: signal.signal(sig, handle) for sig in STOP_SIGNALS}
    _handling.append(True)
    try:
        yield
    finally:
        _handling.clear()
        for timer in timers:
            timer.cancel()
        for sig, old in previous.items():
            signal.signal(sig, old)
        clear()


# ----------------------------------------------------------------------------- native crash records

FAULT_DIR_ENV = "PROFILING_AGENT_FAULT_DIR"  # the folder child processes write their fault files into
CRASH_DIR = "crash"  # the run folder's entry holding the fault files
RUN_ROLE, CHILD_ROLE = "run", "child"
FAULT_FILE_NAME = re.compile(r"^faulthandler-(run|child)-(\d+)\.log$")
_fault_files: list[tuple[Path, IO[str], bool, str]] = []  # (file, handle, faulthandler was on before, role) while on


class ChildCrashed(BaseException):
    """A child process died by a signal before it answered (a native fault, or killed).

    A BaseException like `Interrupted`: a step's `except Exception` (which records one candidate's
    failure and goes on) must not swallow a native crash; the CLI reports it in one line.
    """

    def __init__(self, how: str, fault_file: str = "") -> None:
        where = f" (stack in {fault_file})" if fault_file else ""
        super().__init__(f"a child process died by {how}{where}", how, fault_file)
        self.how, self.fault_file = how, fault_file

    def __reduce__(self) -> tuple[type[ChildCrashed], tuple[str, str]]:
        return type(self), (self.how, self.fault_file)

    def __str__(self) -> str:
        return str(self.args[0])


def crash_dir(run_path: str | Path) -> Path:
    """Return the folder of a run's fault files."""
    return Path(run_path) / CRASH_DIR


def fault_path(folder: str | Path, role: str, pid: int | None = None) -> Path:
    """Return the fault file of process `pid` (default: this one) in `folder`."""
    return Path(folder) / f"faulthandler-{role}-{os.getpid() if pid is None else pid}.log"


def enable_fault_file(folder: str | Path, role: str = RUN_ROLE) -> Path:
    """Write every thread's stack to this process's fault file in `folder` on a fatal signal; return the file."""
    disable_fault_file()
    path = fault_path(folder, role)
    path.parent.mkdir(parents=True, exist_ok=True)
    before = faulthandler.is_enabled()
    handle = open(path, "w", encoding="utf-8")  # noqa: SIM115 - kept open: faulthandler writes to its descriptor
    faulthandler.enable(handle, all_threads=True)
    _fault_files.append((path, handle, before, role))
    return path


def fault_file_from_env() -> Path | None:
    """Enable a child process's fault file in `$PROFILING_AGENT_FAULT_DIR` (set by the run); None when unset.

    A no-op in a process that keeps a fault file already (the run's own, when a job's entry runs in-process).
    """
    folder = os.environ.get(FAULT_DIR_ENV)
    return enable_fault_file(folder, CHILD_ROLE) if folder and not _fault_files else None


@contextmanager
def fault_log(run_path: str | Path) -> Iterator[Path]:
    """Keep this process's fault file in RUN/crash/ for the block, and point its children at that folder.

    Yields the file; it is removed after the block unless a forked worker wrote a fault into it.
    """
    folder = crash_dir(run_path)
    old = os.environ.get(FAULT_DIR_ENV)
    os.environ[FAULT_DIR_ENV] = str(folder)
    try:
        yield enable_fault_file(folder, RUN_ROLE)
    finally:
        disable_fault_file()
        if old is None:
            os.environ.pop(FAULT_DIR_ENV, None)
        else:
            os.environ[FAULT_DIR_ENV] = old


def child_fault_file(pid: int | None) -> str:
    """Return the fault file child `pid` wrote (a native fault), removing an empty one; "" when there is none."""
    folder = os.environ.get(FAULT_DIR_ENV)
    if not folder or pid is None:
        return ""
    path = fault_path(folder, CHILD_ROLE, pid)
    return "" if discard_if_empty(path) else str(path)


def sweep_child_fault_files() -> None:
    """Remove the empty fault files of child processes that have ended (e.g. the ranks of a finished job)."""
    folder = os.environ.get(FAULT_DIR_ENV)
    for path in Path(folder).glob(f"faulthandler-{CHILD_ROLE}-*.log") if folder else ():
        match = FAULT_FILE_NAME.match(path.name)
        if match is not None and not _alive(int(match.group(2))):
            discard_if_empty(path)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def disable_fault_file(role: str | None = None) -> Path | None:
    """Stop writing the fault file; remove it when empty (no fault). Return the file when kept, else None.

    A file with text was written by a forked worker that shares it, and is kept as that fault's record.

    Args:
        role: Only stop a file of this role (CHILD_ROLE: a job's end leaves the run's own file alone).
    """
    if not _fault_files or (role is not None and _fault_files[-1][3] != role):
        return None
    path, handle, before, _ = _fault_files.pop()
    faulthandler.disable()
    handle.close()
    if before and sys.__stderr__ is not None:  # e.g. pytest's or PYTHONFAULTHANDLER's: back to stderr
        faulthandler.enable(sys.__stderr__, all_threads=True)
    return None if discard_if_empty(path) else path


def discard_if_empty(path: Path) -> bool:
    """Remove a fault file that holds nothing (and its folder, when that is left empty); return True if gone."""
    try:
        if path.stat().st_size > 0:
            return False
        path.unlink()
    except FileNotFoundError:
        pass
    try:
        path.parent.rmdir()  # only succeeds when nothing else is left there
    except OSError:
        pass
    return True


def signal_name(exit_code: int) -> str:
    """Name the signal a negative exit code (multiprocessing's) stands for."""
    try:
        return signal.Signals(-exit_code).name
    except ValueError:
        return f"signal {-exit_code}"
