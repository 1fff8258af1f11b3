"""Launch a torch.distributed job (torchrun, srun, accelerate), wait for it, relay its progress, explain its failure.

The parent never schedules anything itself: it runs one launcher command (default `torchrun --standalone
--nproc-per-node N`) in its own process group and reads the job's output. Rank 0 prints progress lines marked
PROGRESS_MARK; every rank that fails writes a one-line reason to `error_rank<R>.txt` in the job folder and its
pid to `rank<R>.pid`. Inside the job, `init_group` joins the process group (gloo on CPU, NCCL on CUDA) from the
launcher's environment (torchrun's RANK/WORLD_SIZE/..., or Slurm's SLURM_PROCID/SLURM_NTASKS).
"""

from __future__ import annotations

import json
import os
import queue
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from profiling_agent.tools import interrupt
from profiling_agent.tools.text import one_line

DEFAULT_LAUNCHER = "torchrun --standalone --nproc-per-node {procs}"
PROGRESS_MARK = "@@profiling-agent-progress "
STOP_GRACE_S = 20.0  # seconds a stopped job gets between SIGTERM and SIGKILL
STOP_POLL_S = 0.2  # seconds between two looks at the stop flag while the job is silent


class DistributedJobError(RuntimeError):
    """A distributed job failed, was killed or could not start; the message is one line saying why."""


@dataclass
class Rank:
    """Where this process sits in the job."""

    rank: int
    world: int
    local_rank: int
    device: torch.device


def launcher_command(template: str, procs: int, module: str, args: Sequence[str]) -> list[str]:
    """Return the command that starts `python -m module args` on `procs` processes with the launcher `template`.

    `{procs}` in the template is replaced by the process count; `-m module args` is appended, so the template ends
    where the script would start (`torchrun ...`, `srun -n {procs} python`, `accelerate launch ...`). A leading
    `torchrun` that is not on PATH is taken from this interpreter's folder (a virtual environment's bin/).

    Raises:
        ValueError: An empty template or a process count below 1.
    """
    if procs < 1:
        raise ValueError(f"invalid process count {procs}: must be at least 1")
    words = shlex.split(template.replace("{procs}", str(procs)))
    if not words:
        raise ValueError("the launcher template is empty")
    if words[0] == "torchrun" and shutil.which("torchrun") is None:
        beside = Path(sys.executable).parent / "torchrun"
        words[0] = str(beside) if beside.exists() else words[0]
    return [*words, "-m", module, *args]


def run_job(
    command: Sequence[str],
    job_dir: Path,
    *,
    progress: Callable[[dict[str, Any]], None] | None = None,
    env: dict[str, str] | None = None,
    what: str = "distributed job",
    should_stop: Callable[[], bool] | None = None,
) -> list[str]:
    """Run a launcher command to its end, relaying rank 0's progress; return its output lines (progress excluded).

    The job runs in its own session, so a Ctrl-C of the parent does not reach it half-way: the parent stops it
    (SIGTERM to the whole group, then SIGKILL after STOP_GRACE_S) and re-raises. `should_stop` (default: the
    cooperative stop flag, `tools.interrupt.stop_requested`, which Ctrl-C and SIGTERM set) is checked every
    STOP_POLL_S seconds and on every output line; when it says so the job is stopped the same way and
    `interrupt.Interrupted` is raised: the ranks end within moments and the last step rank 0 saved stays for a
    resume. Any rank's `error_rank<R>.txt` gives the reason of a failure.

    Raises:
        DistributedJobError: The launcher could not start, or the job ended with a non-zero status.
        tools.interrupt.Interrupted: A stop was requested; the job has been stopped.
    """
    job_dir.mkdir(parents=True, exist_ok=True)
    for old in [*job_dir.glob("error_rank*.txt"), *job_dir.glob("rank*.pid")]:
        old.unlink(missing_ok=True)
    try:
        proc = subprocess.Popen(
            list(command),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )
    except OSError as exc:
        raise DistributedJobError(f"cannot start the {what} with `{shlex.join(command)}`: {exc}") from None
    tail: deque[str] = deque(maxlen=200)
    lines: queue.Queue[str | None] = queue.Queue()
    assert proc.stdout is not None
    threading.Thread(target=_pump, args=(proc.stdout, lines), daemon=True).start()
    stop = should_stop or interrupt.stop_requested
    try:
        while True:
            if stop():
                raise interrupt.Interrupted(f"the {what} was asked to stop")
            try:
                line = lines.get(timeout=STOP_POLL_S)
            except queue.Empty:
                continue
            if line is None:
                break
            if line.startswith(PROGRESS_MARK):
                if progress is not None:
                    progress(json.loads(line[len(PROGRESS_MARK) :]))
            elif line.strip():
                tail.append(line.rstrip())
        code = proc.wait()
    except BaseException:
        stop_job(proc)
        raise
    finally:
        interrupt.sweep_child_fault_files()  # the ranks' empty fault files; a rank's native fault stays on record
    if code != 0:
        raise DistributedJobError(f"the {what} failed: {failure_reason(job_dir, code, list(tail))}")
    return list(tail)


def _pump(stream: Any, lines: queue.Queue[str | None]) -> None:
    """Move a job's output lines to `lines` (None at the end), so the parent can poll its stop flag meanwhile."""
    for line in stream:
        lines.put(line)
    lines.put(None)


def stop_job(proc: subprocess.Popen[str]) -> None:
    """Stop a launched job and its ranks (its whole process group): SIGTERM, then SIGKILL."""
    for sig, wait in ((signal.SIGTERM, STOP_GRACE_S), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def failure_reason(job_dir: Path, code: int, tail: Sequence[str]) -> str:
    """Say in one line why a job ended with `code`: the first rank that failed and how, else the launcher's words.

    torchrun ends with a "Root Cause (first observed failure)" block naming the rank and its exit code (negative:
    the signal that killed it); the other ranks' own errors (a peer's closed connection) come after it.
    """
    errors = {
        p.stem.removeprefix("error_rank"): p.read_text(errors="replace").strip()
        for p in sorted(job_dir.glob("error_rank*.txt"))
    }
    root = max((i for i, line in enumerate(tail) if "Root Cause" in line), default=-1)
    fields: dict[str, str] = {}
    for line in tail[root + 1 :] if root >= 0 else []:
        name, _, value = line.strip().partition(":")
        if name.strip() in ("rank", "exitcode") and value.strip():
            fields.setdefault(name.strip(), value.strip().split()[0])
    rank, exit_code = fields.get("rank"), fields.get("exitcode", "")
    if exit_code.lstrip("-").isdigit() and int(exit_code) < 0:
        stack = _rank_fault_file(job_dir, rank)
        return f"rank {rank} was killed by {_signal_name(-int(exit_code))}" + (f" (stack in {stack})" if stack else "")
    if rank in errors and errors[rank]:
        return f"rank {rank}: {errors[rank].splitlines()[0][:300]}"
    for name, text in errors.items():
        if text:
            return f"rank {name}: {text.splitlines()[0][:300]}"
    if code < 0:
        return f"the launcher was killed by {_signal_name(-code)}"
    last = next((t for t in reversed(tail) if "error" in t.lower()), tail[-1] if tail else "")
    return f"exit status {code}" + (f": {last.strip()[:300]}" if last else "")


def _rank_fault_file(job_dir: Path, rank: str | None) -> str:
    """Return the fault file a rank left (its pid read from rank<R>.pid), or ""."""
    try:
        pid = int((job_dir / f"rank{rank}.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return ""
    return interrupt.child_fault_file(pid)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _env_from_slurm() -> None:
    """Fill torchrun's variables from Slurm's when a job was started by `srun` directly."""
    if "RANK" in os.environ or "SLURM_PROCID" not in os.environ:
        return
    os.environ["RANK"] = os.environ["SLURM_PROCID"]
    os.environ["WORLD_SIZE"] = os.environ.get("SLURM_NTASKS", "1")
    os.environ["LOCAL_RANK"] = os.environ.get("SLURM_LOCALID", "0")
    os.environ.setdefault("MASTER_PORT", "29500")


def init_group(device: str, job_dir: Path) -> Rank:
    """Join the job's process group (gloo on CPU, NCCL on CUDA) and record this rank's pid in the job folder.

    Args:
        device: "cpu" or "cuda"; with CUDA each process takes the GPU of its LOCAL_RANK.
        job_dir: The job folder (rank<R>.pid is written there).
    """
    _env_from_slurm()
    interrupt.fault_file_from_env()  # a native fault leaves this rank's stacks in the run's crash folder
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    dev = torch.device("cpu")
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise RuntimeError(f"rank {rank} on {socket.gethostname()} has no CUDA device")
        if local >= torch.cuda.device_count():
            raise RuntimeError(
                f"rank {rank} on {socket.gethostname()} is local rank {local} but the node has "
                f"{torch.cuda.device_count()} CUDA device(s): run one process per GPU"
            )
        torch.cuda.set_device(local)
        dev = torch.device("cuda", local)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")
    (job_dir / f"rank{rank}.pid").write_text(f"{os.getpid()} {socket.gethostname()}\n")
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if dev.type == "cuda" else "gloo", rank=rank, world_size=world)
    return Rank(rank, world, local, dev)


def report_progress(item: dict[str, Any]) -> None:
    """Print one progress line for the parent (rank 0 only calls it)."""
    sys.stdout.write(PROGRESS_MARK + json.dumps(item) + "\n")
    sys.stdout.flush()


def record_failure(job_dir: Path, rank: int, exc: BaseException) -> None:
    """Write this rank's one-line failure reason where the parent looks for it."""
    try:
        (job_dir / f"error_rank{rank}.txt").write_text(f"{type(exc).__name__}: {one_line(exc)}\n")
    except OSError:
        pass


def parent_alive(watch: dict[str, Any] | None) -> bool:
    """Return False when the process that launched the job (same host) is gone: the job should stop."""
    if not watch or watch.get("host") != socket.gethostname():
        return True
    try:
        os.kill(int(watch["pid"]), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def close_group() -> None:
    """Leave the process group, if one was joined."""
    if dist.is_initialized():
        dist.destroy_process_group()
    interrupt.disable_fault_file(interrupt.CHILD_ROLE)
