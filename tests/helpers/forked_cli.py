"""CLI processes forked from a server that has already imported the heavy libraries (a `Popen` stand-in).

A test that kills a CLI run, or starts two at once, needs each in a process of its own; a fresh interpreter spends
seconds of CPU importing torch, transformers and ONNX Runtime before the run begins (docs/facts.md). The forkserver
of `multiprocessing` imports them once (in a single-threaded process that runs nothing), then forks each child from
it: every child is still a process of its own, with its own pid, environment, working folder, stdout and stderr,
and it ends by a signal or with the CLI's exit code as `python -m profiling_agent.graph.cli` would. The server
lives as long as the test process; at its exit it is stopped and waited for.
"""

from __future__ import annotations

import atexit
import multiprocessing
import os
import pkgutil
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

# imported once by the server (by name: the server's sys.path is its environment's, without tests/): the libraries
# and the package's modules a run loads; openvino and nncf stay out (the CLI turns their telemetry off first)
LIBRARIES = [
    "torch",
    "onnx",
    "onnxruntime",
    "onnxruntime.quantization",
    "datasets",
    "matplotlib.figure",
    "matplotlib.backends.backend_agg",
    "transformers.models.resnet.modeling_resnet",
    "transformers.models.vit.modeling_vit",
    "profiling_agent.graph.builder",
    "profiling_agent.graph.cli.main",
]
_CONTEXT = None


def preload() -> list[str]:
    """The libraries, then every node module of the package (each imports the tools its step runs)."""
    import profiling_agent.nodes

    nodes = [f"profiling_agent.nodes.{m.name}" for m in pkgutil.iter_modules(profiling_agent.nodes.__path__)]
    return [*LIBRARIES, *nodes]


def _context():
    global _CONTEXT
    if _CONTEXT is None:
        _CONTEXT = multiprocessing.get_context("forkserver")
        _CONTEXT.set_forkserver_preload(preload())
        atexit.register(_stop_server)
    return _CONTEXT


def _stop_server() -> None:
    """End the server and wait for it, so that its CPU time and its children's count in this process's own."""
    from multiprocessing import forkserver

    stop = getattr(forkserver._forkserver, "_stop", None)  # the stdlib's own shutdown (Python 3.11), not public API
    if stop is not None:
        stop()


def _run(
    argv: list[str],
    env: dict[str, str],
    cwd: str,
    out: str,
    err: str,
    prepare: Callable[[], None] | None = None,
    session: bool = False,
) -> None:
    """The child: the CLI's `entry()` on `argv` with `env`, in `cwd`, its stdout and stderr in the files given.

    `prepare` (picklable) runs first, as a script would before calling `entry()`; `session` makes the child the
    leader of a new session and process group, as `Popen(start_new_session=True)` does.
    """
    missing = [name for name in preload() if name not in sys.modules]  # the server ignores a failed import
    assert not missing, f"the forkserver did not import {missing}"
    if session:
        os.setsid()
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    for path, fd in ((out, 1), (err, 2)):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(target, fd)
        os.close(target)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C reaches the CLI as in a fresh interpreter
    if prepare is not None:
        prepare()
    from profiling_agent.graph.cli.main import entry

    sys.argv = ["profiling-agent", *argv]
    try:
        entry()  # the script's own ending: an interrupted run leaves at once (os._exit), any other raises SystemExit
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    atexit._run_exitfuncs()  # a forked child skips the interpreter's exit handlers: run them as its exit would
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


class ForkedCli:
    """A CLI child with the parts of `subprocess.Popen` the crash tests use (pid, poll, signals, communicate).

    `prepare`, a picklable callable (a module-level function or a `functools.partial` of one), runs in the child
    before the CLI (a stand-in for a script that patches the package, then calls `entry()`); `start_new_session`
    as in `subprocess.Popen`: the child leads a process group of its own, which `os.killpg(pid, ...)` reaches.
    """

    def __init__(
        self,
        argv: list[str],
        env: dict[str, str],
        cwd: Path,
        prepare: Callable[[], None] | None = None,
        start_new_session: bool = False,
    ) -> None:
        self.args = argv
        self._files = Path(tempfile.mkdtemp(prefix="forked-cli-"))
        self._out, self._err = str(self._files / "stdout"), str(self._files / "stderr")
        args = (argv, dict(env), str(cwd), self._out, self._err, prepare, start_new_session)
        self._proc = _context().Process(target=_run, args=args)
        self._proc.start()
        self.pid = self._proc.pid

    @property
    def returncode(self) -> int | None:
        return self._proc.exitcode

    def poll(self) -> int | None:
        return self._proc.exitcode

    def send_signal(self, sig: int) -> None:
        if self._proc.exitcode is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        """Wait for the end (TimeoutExpired if it outlasts `timeout`); return (stdout, stderr)."""
        self._proc.join(timeout)
        if self._proc.exitcode is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        out, err = (Path(p).read_text() if Path(p).exists() else "" for p in (self._out, self._err))
        shutil.rmtree(self._files, ignore_errors=True)
        return out, err
