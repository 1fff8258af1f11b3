"""`run --recover-procs 2`: the recover node distills in a 2-process gloo job.

The validation and held-out test passes are sharded too; a SIGKILLed rank stops the run with one line and exit
code 1, and `resume` finishes it with every step once. The CLI's main runs in the test's process (the ranks and
their launcher are the processes under test). The run's jobs (the baseline's validation pass, the distillation
whose rank is killed) run under torchrun; the resume changes the launcher (a "how" flag `resume` takes) to one that
forks its ranks from an interpreter with the libraries imported (helpers.forked_ranks), which spares each rank of
the resumed distillation, the validation pass and the held-out pass its seconds of imports.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest
from helpers.crash_helpers import PHASE_TIMEOUT, THREAD, offline_resnet_setup, quick_flags, run_in_process
from helpers.crash_helpers import check_complete as _check_complete
from helpers.crash_helpers import cli as _cli
from helpers.forked_ranks import launcher


@pytest.mark.slow
def test_a_cli_run_distills_on_two_processes_and_resumes_after_a_rank_is_killed(tmp_path, quick_resnet):
    model, dataset, runs, env = offline_resnet_setup(tmp_path, quick_resnet)
    run_args = _cli(
        "run", *quick_flags(model, dataset, runs, "--planner", "deterministic", "--backend", "torch",
                            "--recover", "distill", "--recover-steps", "24", "--recover-batch", "16",
                            "--recover-minutes", "0", "--recover-procs", "2", "--device", "cpu",
                            "--test-subset", "48", "--target", "size"),
    )  # fmt: skip
    # a step saved every step; a short held-out pass; under a size target every form is scored in the first split
    # pass, so each validation pass is one 2-process job
    job = runs / THREAD / "iter_01" / "recovery_job"
    saved = runs / THREAD / "iter_01" / "recovery_steps" / "latest.json"
    ended = threading.Event()

    def kill_rank_1_once_a_step_is_saved() -> None:
        deadline = time.monotonic() + PHASE_TIMEOUT
        while not ended.is_set() and time.monotonic() < deadline:
            if saved.is_file() and json.loads(saved.read_text())["step"] >= 4 and (job / "rank1.pid").is_file():
                os.kill(int((job / "rank1.pid").read_text().split()[0]), signal.SIGKILL)
                return
            time.sleep(0.05)

    watcher = threading.Thread(target=kill_rank_1_once_a_step_is_saved, daemon=True)
    watcher.start()
    try:  # the CLI's main in this process (the kill lands on a rank, not on the CLI)
        code, _out, err = run_in_process(run_args, env, tmp_path)
    finally:
        ended.set()
        watcher.join()
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 1, err
    assert "rank 1 was killed by SIGKILL" in lines[-1] and "resume continues" in lines[-1], lines[-1]
    assert "Traceback" not in err
    killed_at = json.loads(saved.read_text())["step"]
    assert killed_at < 23
    resume_args = _cli("resume", THREAD, "--run-dir", str(runs), "--launcher", launcher())
    code, _out, err = run_in_process(resume_args, env, tmp_path)
    assert code == 0, err
    values = _check_complete(runs)
    recovery = values["candidates"][0]["recovery"]
    assert recovery["method"] == "distill" and recovery["steps"] == 24
    assert recovery["resumed_from"] == killed_at + 1, (recovery, killed_at)
    assert "2 processes distilled" in recovery["note"]
    history = [h["message"] for h in values["history"] if h["node"] == "recover"]
    assert len(history) == 1 and "2 processes distilled" in history[0], history
    tested = [h["message"] for h in values["history"] if h["node"] == "evaluate_held_out"]
    assert "2 processes" in tested[0] and values["test_eval"]["best_accuracy"] is not None, tested
    for node in ("measure_baseline", "evaluate"):  # the validation passes are split too
        passes = [h["message"] for h in values["history"] if h["node"] == node]
        assert passes and all("validation pass on 2 processes" in m for m in passes), (node, passes)
    curve = json.loads((runs / THREAD / "iter_01" / "recovery.json").read_text())["distill"]
    assert curve["procs"] == 2 and [c[0] for c in curve["curve"]] == list(range(24))  # every step once
