"""Native crash records: processes that die by a real signal leave every thread's stack in RUN/crash/."""

from __future__ import annotations

import faulthandler
import os
import pickle
import signal
import subprocess
import sys

import pytest

from profiling_agent.graph.cli.crashes import (
    FaultRecord,
    crash_line,
    leftover_line,
    leftovers,
    set_aside,
    set_aside_line,
)
from profiling_agent.tools import interrupt

# a run's process that keeps its fault file in RUN (argv[1]) and dies in `deep_in_a_step` as argv[2] says
DIE = """
import faulthandler, os, signal, sys
from profiling_agent.tools import interrupt

def deep_in_a_step(how):
    if how == "segv":
        faulthandler._sigsegv()
    elif how == "abort":
        os.abort()
    os.kill(os.getpid(), signal.SIGKILL)

interrupt.enable_fault_file(interrupt.crash_dir(sys.argv[1]))
deep_in_a_step(sys.argv[2])
"""


def _die(run, how: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", DIE, str(run), how], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(("how", "sig"), [("segv", "SIGSEGV"), ("abort", "SIGABRT")])
def test_a_process_dying_by_a_fatal_signal_leaves_its_stack(tmp_path, how, sig):
    done = _die(tmp_path, how)
    assert done.returncode == -getattr(signal, sig), done.stderr
    [record] = leftovers(tmp_path)
    assert (record.role, record.how) == ("run", sig)
    assert record.path.name == f"faulthandler-run-{record.pid}.log"
    text = record.path.read_text()
    assert text.startswith("Fatal Python error: ")
    assert "in deep_in_a_step" in text  # a Python stack naming the function
    assert done.stderr == ""  # the stack went to the file, not to the console


def test_a_killed_process_leaves_an_empty_file_read_as_killed(tmp_path):
    done = _die(tmp_path, "kill")
    assert done.returncode == -signal.SIGKILL
    [record] = leftovers(tmp_path)
    assert record.how == "" and record.path.stat().st_size == 0
    line = crash_line("t", record, "profile", "profiling-agent resume t")
    assert line.startswith("run t was killed in step profile (SIGKILL or the out-of-memory killer")
    assert line.endswith("resume with `profiling-agent resume t`")


def test_a_clean_run_leaves_nothing_and_points_its_children_at_the_folder(tmp_path):
    before = faulthandler.is_enabled()
    with interrupt.fault_log(tmp_path) as path:
        assert path == tmp_path / "crash" / f"faulthandler-run-{os.getpid()}.log" and path.is_file()
        assert os.environ[interrupt.FAULT_DIR_ENV] == str(tmp_path / "crash")
        assert interrupt.fault_file_from_env() is None  # this process keeps its own file already
    assert not (tmp_path / "crash").exists()
    assert interrupt.FAULT_DIR_ENV not in os.environ
    assert faulthandler.is_enabled() == before
    assert leftovers(tmp_path) == [] and leftover_line(tmp_path, "t", "profile", "x") is None


def test_a_child_that_dies_by_sigsegv_is_raised_with_its_stack(tmp_path):
    with interrupt.fault_log(tmp_path):
        assert interrupt.run_in_child(os.getpid) > 0  # a child that ends cleanly leaves no file
        assert [p.name for p in (tmp_path / "crash").iterdir()] == [f"faulthandler-run-{os.getpid()}.log"]
        with pytest.raises(interrupt.ChildCrashed) as caught:
            interrupt.run_in_child(faulthandler._sigsegv)
    assert caught.value.how == "SIGSEGV"
    assert caught.value.fault_file.startswith(str(tmp_path / "crash" / "faulthandler-child-"))
    assert "in _child_main" in open(caught.value.fault_file).read()
    assert str(caught.value) == f"a child process died by SIGSEGV (stack in {caught.value.fault_file})"
    assert not isinstance(caught.value, Exception)  # a step's `except Exception` must not swallow it
    [record] = leftovers(tmp_path)  # the run's own file went with the block; the child's stays
    assert (record.role, record.how) == ("child", "SIGSEGV")
    copy = pickle.loads(pickle.dumps(caught.value))  # it crosses process boundaries like any error
    assert (copy.how, copy.fault_file) == (caught.value.how, caught.value.fault_file)


def test_resume_sets_the_records_aside_once_reported(tmp_path):
    folder = tmp_path / "crash"
    folder.mkdir()
    (folder / "faulthandler-run-11.log").write_text("Fatal Python error: Bus error\n\nCurrent thread 0x1:\n")
    (folder / "faulthandler-child-12.log").write_text("")  # a child stopped by its parent: no record
    (folder / "faulthandler-run-10.log").write_text("")
    found = leftovers(tmp_path)
    assert {(r.pid, r.how) for r in found} == {(11, "SIGBUS"), (10, "")}
    line = leftover_line(tmp_path, "t", "evaluate", "profiling-agent resume t")
    assert line == (
        f"run t died by SIGBUS in step evaluate: stack in {folder / 'faulthandler-run-11.log'}; "
        "resume with `profiling-agent resume t`"
    )
    assert set_aside(tmp_path) == [folder / "earlier" / "faulthandler-run-11.log"]
    assert leftovers(tmp_path) == [] and sorted(p.name for p in folder.iterdir()) == ["earlier"]


def test_a_childs_record_names_the_child():
    record = FaultRecord(interrupt.fault_path("/r/crash", "child", 7), "child", 7, "SIGILL")
    assert crash_line("t", record, "recover", "R").startswith("run t: a child process died by SIGILL in step recover")


def test_the_resume_line_names_where_the_stack_was_set_aside(tmp_path):
    folder = tmp_path / "crash"
    folder.mkdir()
    (folder / "faulthandler-child-5.log").write_text("Fatal Python error: Aborted\n")
    line = set_aside_line(tmp_path, "t", "quantize", "R")
    moved = folder / "earlier" / "faulthandler-child-5.log"
    assert line == f"run t: a child process died by SIGABRT in step quantize: stack in {moved}; resume with `R`"
    assert moved.is_file() and set_aside_line(tmp_path, "t", "", "R") is None
