"""A CLI run killed (SIGKILL) or interrupted (SIGINT) at several points resumes to the same complete result."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from quick_assets import build_quick_resnet

from profiling_agent.graph.review import pending_nodes

THREAD = "crash"
PHASE_TIMEOUT = 300.0


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "profiling_agent.graph.cli", *args]


def _start(cmd: list[str], env: dict[str, str], cwd: Path) -> subprocess.Popen:
    return subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _snapshot(runs: Path):
    """Read the thread's latest checkpoint from the database the CLI is writing (None before it exists)."""
    from profiling_agent.graph.builder import build_graph
    from profiling_agent.graph.checkpoint import open_checkpointer, thread_ids

    if not (runs / "checkpoints.sqlite").exists():
        return None
    saver = open_checkpointer(runs)
    try:
        if THREAD not in thread_ids(saver):
            return None
        return build_graph(checkpointer=saver).get_state({"configurable": {"thread_id": THREAD}})
    finally:
        saver.conn.close()


def _stop_when(proc: subprocess.Popen, runs: Path, predicate, sig: int) -> tuple[str, tuple, int]:
    """Poll the checkpoints until `predicate(snapshot)` holds, then send `sig`; return (stderr, pending, exit code)."""
    deadline = time.monotonic() + PHASE_TIMEOUT
    while proc.poll() is None and time.monotonic() < deadline:
        snap = _snapshot(runs)
        if snap is not None and predicate(snap):
            proc.send_signal(sig)
            _, err = proc.communicate(timeout=PHASE_TIMEOUT)
            return err, pending_nodes(_snapshot(runs)), proc.returncode
        time.sleep(0.05)
    proc.kill()
    _, err = proc.communicate()
    pytest.fail(f"the phase never came (exit {proc.returncode}):\n{err[-3000:]}")


def _next_is(node: str | tuple[str, ...], iteration: int | None = None):
    """Match a checkpoint whose next node is `node` (or any of several: a wider window is easier to hit)."""
    nodes = (node,) if isinstance(node, str) else node

    def check(snap) -> bool:
        return (
            len(snap.next) == 1
            and snap.next[0] in nodes
            and (iteration is None or snap.values.get("iteration") == iteration)
        )

    return check


def _check_complete(runs: Path) -> dict:
    """Assert the finished thread has every iteration once and every recorded artifact matches its sha256."""
    from profiling_agent.tools.io import sha256_path

    values = _snapshot(runs).values
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
        "test_best",
        "report",
    ):
        assert sum(n for (name, _), n in steps.items() if name == node) == 1, node
    for it in range(1, iterations + 1):
        assert steps[("analyze", it)] == 1 and steps[("iterate", it)] == 1, it
    assert sorted(p.name for p in run.glob("iter_*")) == [f"iter_{i:02d}" for i in range(1, iterations + 1)]

    refs = [values["baseline"]]
    for cand in values["candidates"]:
        if cand["status"] == "ok":
            refs.append(cand["artifact"])
    assert len(refs) > 1, "no candidate finished"
    for ref in refs:
        assert sha256_path(run / ref["path"]) == ref["sha256"], ref["path"]
    best = values["best"]
    assert sha256_path(run / "best") == best["artifact"]["sha256"]  # best/ is a whole copy of the candidate
    result = json.loads((run / "result.json").read_text())
    assert {c["iteration"]: c["sha256"] for c in result["candidates"]} == {
        c["iteration"]: (c.get("artifact") or {}).get("sha256") for c in values["candidates"]
    }
    for path in run.rglob("*.json"):  # atomic writes: no half-written JSON anywhere (temp files are hidden)
        if not any(part.startswith(".") for part in path.relative_to(run).parts):
            json.loads(path.read_text())
    return values


def test_a_step_saved_without_its_checkpoint_is_still_pending():
    """A process stopped between a step's writes and its checkpoint: `next` is empty, but the run is not over."""
    import sqlite3
    from typing import TypedDict

    from langgraph.checkpoint.sqlite import SqliteSaver
    from langgraph.graph import END, START, StateGraph

    class Toy(TypedDict, total=False):
        a: int
        b: int

    calls = Counter()

    def node_a(state: Toy) -> dict:
        calls["a"] += 1
        return {"a": 1}

    builder = StateGraph(Toy)
    builder.add_node("a", node_a)
    builder.add_node("b", lambda state: {"b": 2})
    builder.add_edge(START, "a")
    builder.add_edge("a", "b")
    builder.add_edge("b", END)
    saver = SqliteSaver(sqlite3.connect(":memory:", check_same_thread=False))
    graph = builder.compile(checkpointer=saver)
    real_put = saver.put

    def put_then_die(config, checkpoint, metadata, new_versions):
        if metadata.get("step") == 1:  # a's writes are saved; its step's checkpoint never is
            raise KeyboardInterrupt
        return real_put(config, checkpoint, metadata, new_versions)

    saver.put = put_then_die
    config = {"configurable": {"thread_id": "t"}}
    with pytest.raises(KeyboardInterrupt):
        graph.invoke({}, config, durability="sync")
    snapshot = graph.get_state(config)
    assert snapshot.next == () and pending_nodes(snapshot) == ("a",)
    saver.put = real_put
    assert graph.invoke(None, config, durability="sync") == {"a": 1, "b": 2}
    assert calls["a"] == 1  # resumed from the saved writes, not re-run


@pytest.mark.slow
def test_killed_and_interrupted_run_resumes_without_loss(tmp_path):
    model, dataset = build_quick_resnet(tmp_path / "cache")
    runs = tmp_path / "runs"
    env = {**os.environ, "PROFILING_AGENT_CACHE": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1"}
    for key in ("OPENAI_API_KEY", "OPENAI_BASE_URL"):
        env.pop(key, None)
    run_args = _cli(
        "run", "--model", str(model), "--dataset", str(dataset), "--subset", "96", "--calibration", "16",
        "--iterations", "3", "--planner", "deterministic", "--target-reduction", "0.9", "--max-acc-drop", "0.5",
        "--repeats", "2", "--threads", "1", "--run-dir", str(runs), "--thread-id", THREAD,
    )  # fmt: skip
    resume_args = _cli("resume", THREAD, "--run-dir", str(runs))

    # 1. SIGKILL while profiling
    err, nxt, code = _stop_when(_start(run_args, env, tmp_path), runs, _next_is("profile"), signal.SIGKILL)
    assert code == -signal.SIGKILL and nxt == ("profile",), err

    # 2. SIGKILL while iteration 1 is quantized or evaluated
    late_in_round = _next_is(("quantize", "evaluate"), 1)
    err, nxt, code = _stop_when(_start(resume_args, env, tmp_path), runs, late_in_round, signal.SIGKILL)
    assert code == -signal.SIGKILL and nxt in (("quantize",), ("evaluate",), ("iterate",)), err

    # 3. Ctrl-C (SIGINT) in the middle of iteration 2: exit 130 and one line naming the resume command
    mid_loop = _next_is(("prune", "quantize", "evaluate"), 2)  # a quick step alone can fall between two polls
    err, nxt, code = _stop_when(_start(resume_args, env, tmp_path), runs, mid_loop, signal.SIGINT)
    assert code == 130, err
    assert "Traceback" not in err
    expected = f"interrupted: resume with `profiling-agent resume {THREAD} --run-dir {runs}`"
    assert err.strip().splitlines()[-1] == expected
    assert nxt in (("prune",), ("quantize",), ("evaluate",), ("iterate",))  # unfinished, or writes saved

    # 4. SIGKILL while the report measures and writes
    err, nxt, code = _stop_when(_start(resume_args, env, tmp_path), runs, _next_is("report"), signal.SIGKILL)
    assert code == -signal.SIGKILL and nxt == ("report",), err

    # 5. the last resume finishes the run
    done = subprocess.run(resume_args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=PHASE_TIMEOUT)
    assert done.returncode == 0, done.stderr
    assert "resuming crash at report" in done.stderr and "best:" in done.stdout
    _check_complete(runs)
