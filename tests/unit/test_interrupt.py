"""Cooperative stop: a stop request ends forward passes and loops at once, and is never swallowed as a failure."""

from __future__ import annotations

import logging
import os
import signal

import pytest
import torch
from helpers.child_work import ends_by

from profiling_agent.tools import interrupt


@pytest.fixture(autouse=True)
def _no_stop_left():
    interrupt.clear()
    yield
    interrupt.clear()


def test_a_stop_request_makes_every_forward_raise_until_cleared(tiny_vit):
    x = torch.zeros(1, 1, 16, 16)
    tiny_vit(pixel_values=x)
    interrupt.request_stop("SIGINT")
    assert interrupt.stop_requested() and interrupt.stop_reason() == "SIGINT"
    with pytest.raises(interrupt.Interrupted):
        tiny_vit(pixel_values=x)
    with pytest.raises(interrupt.Interrupted):
        interrupt.check()
    interrupt.clear()
    tiny_vit(pixel_values=x)  # the hook is gone again
    interrupt.check()


def test_a_step_that_records_failures_does_not_swallow_a_stop():
    def step() -> str:
        try:
            interrupt.check()
        except Exception:  # noqa: BLE001 - what a step that records failures and goes on does
            return "recorded as a failure"
        return "ran"

    interrupt.request_stop()
    with pytest.raises(interrupt.Interrupted):
        step()


def test_signals_raise_in_the_main_thread_and_a_second_one_calls_the_fallback():
    seconds = []
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)  # SIG_IGN under a background job
    with interrupt.stop_on_signals(on_second=seconds.append):
        with pytest.raises(interrupt.Interrupted) as caught:
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(1000):  # the handler runs between bytecodes
                pass
        assert str(caught.value) == "SIGTERM" and interrupt.stop_requested()
        os.kill(os.getpid(), signal.SIGINT)  # a second signal while the step winds down
        for _ in range(1000):
            pass
        assert seconds == ["SIGINT"]
    assert not interrupt.stop_requested()  # the block restores the handlers and the flag
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


def test_first_use_training_logs_progress_and_stops_on_request(monkeypatch, caplog):
    from profiling_agent.tools.models import embedded

    model = embedded.build_architecture("resnet-digits")
    x, y = torch.randn(32, 1, 32, 32), torch.randint(0, 10, (32,))
    cfg = embedded.TrainConfig(epochs=2, lr=1e-3, batch_size=8)
    monkeypatch.setattr(embedded, "PROGRESS_SECONDS", 0.0)
    with caplog.at_level(logging.INFO, logger=embedded.__name__):
        embedded._train(model, x, y, cfg, "resnet-digits")
    lines = [r.getMessage() for r in caplog.records if r.name == embedded.__name__]
    assert len(lines) == 8 and lines[0].startswith("training resnet-digits: 12% (epoch 1/2")
    assert "100% (epoch 2/2" in lines[-1] and "s left" in lines[-1]
    interrupt.request_stop("SIGINT")
    with pytest.raises(interrupt.Interrupted):
        embedded._train(model, x, y, cfg, "resnet-digits")


def test_a_step_that_never_stops_gets_the_fallback_after_the_grace_time():
    import time

    fallback = []
    with interrupt.stop_on_signals(on_second=fallback.append, grace_s=0.2):
        with pytest.raises(interrupt.Interrupted):
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(1000):
                pass
        time.sleep(1.0)  # a step stuck in library code: the block does not end
    assert fallback == ["SIGINT"]
    with interrupt.stop_on_signals(on_second=fallback.append, grace_s=0.2):
        with pytest.raises(interrupt.Interrupted):
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(1000):
                pass
    time.sleep(0.5)  # the block ended in time: the timer was cancelled
    assert fallback == ["SIGINT"]


def test_a_child_ended_by_a_stop_signal_is_a_stop_and_one_killed_otherwise_is_not():
    # Ctrl-C reaches the whole process group: the child may die of it before the main thread's handler has
    # recorded the stop, and the step waiting on it must see a stop, not a crashed child
    with pytest.raises(interrupt.Interrupted, match="SIGINT"):
        interrupt.run_in_child(ends_by, signal.SIGINT)
    with pytest.raises(interrupt.Interrupted, match="SIGTERM"):
        interrupt.run_in_child(ends_by, signal.SIGTERM)
    with pytest.raises(interrupt.ChildCrashed, match="^a child process died by SIGKILL$"):  # no fault folder set
        interrupt.run_in_child(ends_by, signal.SIGKILL)


FORK_RACE = """
import multiprocessing, os, signal, sys, time

# registered before interrupt's own hook, so it runs first in the child: a Ctrl-C that reaches the child before
# its handlers are reset (what a loaded machine does when the child is slow to be scheduled)
os.register_at_fork(after_in_child=lambda: os.kill(os.getpid(), signal.SIGINT))

from profiling_agent.tools import interrupt


def sleeper():
    time.sleep(30)


if __name__ == "__main__":
    with interrupt.stop_on_signals():
        child = multiprocessing.get_context("fork").Process(target=sleeper)
        child.start()
        child.join(20)
        print(child.exitcode, flush=True)
        if child.is_alive():
            child.kill()
"""


def test_a_ctrl_c_that_reaches_a_forked_child_before_its_handlers_are_reset_still_ends_it(tmp_path):
    import subprocess
    import sys

    script = tmp_path / "fork_race.py"
    script.write_text(FORK_RACE)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(-signal.SIGINT), done.stderr  # pending across the fork, then the default action
