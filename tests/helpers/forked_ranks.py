"""A launcher for test jobs that forks every rank from one interpreter with the libraries already imported.

torchrun starts each rank as a fresh interpreter, and each spends seconds of CPU importing torch and transformers
before its first step: a 2-process job over the tests' tiny models costs ~19 CPU-s, nearly all of it imports
(measured 2026-11-29: torchrun ~3 CPU-s, each rank ~7). This launcher imports them once, then forks the ranks.
Each rank is still a process of its own (its own pid and rank<R>.pid, its own gloo connection) that runs
`python -m MODULE ARGS` as torchrun's would, with torchrun's RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
MASTER_ADDR and MASTER_PORT. Like torchrun it stays in the job's process group, ends the other ranks when one
fails, exits non-zero then, and passes SIGTERM and SIGINT on to the ranks. It does not print torchrun's failure
report: the tests of how a killed job is explained run torchrun itself.

Used as a launcher template (`launcher()`), like `srun -n {procs} python`: the package appends `-m MODULE SPEC`.
"""

from __future__ import annotations

import os
import runpy
import shlex
import signal
import socket
import sys
from pathlib import Path

# what a rank imports before its first step (the job modules, the model classes the tests' artifacts rebuild,
# the datasets library and ONNX Runtime for the run forms), imported once here and shared by every fork
PRELOAD = [
    "torch",
    "torch.distributed",
    "datasets",
    "onnxruntime",
    "transformers.models.resnet.modeling_resnet",
    "profiling_agent.tools.models.artifact_load",
    "profiling_agent.tools.recovery.distributed",
    "profiling_agent.tools.evaluation.sharded",
]
TERMINATE_GRACE_S = 20.0  # seconds the other ranks get between SIGTERM and SIGKILL when one failed


def launcher() -> str:
    """Return the launcher template (`{procs}` is the process count) that starts a job's ranks by forking."""
    return f"{shlex.quote(sys.executable)} {shlex.quote(str(Path(__file__).resolve()))} --nproc {{procs}}"


def _preload() -> None:
    """Import PRELOAD, and resolve the transformers names a rank looks up (their lazy lookup costs seconds)."""
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    import transformers

    for name in ("AutoConfig", "AutoModelForImageClassification", "PreTrainedModel", "ResNetForImageClassification"):
        getattr(transformers, name)


def _free_port() -> int:
    """Return a TCP port on 127.0.0.1 that nothing listens on now (torchrun --standalone picks one the same way)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _run_rank(rank: int, world: int, port: int, module: str, args: list[str]) -> None:
    """The forked child: run `python -m module args` as rank `rank` of `world`, then leave with its exit code."""
    code = 1
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        env = {"RANK": rank, "LOCAL_RANK": rank, "WORLD_SIZE": world, "LOCAL_WORLD_SIZE": world}
        os.environ.update({k: str(v) for k, v in env.items()})
        os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
        sys.argv = [module, *args]
        sys.modules.pop(module, None)  # run as `python -m` runs it: a fresh __main__, not the preloaded module
        try:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _signal_all(children: dict[int, int], sig: int) -> None:
    for pid in children:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def _wait_all(children: dict[int, int]) -> int:
    """Wait for every rank; when one fails, end the others (SIGTERM, then SIGKILL). Return the job's exit code."""
    failed = 0
    while children:
        pid, status = os.wait()
        rank = children.pop(pid, None)
        code = os.waitstatus_to_exitcode(status)
        if rank is None or code == 0 or failed:
            continue
        failed = 1
        how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with {code}"
        print(f"forked_ranks: rank {rank} (pid {pid}) {how}; ending the other ranks", file=sys.stderr, flush=True)
        _signal_all(children, signal.SIGTERM)
        signal.signal(signal.SIGALRM, lambda *_: _signal_all(children, signal.SIGKILL))
        signal.alarm(int(TERMINATE_GRACE_S))
    return failed


def main(argv: list[str]) -> int:
    """`--nproc N -m MODULE ARGS...`: fork N ranks of `python -m MODULE ARGS`; exit 0 when every rank did."""
    if len(argv) < 4 or argv[0] != "--nproc" or argv[2] != "-m":
        print("usage: forked_ranks.py --nproc N -m MODULE [ARGS...]", file=sys.stderr)
        return 2
    world, module, args = int(argv[1]), argv[3], argv[4:]
    _preload()
    port, children = _free_port(), {}
    for rank in range(world):
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _run_rank(rank, world, port, module, args)
        children[pid] = rank
    for sig in (signal.SIGTERM, signal.SIGINT):  # as torchrun: a stop of the launcher reaches every rank
        signal.signal(sig, lambda signum, _frame: _signal_all(children, signum))
    return _wait_all(children)


if __name__ == "__main__":
    sys.path[0] = os.getcwd()  # as `python -m` has it: not this folder, whose test helpers could shadow a library
    sys.exit(main(sys.argv[1:]))
