"""A CLI run killed (SIGKILL) or interrupted (SIGINT) at several points resumes to the same complete result.

The runs that are stopped are processes of their own, forked with the libraries already imported
(helpers.forked_cli); the last resume, which nothing stops, runs the CLI's main in the test's process.
"""

from __future__ import annotations

import json
import signal
import statistics
from collections import Counter

import pytest
from helpers.crash_helpers import THREAD, offline_resnet_setup, quick_flags, run_in_process
from helpers.crash_helpers import check_complete as _check_complete
from helpers.crash_helpers import cli as _cli
from helpers.crash_helpers import next_is as _next_is
from helpers.crash_helpers import start_forked as _start
from helpers.crash_helpers import stop_when as _stop_when
from safetensors.torch import load_file

from profiling_agent.graph.review import pending_nodes


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
def test_killed_and_interrupted_run_resumes_without_loss(tmp_path, quick_resnet):
    model, dataset, runs, env = offline_resnet_setup(tmp_path, quick_resnet)
    run_args = _cli(
        "run", "--model", str(model), "--dataset", str(dataset), "--subset", "96", "--calibration", "16",
        "--iterations", "2", "--planner", "deterministic", "--target-reduction", "0.9", "--max-acc-drop", "0.5",
        "--repeats", "2", "--threads", "1", "--recover-steps", "4", "--run-dir", str(runs), "--thread-id", THREAD,
        "--test-subset", "32", "--backend", "onnxruntime",
    )  # fmt: skip  # ONNX Runtime's forms: every step a kill can hit, without OpenVINO's minutes
    resume_args = _cli("resume", THREAD, "--run-dir", str(runs))

    # 1. SIGKILL while profiling
    err, nxt, code = _stop_when(_start(run_args, env, tmp_path), runs, _next_is("profile"), signal.SIGKILL)
    assert code == -signal.SIGKILL and nxt == ("profile",), err

    # 2. SIGKILL while iteration 1 is quantized or evaluated
    late_in_round = _next_is(("quantize", "evaluate"), 1)
    err, nxt, code = _stop_when(_start(resume_args, env, tmp_path), runs, late_in_round, signal.SIGKILL)
    assert code == -signal.SIGKILL and nxt in (("quantize",), ("evaluate",), ("iterate",)), err

    # 3. Ctrl-C (SIGINT) in the middle of iteration 2: exit 130 and one line naming the resume command
    mid_loop = _next_is(("prune", "recover", "quantize", "evaluate"), 2)  # a quick step can fall between two polls
    err, nxt, code = _stop_when(_start(resume_args, env, tmp_path), runs, mid_loop, signal.SIGINT)
    assert code == 130, err
    assert "Traceback" not in err
    expected = f"interrupted: resume with `profiling-agent resume {THREAD} --run-dir {runs}`"
    assert err.strip().splitlines()[-1] == expected
    assert nxt in (("prune",), ("recover",), ("quantize",), ("evaluate",), ("iterate",))  # unfinished, or saved

    # 4. SIGKILL while the report measures and writes
    err, nxt, code = _stop_when(_start(resume_args, env, tmp_path), runs, _next_is("report"), signal.SIGKILL)
    assert code == -signal.SIGKILL and nxt == ("report",), err

    # 5. the last resume, stopped by nothing, finishes the run (the CLI's main in this process: no fresh imports)
    code, out, err = run_in_process(resume_args, env, tmp_path)
    assert code == 0, err
    assert "resuming crash at report" in err and "best:" in out
    _check_complete(runs)


@pytest.mark.slow
def test_a_run_killed_during_distillation_resumes_from_its_last_saved_step(tmp_path, quick_resnet):
    model, dataset, runs, env = offline_resnet_setup(tmp_path, quick_resnet)
    run_args = _cli(
        "run", *quick_flags(model, dataset, runs, "--planner", "l2", "--ratio", "0.4", "--recover", "auto",
                            "--recover-steps", "40", "--recover-batch", "16", "--recover-minutes", "0",
                            "--test-subset", "48", "--backend", "torch"),  # the subject is distillation: torch forms
    )  # fmt: skip
    saved = runs / THREAD / "iter_01" / "recovery_steps" / "latest.json"

    def step_saved() -> bool:  # a step past the first save (every 2nd step of 40) is on disk
        return saved.is_file() and json.loads(saved.read_text())["step"] >= 5

    err, nxt, code = _stop_when(
        _start(run_args, env, tmp_path), runs, _next_is("recover"), signal.SIGKILL, ready=step_saved
    )  # the recover node is still running when its saved step is seen
    assert code == -signal.SIGKILL and nxt == ("recover",), err
    killed_at = json.loads(saved.read_text())["step"]
    code, _out, err = run_in_process(_cli("resume", THREAD, "--run-dir", str(runs)), env, tmp_path)
    assert code == 0, err
    values = _check_complete(runs)
    recovery = values["candidates"][0]["recovery"]
    assert recovery["method"] == "reconstruct+distill" and recovery["steps"] == 40
    assert recovery["resumed_from"] >= killed_at + 1 > 1, (recovery, killed_at)
    assert not saved.parent.exists()  # the finished artifact replaced the step checkpoints

    # the same run with its distillation uninterrupted, stopped once the recover node's checkpoint is saved (the
    # later steps read nothing the comparison needs): the same steps and the same weights; every attempt ran on
    # the same threads
    whole_runs = tmp_path / "whole"
    whole_args = [a if a != str(runs) else str(whole_runs) for a in run_args]
    recovered = whole_runs / THREAD / "iter_01" / "recovered" / "model.safetensors"
    after_recover = _next_is(("quantize", "evaluate", "iterate", "evaluate_held_out", "report"))
    err, nxt, code = _stop_when(
        _start(whole_args, env, tmp_path), whole_runs, after_recover, signal.SIGKILL, ready=recovered.is_file
    )
    assert code == -signal.SIGKILL and "recover" not in nxt, err
    curves = {
        name: json.loads((root / THREAD / "iter_01" / "recovery.json").read_text())["distill"]
        for name, root in (("resumed", runs), ("whole", whole_runs))
    }
    assert curves["resumed"]["steps_done"] == curves["whole"]["steps_done"] == 40
    assert [a["from"] for a in curves["whole"]["attempts"]] == [0]  # one attempt: never interrupted
    assert [a["from"] for a in curves["resumed"]["attempts"]] == [0, recovery["resumed_from"]]
    assert {a["threads"] for a in curves["resumed"]["attempts"] + curves["whole"]["attempts"]} == {1}  # --threads 1
    weights = [
        load_file(str(root / THREAD / "iter_01" / "recovered" / "model.safetensors")) for root in (runs, whole_runs)
    ]
    gap = max(float((weights[0][k] - weights[1][k]).abs().max()) for k in weights[0])
    median = statistics.median(curves["whole"]["step_seconds"])
    slowest = max(curves["resumed"]["step_seconds"][recovery["resumed_from"] :])
    print(
        f"largest weight difference, resumed vs uninterrupted: {gap:.3g}; slowest resumed step {slowest / median:.2f}x"
    )
    assert gap <= 1e-6, gap
