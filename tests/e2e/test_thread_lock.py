"""One runner per thread, for SQLite (a file lock) and PostgreSQL (an advisory lock): the second is refused."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest
from helpers.crash_helpers import PHASE_TIMEOUT, THREAD, check_complete, cli, next_is, stop_when
from helpers.crash_helpers import start_forked as start

from profiling_agent.graph.checkpoint import CHECKPOINT_URL_ENV, DB_NAME, close_checkpointer, open_checkpointer
from profiling_agent.graph.cli.main import main
from profiling_agent.graph.thread_lock import ThreadBusy, thread_holder, thread_lock

HOST = socket.gethostname()[:24]  # the advisory lock's holder name keeps at most 24 characters of the host

HOLDER = """
import sys, time
from profiling_agent.graph.checkpoint import open_checkpointer
from profiling_agent.graph.thread_lock import thread_lock
root, url = sys.argv[1], sys.argv[2] or None
saver = open_checkpointer(root, url)
with thread_lock(saver, root, "t"):
    print("locked", flush=True)
    time.sleep(600)
"""


@pytest.fixture(params=["sqlite", "postgres"])
def store(request, tmp_path):
    """(run folder, checkpoint URL or None): SQLite under the run folder, or a fresh PostgreSQL database."""
    url = request.getfixturevalue("postgres_url") if request.param == "postgres" else None
    return tmp_path / "runs", url


def _env() -> dict[str, str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    for key in ("OPENAI_API_KEY", "OPENAI_BASE_URL", CHECKPOINT_URL_ENV):
        env.pop(key, None)
    return env


def test_a_held_thread_is_refused_until_its_holder_dies(store):
    root, url = store
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(root), url or ""], env=_env(), stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        saver = open_checkpointer(root, url)
        try:
            with pytest.raises(ThreadBusy) as busy, thread_lock(saver, root, "t"):
                pass
            message = str(busy.value)
            assert message.startswith(f"thread t is already being run by pid {holder.pid} on {HOST}"), message
            assert len(message.splitlines()) == 1
            with thread_lock(saver, root, "another thread"):  # other threads are free
                pass
            # `runs` reads who holds a thread without taking the lock from a runner
            assert (thread_holder(saver, root, "t") or "").startswith(f"pid {holder.pid} on {HOST}")
            assert thread_holder(saver, root, "another thread") is None
            holder.send_signal(signal.SIGKILL)  # no cleanup runs: the kernel or the server drops the lock
            holder.wait(timeout=60)
            for _ in range(50):  # the server notices the closed connection within moments
                if thread_holder(saver, root, "t") is None:
                    break
                time.sleep(0.1)
            assert thread_holder(saver, root, "t") is None
            with thread_lock(saver, root, "t"):
                second = open_checkpointer(root, url)  # a second runner in this very process is refused too
                me = f"pid {os.getpid()} on {HOST}"
                try:
                    with pytest.raises(ThreadBusy, match=me), thread_lock(second, root, "t"):
                        pass
                finally:
                    close_checkpointer(second)
            with thread_lock(saver, root, "t"):  # released at the end of the block
                pass
        finally:
            close_checkpointer(saver)
    finally:
        holder.kill()
        holder.wait(timeout=60)


@pytest.mark.slow
def test_two_resumes_of_a_killed_run_exactly_one_runs(tmp_path, quick_resnet, store, capsys, monkeypatch):
    """A run killed mid-loop, then two resumes at once from elsewhere (only the run folder and the database)."""
    runs, url = store
    model, dataset, cache = quick_resnet
    env = {**_env(), "PROFILING_AGENT_CACHE": str(cache)}
    flag = ["--checkpoint-url", url] if url else []
    run_args = cli(
        "run", "--model", str(model), "--dataset", str(dataset), "--subset", "48", "--calibration", "8",
        "--test-subset", "32", "--iterations", "1", "--planner", "deterministic", "--target-reduction", "0.9",
        "--max-acc-drop", "0.5", "--repeats", "2", "--threads", "1", "--recover", "none", "--run-dir", str(runs),
        "--thread-id", THREAD, "--backend", "torch", *flag,
    )  # fmt: skip  # the subject is the lock: one round on few images, no recovery, the torch forms only
    mid_loop = next_is(("quantize", "evaluate"), 1)
    err, nxt, code = stop_when(start(run_args, env, tmp_path), runs, mid_loop, signal.SIGKILL, url)
    assert code == -signal.SIGKILL and nxt in (("quantize",), ("evaluate",), ("iterate",)), err

    elsewhere = tmp_path / "elsewhere"  # another working directory: nothing relative to the first one
    elsewhere.mkdir()
    resume = cli("resume", THREAD, "--run-dir", str(runs))
    by_env = {**env, CHECKPOINT_URL_ENV: url} if url else env  # one finds the database by flag, one by environment
    procs = [start([*resume, *flag], env, elsewhere), start(resume, by_env, elsewhere)]
    results = {proc.pid: (proc, *proc.communicate(timeout=PHASE_TIMEOUT)) for proc in procs}
    codes = sorted(proc.returncode for proc in procs)
    assert codes == [0, 2], [err[-3000:] for _, _, err in results.values()]
    (winner, out, err), (loser, lost_out, lost_err) = sorted(results.values(), key=lambda r: r[0].returncode)
    lines = [line for line in lost_err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in lost_err and lost_out == "", lost_err
    assert lines[0].startswith(f"profiling-agent: error: thread {THREAD} is already being run by pid {winner.pid}")
    assert f" on {HOST}" in lines[0], lines[0]
    assert f"resuming {THREAD} at" in err and "best:" in out, err[-3000:]
    check_complete(runs, url)  # every iteration once, every artifact matching its recorded sha256

    if url:
        assert not (runs / DB_NAME).exists()  # every checkpoint went to PostgreSQL
        monkeypatch.chdir(elsewhere)
        assert main(["runs", "--checkpoint-url", url]) == 0, capsys.readouterr().err
        listed = capsys.readouterr().out
        row = next(line for line in listed.splitlines() if THREAD in line)
        assert "done" in row and "1/1" in row, listed
