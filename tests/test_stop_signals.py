"""Ctrl-C and SIGTERM stop a run inside its heavy step; a full disk stops recovery, and resume redoes it."""

from __future__ import annotations

import errno
import json
import signal
import time

import pytest
from crash_helpers import THREAD, cli, snapshot, start
from quick_assets import build_quick_resnet

from profiling_agent.graph.review import pending_nodes

pytestmark = pytest.mark.slow


@pytest.fixture
def setup(tmp_path):
    import os

    model, dataset = build_quick_resnet(tmp_path / "cache")
    env = {**os.environ, "PROFILING_AGENT_CACHE": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1"}
    for key in ("OPENAI_API_KEY", "OPENAI_BASE_URL"):
        env.pop(key, None)
    return model, dataset, tmp_path / "runs", env


def _run_flags(model, dataset, runs, steps: int) -> list[str]:
    return [
        "--model", str(model), "--dataset", str(dataset), "--subset", "96", "--calibration", "16",
        "--iterations", "1", "--planner", "l2", "--ratio", "0.4", "--repeats", "2", "--threads", "1",
        "--recover", "auto", "--recover-steps", str(steps), "--recover-batch", "16", "--recover-minutes", "0",
        "--backend", "torch", "--run-dir", str(runs), "--thread-id", THREAD,
    ]  # fmt: skip


def _stop_while_distilling(proc, runs, sig) -> tuple[str, float]:
    """Wait until the recover step has run a few seconds, send `sig`; return stderr and seconds until exit."""
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and proc.poll() is None:
        snap = snapshot(runs)
        if snap is not None and pending_nodes(snap) == ("recover",):
            break
        time.sleep(0.1)
    time.sleep(6)  # reconstruction, then distillation steps (3000 of them: far from done)
    assert proc.poll() is None, proc.communicate()[1][-3000:]
    sent = time.monotonic()
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=180)  # a guard against a hang: the whole distillation would take far longer
    return err, time.monotonic() - sent


def test_ctrl_c_and_sigterm_stop_distillation_at_once_and_print_the_resume_command(setup):
    model, dataset, runs, env = setup
    proc = start(cli("run", *_run_flags(model, dataset, runs, 3000)), env, runs.parent)
    err, waited = _stop_while_distilling(proc, runs, signal.SIGINT)
    print(f"SIGINT during distillation: exit {proc.returncode} after {waited:.1f} s")
    hint = f"resume with `profiling-agent resume {THREAD} --run-dir {runs}`"
    assert proc.returncode == 130 and "Traceback" not in err, err[-3000:]
    assert err.strip().splitlines()[-1] == f"interrupted: {hint}"
    assert pending_nodes(snapshot(runs)) == ("recover",)  # resumable at the step that was stopped
    assert not (runs / THREAD / "iter_01" / "recovered").exists()

    proc = start(cli("resume", THREAD, "--run-dir", str(runs)), env, runs.parent)
    err, waited = _stop_while_distilling(proc, runs, signal.SIGTERM)
    print(f"SIGTERM during distillation: exit {proc.returncode} after {waited:.1f} s")
    assert proc.returncode == 130 and "Traceback" not in err, err[-3000:]
    assert err.strip().splitlines()[-1] == f"stopped by SIGTERM: {hint}"
    assert pending_nodes(snapshot(runs)) == ("recover",)


def test_a_full_disk_during_recovery_stops_the_run_and_resume_redoes_it(setup, monkeypatch, capsys):
    from profiling_agent.graph.cli import main
    from profiling_agent.tools import io

    model, dataset, runs, env = setup
    monkeypatch.setenv("PROFILING_AGENT_CACHE", env["PROFILING_AGENT_CACHE"])
    real = io.write_atomic

    def full_disk(path, write, **kw):
        if "recovery_steps" in str(path):
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real(path, write, **kw)

    monkeypatch.setattr(io, "write_atomic", full_disk)
    assert main(["run", *_run_flags(model, dataset, runs, 40)]) == 1
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
    assert recovery["method"] == "reconstruct+distill" and recovery["steps"] == 40 and recovery["error"] is None
    assert not any("abandoned" in h["message"] for h in values["history"])
    assert json.loads((runs / THREAD / "result.json").read_text())["status"] == "done"
