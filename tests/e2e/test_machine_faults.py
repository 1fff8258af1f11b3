"""Faults of the machine stop a run in one named line; OpenVINO's telemetry stays off; children never print a stop.

A full disk, a full quota or a failing disk (ENOSPC, EDQUOT, EIO) while a file is written raises
`tools.io.MachineFault`, which names the file and which no "record the failure and go on" step swallows: a form
that cannot be written stops the run (exit 1, the resume command) instead of becoming a failed form.
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from profiling_agent.tools import io
from profiling_agent.tools.io import MachineFault, atomic_dir, write_atomic, write_json_atomic

REPO = Path(__file__).resolve().parents[2]


def _child_env(home: Path) -> dict[str, str]:
    path = os.pathsep.join([str(REPO / "tests"), *sys.path])
    env = {**os.environ, "HOME": str(home), "PYTHONPATH": path}
    for key in ("NNCF_CI", "NNCF_DEV", "CI", "TF_BUILD", "JENKINS_URL"):  # nothing else may switch telemetry off
        env.pop(key, None)
    return env


# ------------------------------------------------------------------------------------------- writes


def test_a_full_disk_under_a_write_names_the_file_it_was_writing(tmp_path, monkeypatch):
    def full(fd):  # the data went to the page cache; the disk refuses it at fsync, naming no file
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(MachineFault) as caught:
        write_json_atomic(tmp_path / "iter_01" / "recipe.json", {"a": 1})
    assert caught.value.errno == errno.ENOSPC and caught.value.filename == str(tmp_path / "iter_01" / "recipe.json")
    assert str(caught.value) == f"could not write a run file (No space left on device): {caught.value.filename}"
    assert not isinstance(caught.value, Exception)  # `except Exception` in a step never swallows it
    assert os.listdir(tmp_path / "iter_01") == []  # no temp file left behind


def test_a_cache_write_and_other_errors_stay_oserrors_naming_the_file(tmp_path):
    def write(handle):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # the handle's write names no file

    with pytest.raises(OSError) as caught:  # a rebuildable cache (durable=False): its owner decides
        write_atomic(tmp_path / "shard.npy", write, durable=False)
    assert caught.value.filename == str(tmp_path / "shard.npy")

    def denied(handle):
        raise OSError(errno.EACCES, os.strerror(errno.EACCES))

    with pytest.raises(OSError) as caught:
        write_atomic(tmp_path / "x.json", denied)
    assert not isinstance(caught.value, MachineFault) and caught.value.filename == str(tmp_path / "x.json")


@pytest.mark.parametrize("code", [errno.EDQUOT, errno.EIO])
def test_a_folder_written_in_place_names_its_file_not_the_staged_copy(tmp_path, code):
    target = tmp_path / "best"
    with pytest.raises(MachineFault) as caught, atomic_dir(target) as staged:
        raise OSError(code, os.strerror(code), str(staged / "model.safetensors"))
    assert caught.value.errno == code and caught.value.filename == str(target / "model.safetensors")
    assert not target.exists() and os.listdir(tmp_path) == []


def test_a_library_error_that_only_says_the_disk_is_full_is_a_fault(tmp_path):
    try:
        raise RuntimeError("Exception from src/core/src/pass/serialize.cpp: No space left on device")
    except RuntimeError as exc:
        with pytest.raises(MachineFault) as caught:
            io.machine_fault(exc, tmp_path / "ov_int8", "could not write the ov_int8 form")
    assert str(caught.value) == f"could not write the ov_int8 form (No space left on device): {tmp_path / 'ov_int8'}"
    io.machine_fault(RuntimeError("logits differ from torch"), tmp_path)  # any other failure: no fault


# ------------------------------------------------------------------------------------------- forms


def _tiny_model():
    from helpers.tiny import family_model as _model
    from helpers.tiny import random_pixels as _pixels

    model, size = _model("resnet")
    return model, _pixels(16, size)


def test_a_form_that_cannot_be_written_stops_instead_of_failing(tmp_path, monkeypatch):
    pytest.importorskip("onnxruntime")
    from profiling_agent.tools.runtimes import onnx_forms
    from profiling_agent.tools.runtimes.forms import build_forms

    model, x = _tiny_model()
    real = io.write_atomic

    def full_disk(path, write, **kw):
        if "ort_dynamic" in str(path):
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real(path, write, **kw)

    monkeypatch.setattr(io, "write_atomic", full_disk)
    with pytest.raises(MachineFault) as caught:
        build_forms(model, x[:8], x[8:], tmp_path, forms=["ort_fp32", "ort_dynamic"], threads=1)
    assert str(caught.value) == (
        f"could not write the ort_dynamic form (No space left on device): {tmp_path / 'ort_dynamic' / 'recipe.json'}"
    )
    monkeypatch.setattr(io, "write_atomic", real)
    monkeypatch.setattr(onnx_forms, "quantize_onnx", lambda *a, **k: (_ for _ in ()).throw(ValueError("bad op")))
    built = build_forms(model, x[:8], x[8:], tmp_path, forms=["ort_fp32", "ort_dynamic"], threads=1)
    assert [(v.name, v.status) for v in built] == [("ort_fp32", "ok"), ("ort_dynamic", "failed")]  # others go on


def test_an_openvino_form_that_cannot_be_written_stops(tmp_path, monkeypatch):
    pytest.importorskip("openvino")
    pytest.importorskip("onnxruntime")
    from profiling_agent.tools.runtimes import openvino_forms
    from profiling_agent.tools.runtimes.forms import build_forms

    model, x = _tiny_model()

    def full_disk(ov_model, folder):
        raise OSError(errno.EIO, os.strerror(errno.EIO), str(folder / "openvino_model.bin"))

    monkeypatch.setattr(openvino_forms, "_save", full_disk)
    with pytest.raises(MachineFault) as caught:
        build_forms(model, x[:8], x[8:], tmp_path, forms=["ov_fp32"], threads=1)
    assert caught.value.errno == errno.EIO
    assert caught.value.filename == str(tmp_path / "ov_fp32" / "openvino_model.bin")


@pytest.mark.slow
def test_a_full_disk_while_forms_are_written_ends_the_run_with_exit_1_and_the_file(
    tmp_path, quick_resnet, monkeypatch, capsys
):
    from helpers.crash_helpers import THREAD, offline_resnet_setup, quick_flags, snapshot

    from profiling_agent.graph.cli.main import main
    from profiling_agent.graph.review import pending_nodes

    model, dataset, runs, env = offline_resnet_setup(tmp_path, quick_resnet)
    monkeypatch.setenv("PROFILING_AGENT_CACHE", env["PROFILING_AGENT_CACHE"])
    real = io.write_atomic

    def full_disk(path, write, **kw):
        if "ort_dynamic" in str(path):
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real(path, write, **kw)

    monkeypatch.setattr(io, "write_atomic", full_disk)
    few = ["--subset", "48", "--calibration", "8"]  # few images: the run stops at the baseline's forms
    flags = quick_flags(
        model, dataset, runs, "--planner", "l2", "--ratio", "0.3", "--recover", "none", "--backend", "onnxruntime", *few
    )
    assert main(["run", *flags]) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[-1].startswith("profiling-agent: error: could not write the ort_dynamic form (No space left on ")
    assert "/ort_dynamic/recipe.json" in lines[-1] and lines[-1].endswith(
        f"(then resume with `profiling-agent resume {THREAD} --run-dir {runs}`)"
    )
    assert "Traceback" not in "\n".join(lines)
    assert pending_nodes(snapshot(runs)) != ()  # stopped, not delivered around the form
    assert not (runs / THREAD / "result.json").exists()


# ------------------------------------------------------------------------------------------- telemetry


TELEMETRY_CHILD = """
import os, socket, sys
log = os.path.join(os.environ["HOME"], "connections.log")

def connect(self, address):  # fork children inherit it: every connection attempt of the process tree is logged
    with open(log, "a") as handle:
        handle.write(f"{os.getpid()} {address}\\n")
    raise OSError("the test allows no network")

socket.socket.connect = connect
socket.socket.connect_ex = lambda self, address: connect(self, address)
from helpers.tiny import family_model as _model
from helpers.tiny import random_pixels as _pixels
from profiling_agent.tools.runtimes.forms import build_forms
model, size = _model("resnet")
x = _pixels(16, size)
built = build_forms(model, x[:8], x[8:], sys.argv[1], forms=["ov_fp32", "ov_int8"], threads=1)
assert [v.status for v in built] == ["ok", "ok", "ok"], [v.error for v in built]
import nncf  # noqa: F401 - NNCF sets its telemetry up on import
try:
    import openvino_telemetry  # noqa: F401 - blocked by the package
except ImportError:
    print("telemetry blocked")
"""


def test_openvino_and_nncf_write_nothing_under_home_and_open_no_connection(tmp_path):
    pytest.importorskip("openvino")
    pytest.importorskip("nncf")
    home = tmp_path / "home"
    home.mkdir()
    script = tmp_path / "child.py"
    script.write_text(textwrap.dedent(TELEMETRY_CHILD))
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "forms")],
        env=_child_env(home),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "forms" / "ov_int8" / "openvino_model.xml").is_file()
    assert not (home / "intel").exists(), sorted(p.name for p in (home / "intel").iterdir())
    assert not (home / "connections.log").exists(), (home / "connections.log").read_text()
    assert done.stdout.strip() == "telemetry blocked"


def test_the_cli_turns_telemetry_off_before_anything_imports_openvino():
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from profiling_agent.graph.cli.main import main; main(['runs', "
            "'--run-dir', sys.argv[1]]); from profiling_agent.tools.runtimes.telemetry import telemetry_disabled; "
            "assert telemetry_disabled()",
            "/nonexistent-runs",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]


# ------------------------------------------------------------------------------------------- children and Ctrl-C


SIGNAL_CHILD = """
import multiprocessing, sys, threading, time
from profiling_agent.tools import interrupt


def sleeper():
    time.sleep(60)


def step(results):  # a node's step in LangGraph's worker thread, waiting on a spawned child
    try:
        interrupt.run_in_child(sleeper)
    except BaseException as exc:
        results.append(type(exc).__name__)


if __name__ == "__main__":
    forked = multiprocessing.get_context("fork").Process(target=sleeper)
    results = []
    worker = threading.Thread(target=step, args=(results,))
    with interrupt.stop_on_signals():  # as the CLI: the stop request lasts while the steps wind down
        try:
            forked.start()
            worker.start()
            print("ready", flush=True)
            time.sleep(60)
        except KeyboardInterrupt as exc:
            print(f"interrupted: {exc}", file=sys.stderr)
        forked.join(10)
        worker.join(30)
    print(f"forked child exit {forked.exitcode}; spawned child {results}", flush=True)
"""


@pytest.mark.parametrize("delay", [0.0, 4.0])  # while the spawned child starts, and once it runs
def test_ctrl_c_reaches_the_children_of_a_run_without_a_traceback(tmp_path, delay):
    script = tmp_path / "signals.py"
    script.write_text(textwrap.dedent(SIGNAL_CHILD))
    proc = subprocess.Popen(
        [sys.executable, str(script)],
        env=_child_env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    time.sleep(delay)
    os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C does: the whole foreground process group
    out, err = proc.communicate(timeout=60)
    assert "Traceback" not in err and err.strip().splitlines() == ["interrupted: SIGINT"], err
    assert f"forked child exit {-signal.SIGINT}; spawned child ['Interrupted']" in out  # default action


@pytest.mark.slow
def test_ctrl_c_while_the_baseline_forms_are_measured_prints_one_line(tmp_path, quick_resnet):
    """The run is a process of its own leading its process group, forked with the libraries already imported."""
    from helpers.crash_helpers import THREAD, cli, next_is, offline_resnet_setup, quick_flags, snapshot, start_forked

    model, dataset, runs, env = offline_resnet_setup(tmp_path, quick_resnet)
    flags = quick_flags(model, dataset, runs, "--planner", "l2", "--ratio", "0.3", "--recover", "none")
    run = cli("run", *flags, "--backend", "openvino")
    proc = start_forked(run, {**env, "HOME": str(tmp_path)}, tmp_path, start_new_session=True)
    int8 = runs / THREAD / "baseline_forms" / "ov_int8" / "recipe.json"  # the step's last form, built before timing
    deadline = time.monotonic() + 600
    while proc.poll() is None and time.monotonic() < deadline:
        snap = snapshot(runs) if int8.is_file() else None
        if snap is not None and next_is("measure_baseline")(snap):
            break
        time.sleep(0.05)
    assert proc.poll() is None, proc.communicate()[1][-3000:]  # inside the step: forms converted and quantized
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the whole process group
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 130 and "Traceback" not in err, err[-3000:]
    assert (
        err.strip().splitlines()[-1] == f"interrupted: resume with `profiling-agent resume {THREAD} --run-dir {runs}`"
    )
    assert not (tmp_path / "intel").exists()  # HOME: no telemetry file from the run or its children
