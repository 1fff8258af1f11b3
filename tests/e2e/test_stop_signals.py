"""Ctrl-C and SIGTERM stop a run inside its heavy step; a full disk stops recovery, and resume redoes it.

The runs that are stopped are processes of their own, forked with the libraries already imported
(helpers.forked_cli); the full-disk run calls the CLI's main in the test's process.
"""

from __future__ import annotations

import errno
import json
import signal
import time

import pytest
from helpers.crash_helpers import THREAD, cli, offline_resnet_setup, quick_flags, snapshot
from helpers.crash_helpers import start_forked as start

from profiling_agent.graph.review import pending_nodes

pytestmark = pytest.mark.slow


@pytest.fixture
def setup(tmp_path, quick_resnet):
    return offline_resnet_setup(tmp_path, quick_resnet)


def _run_flags(model, dataset, runs, steps: int) -> list[str]:
    return quick_flags(
        model, dataset, runs, "--planner", "l2", "--ratio", "0.4", "--recover", "auto", "--recover-steps", str(steps),
        "--recover-batch", "16", "--recover-minutes", "0", "--test-subset", "48", "--backend", "torch",
    )  # fmt: skip


def _saved_step(runs) -> int:
    latest = runs / THREAD / "iter_01" / "recovery_steps" / "latest.json"
    return json.loads(latest.read_text())["step"] if latest.is_file() else -1


def _stop_while_distilling(proc, runs, sig, after_step: int) -> tuple[str, float]:
    """Wait until distillation has saved a step past `after_step`, send `sig`; return stderr and seconds to exit."""
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and proc.poll() is None and _saved_step(runs) <= after_step:
        time.sleep(0.05)
    assert proc.poll() is None, proc.communicate()[1][-3000:]
    sent = time.monotonic()
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=180)  # a guard against a hang
    return err, time.monotonic() - sent


def test_ctrl_c_and_sigterm_stop_distillation_at_once_and_print_the_resume_command(setup):
    model, dataset, runs, env = setup
    proc = start(cli("run", *_run_flags(model, dataset, runs, 100)), env, runs.parent)  # a step saved every 5
    err, waited = _stop_while_distilling(proc, runs, signal.SIGINT, -1)
    print(f"SIGINT during distillation: exit {proc.returncode} after {waited:.1f} s")
    hint = f"resume with `profiling-agent resume {THREAD} --run-dir {runs}`"
    assert proc.returncode == 130 and "Traceback" not in err, err[-3000:]
    assert err.strip().splitlines()[-1] == f"interrupted: {hint}"  # the step stopped itself: no forced exit
    assert pending_nodes(snapshot(runs)) == ("recover",)  # resumable at the step that was stopped
    assert not (runs / THREAD / "iter_01" / "recovered").exists()
    stopped_at = _saved_step(runs)
    assert 0 <= stopped_at < 99

    proc = start(cli("resume", THREAD, "--run-dir", str(runs)), env, runs.parent)
    err, waited = _stop_while_distilling(proc, runs, signal.SIGTERM, stopped_at)
    print(f"SIGTERM during distillation: exit {proc.returncode} after {waited:.1f} s")
    assert proc.returncode == 130 and "Traceback" not in err, err[-3000:]
    assert err.strip().splitlines()[-1] == f"stopped by SIGTERM: {hint}"
    assert pending_nodes(snapshot(runs)) == ("recover",) and _saved_step(runs) < 99


def test_a_full_disk_during_recovery_stops_the_run_and_resume_redoes_it(setup, monkeypatch, capsys):
    from profiling_agent.graph.cli.main import main
    from profiling_agent.tools import io

    model, dataset, runs, env = setup
    monkeypatch.setenv("PROFILING_AGENT_CACHE", env["PROFILING_AGENT_CACHE"])
    real = io.write_atomic

    def full_disk(path, write, **kw):
        if "recovery_steps" in str(path):
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real(path, write, **kw)

    monkeypatch.setattr(io, "write_atomic", full_disk)
    assert main(["run", *_run_flags(model, dataset, runs, 20)]) == 1
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith("profiling-agent: error: iteration 1's recovery could not write its files (No space left")
    assert "recovery_steps" in line and line.endswith(
        f"(then resume with `profiling-agent resume {THREAD} --run-dir {runs}`)"
    )
    assert pending_nodes(snapshot(runs)) == ("recover",)  # not delivered without its recovery

    monkeypatch.setattr(io, "write_atomic", real)  # space is free again
    assert main(["resume", THREAD, "--run-dir", str(runs)]) == 0
    values = snapshot(runs).values
    recovery = values["candidates"][0]["recovery"]
    assert recovery["method"] == "reconstruct+distill" and recovery["steps"] == 20 and recovery["error"] is None
    assert not any("abandoned" in h["message"] for h in values["history"])
    assert json.loads((runs / THREAD / "result.json").read_text())["status"] == "done"
