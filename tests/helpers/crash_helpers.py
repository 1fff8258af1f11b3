"""Helpers for tests that drive the CLI in subprocesses, stop it at chosen checkpoints and check the result."""

from __future__ import annotations

import contextlib
import functools
import io
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from helpers.forked_cli import ForkedCli
from profiling_agent.graph.review import pending_nodes

THREAD = "crash"
PHASE_TIMEOUT = 300.0


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "profiling_agent.graph.cli", *args]


def run_in_process(cmd: list[str], env: dict[str, str], cwd: Path) -> tuple[int, str, str]:
    """Run the CLI command `cmd` (a `cli(...)` list) with the CLI's main in this process; return (code, out, err).

    For the run a test does not stop: a fresh interpreter spends seconds importing the libraries this process
    already holds. The environment `env` (and `cwd`) hold while it runs; the processes it starts inherit them.
    """
    from profiling_agent.graph.cli.main import main

    assert cmd[:3] == cli()[:3], cmd
    out, err = io.StringIO(), io.StringIO()
    saved, here = dict(os.environ), os.getcwd()
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(cmd[3:])
    finally:
        os.chdir(here)
        os.environ.clear()
        os.environ.update(saved)
    return code, out.getvalue(), err.getvalue()


def start(cmd: list[str], env: dict[str, str], cwd: Path) -> subprocess.Popen:
    return subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def start_forked(cmd: list[str], env: dict[str, str], cwd: Path, **options) -> ForkedCli:
    """Start the CLI command `cmd` (a `cli(...)` list) in a process of its own, forked with the libraries imported.

    For the runs a test stops or starts side by side: each a process of its own, without a fresh interpreter's
    seconds of imports (helpers.forked_cli). `options` go to `ForkedCli` (`prepare`, `start_new_session`).
    """
    assert cmd[:3] == cli()[:3], cmd
    return ForkedCli(cmd[3:], env, cwd, **options)


@functools.cache
def _bare_graph():
    """The compiled graph without a checkpointer, built once per process (a build costs ~60 ms of CPU)."""
    from profiling_agent.graph.builder import build_graph

    return build_graph(read_only=True)


def snapshot(runs: Path, url: str | None = None, thread: str = THREAD):
    """Read the thread's latest checkpoint from the database the CLI is writing (None before it exists).

    Without `url` the database is RUNS/checkpoints.sqlite; with it, the PostgreSQL database at `url`. The graph is
    compiled once per process, so a read costs milliseconds: cheap enough to poll a running CLI many times a second
    without taking the CPU from the run under test.
    """
    from profiling_agent.graph.checkpoint import close_checkpointer, has_checkpoints, open_checkpointer, thread_ids

    if not has_checkpoints(runs, url):
        return None
    saver = open_checkpointer(runs, url)
    try:
        if thread not in thread_ids(saver):
            return None
        return _bare_graph().copy(update={"checkpointer": saver}).get_state({"configurable": {"thread_id": thread}})
    finally:
        close_checkpointer(saver)


def stop_when(
    proc: subprocess.Popen | ForkedCli, runs: Path, predicate, sig: int, url: str | None = None, ready=None
) -> tuple[str, tuple, int]:
    """Poll the checkpoints until `predicate(snapshot)` holds, then send `sig`; return (stderr, pending, exit code).

    With `ready` (a cheap test, such as a file's presence) the checkpoints are read only once it holds.
    """
    deadline = time.monotonic() + PHASE_TIMEOUT
    while proc.poll() is None and time.monotonic() < deadline:
        snap = snapshot(runs, url) if ready is None or ready() else None
        if snap is not None and predicate(snap):
            proc.send_signal(sig)
            _, err = proc.communicate(timeout=PHASE_TIMEOUT)
            return err, pending_nodes(snapshot(runs, url)), proc.returncode
        time.sleep(0.05)
    proc.kill()
    _, err = proc.communicate()
    pytest.fail(f"the phase never came (exit {proc.returncode}):\n{err[-3000:]}")


def next_is(node: str | tuple[str, ...], iteration: int | None = None):
    """Match a checkpoint whose next node is `node` (or any of several: a wider window is easier to hit)."""
    nodes = (node,) if isinstance(node, str) else node

    def check(snap) -> bool:
        return (
            len(snap.next) == 1
            and snap.next[0] in nodes
            and (iteration is None or snap.values.get("iteration") == iteration)
        )

    return check


def check_complete(runs: Path, url: str | None = None) -> dict:
    """Assert the finished thread has every iteration once and every recorded artifact matches its sha256."""
    from profiling_agent.tools.io import sha256_path

    values = snapshot(runs, url).values
    run = runs / THREAD
    assert values["status"] == "done"
    iterations = values["objective"]["iterations"]
    assert [c["iteration"] for c in values["candidates"]] == list(range(1, iterations + 1))
    steps = Counter((h["node"], h["iteration"]) for h in values["history"])
    assert max(steps.values()) == 1, [k for k, n in steps.items() if n > 1]  # no node step recorded twice
    for node in (
        "acquire",
        "resolve_input_shape",
        "prepare_data",
        "profile",
        "probe_sensitivity",
        "measure_baseline",
        "evaluate_held_out",
        "report",
    ):
        assert sum(n for (name, _), n in steps.items() if name == node) == 1, node
    for it in range(1, iterations + 1):
        assert steps[("analyze", it)] == 1 and steps[("iterate", it)] == 1, it
    assert sorted(p.name for p in run.glob("iter_*")) == [f"iter_{i:02d}" for i in range(1, iterations + 1)]

    refs = [values["baseline"]]
    for cand in values["candidates"]:
        if cand["status"] == "ok":
            refs += [cand["artifact"], *([cand["delivered"]] if cand.get("delivered") else [])]
    assert len(refs) > 1, "no candidate finished"
    for ref in refs:
        assert sha256_path(run / ref["path"]) == ref["sha256"], ref["path"]
    best = values["best"]
    delivered = best.get("delivered") or best["artifact"]  # an ONNX Runtime form or the torch artifact
    assert sha256_path(run / "best") == delivered["sha256"]  # best/ is a whole copy of the delivered form
    result = json.loads((run / "result.json").read_text())
    assert {c["iteration"]: c["sha256"] for c in result["candidates"]} == {
        c["iteration"]: (c.get("delivered") or c.get("artifact") or {}).get("sha256") for c in values["candidates"]
    }
    for path in run.rglob("*.json"):  # atomic writes: no half-written JSON anywhere (temp files are hidden)
        if not any(part.startswith(".") for part in path.relative_to(run).parts):
            json.loads(path.read_text())
    return values


def offline_resnet_setup(folder: Path, quick_resnet: tuple[Path, Path, Path] | None = None):
    """The quick digits ResNet, a runs folder in `folder`, and an offline environment without LLM keys.

    The ResNet is the session's `quick_resnet` fixture (model, dataset, cache) when given, else one trained here
    into the private cache FOLDER/cache.
    """
    if quick_resnet is None:
        from helpers.quick_assets import build_quick_resnet

        cache = folder / "cache"
        model, dataset = build_quick_resnet(cache)
    else:
        model, dataset, cache = quick_resnet
    env = {**os.environ, "PROFILING_AGENT_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    for key in ("OPENAI_API_KEY", "OPENAI_BASE_URL"):
        env.pop(key, None)
    return model, dataset, folder / "runs", env


def quick_flags(model: Path, dataset: Path, runs: Path, *flags: str) -> list[str]:
    """The `run` flags of a one-iteration quick run (96 images, 16 calibration, 2 repeats, 1 thread, no charts) plus
    `flags`."""
    return [
        "--model", str(model), "--dataset", str(dataset), "--subset", "96", "--calibration", "16",
        "--repeats", "2", "--threads", "1", "--iterations", "1", "--run-dir", str(runs), "--thread-id", THREAD,
        "--no-plots", *flags,
    ]  # fmt: skip
