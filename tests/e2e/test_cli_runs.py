"""The CLI around runs: safe thread ids, help and version, a damaged database, read-only runs, running threads."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from profiling_agent.graph.cli.main import main


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "profiling_agent.graph.cli", *args]


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize("tid", ["../escape", "a/b", "..", ".hidden", "x/../../y", "/abs", "a\\b", "sp ace"])
def test_a_thread_id_that_is_no_plain_folder_name_is_refused(tid, tmp_path, capsys):
    runs = tmp_path / "runs"
    assert main(["run", "--thread-id", tid, "--run-dir", str(runs)]) == 2
    assert "invalid thread id" in _one_line(capsys.readouterr().err)
    assert main(["resume", tid, "--run-dir", str(runs)]) == 2
    assert "invalid thread id" in _one_line(capsys.readouterr().err)
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing written, inside or outside the run folder


def test_bare_command_prints_help_and_version_is_known(capsys):
    from profiling_agent import __version__

    assert main([]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: profiling-agent") and "resume" in out and "runs" in out
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out.strip() == f"profiling-agent {__version__}"


@pytest.mark.parametrize("content", [b"this is not a database" * 100, b"SQLite format 3\x00" + b"\xff" * 4000])
def test_a_damaged_checkpoint_database_is_named_in_one_line(content, tmp_path, capsys):
    db = tmp_path / "checkpoints.sqlite"
    db.write_bytes(content)
    for args in (["runs"], ["resume", "t1"], ["run", "--thread-id", "t2"]):
        assert main([*args, "--run-dir", str(tmp_path)]) == 1, args
        line = _one_line(capsys.readouterr().err)
        assert line.startswith("profiling-agent: error: checkpoint database") and str(db) in line, line
        assert f"`mv {db} {db}.damaged`" in line and f"`profiling-agent runs --run-dir {tmp_path}`" in line
        assert "resume with" not in line  # resuming needs the database that is broken
    assert db.read_bytes() == content  # left as it was, for the user to inspect or move aside
    os.replace(db, f"{db}.damaged")  # the advice works: the folder lists again, and a run may start afresh there
    assert main(["runs", "--run-dir", str(tmp_path)]) == 0
    assert _one_line(capsys.readouterr().err) == f"no runs in {tmp_path}"


# ------------------------------------------------------------------------------ a finished run, shared


def _read_only_prefix(folder: Path) -> list[str] | None:
    """A command prefix that runs a command with `folder` mounted read-only (None when that is impossible)."""
    script = 'mount --bind "$0" "$0" && mount -o remount,ro,bind "$0" "$0" && exec "$@"'
    for unshare in (["unshare", "-m"], ["unshare", "-rm"]):
        prefix = [*unshare, "sh", "-c", script, str(folder)]
        if shutil.which("unshare") and subprocess.run([*prefix, "true"], capture_output=True).returncode == 0:
            probe = subprocess.run([*prefix, "touch", str(folder / ".probe")], capture_output=True)
            if probe.returncode != 0:
                return prefix
    return None


@pytest.fixture(scope="module")
def finished(tmp_path_factory, quick_resnet):
    """A finished one-iteration run of the quick digits ResNet, in a folder any user may read.

    Its model cache holds copies of the session's quick ResNet and digits dataset with every mode kept (`copytree`
    copies them), so the modes checked are the ones the package gave them when it wrote them; whatever else the
    cache holds, the run writes.
    """
    from helpers.crash_helpers import offline_resnet_setup

    base = Path(tempfile.mkdtemp(prefix="finished-run-", dir=tmp_path_factory.getbasetemp()))
    written = quick_resnet[:2]  # the model and the dataset folders, each written once by the session fixture
    copies = [base / "cache" / path.relative_to(quick_resnet[2]) for path in written]
    for path, copy in zip(written, copies, strict=True):
        shutil.copytree(path, copy)
    model, dataset, runs, env = offline_resnet_setup(base, (*copies, base / "cache"))
    args = [
        "run", "--model", str(model), "--dataset", str(dataset), "--subset", "64", "--calibration", "16",
        "--test-subset", "32", "--iterations", "1", "--planner", "l2", "--ratio", "0.3", "--recover", "none",
        "--repeats", "2", "--threads", "1", "--backend", "torch", "--run-dir", str(runs), "--thread-id", "done1",
    ]  # fmt: skip
    with pytest.MonkeyPatch.context() as patch:  # the run in this process, with the environment a child would get
        for key, value in env.items():
            patch.setenv(key, value)
        for key in ("OPENAI_API_KEY", "OPENAI_BASE_URL"):
            patch.delenv(key, raising=False)
        assert main(args) == 0
    return base, runs, env


@pytest.mark.slow
def test_run_files_and_the_model_cache_are_readable_by_others(finished):
    base, runs, _ = finished
    old = os.umask(0o022)
    os.umask(old)
    assert old == 0o022
    closed = []
    for root in (runs, base / "cache"):
        for path in [root, *root.rglob("*")]:
            mode = stat.S_IMODE(path.lstat().st_mode)
            if path.is_symlink() or path.name.endswith(".lock") and ".locks" in path.parts:
                continue
            if mode & 0o044 != 0o044 or (path.is_dir() and mode & 0o011 != 0o011):
                closed.append(f"{oct(mode)} {path.relative_to(base)}")
    assert not closed, closed


# each command's exit code, stdout and stderr, captured at the descriptors as a process of its own would show them
COMMANDS_CHILD = """
import json, os, sys, tempfile
from profiling_agent.graph.cli.main import main


def captured(argv):
    sys.stdout.flush(), sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        os.dup2(out.fileno(), 1), os.dup2(err.fileno(), 2)
        try:
            code = main(argv)
        except SystemExit as exc:
            code = exc.code
        finally:
            sys.stdout.flush(), sys.stderr.flush()
            os.dup2(saved[0], 1), os.dup2(saved[1], 2)
            os.close(saved[0]), os.close(saved[1])
        texts = []
        for handle in (out, err):
            handle.seek(0)
            texts.append(handle.read().decode())
    return {"code": code, "out": texts[0], "err": texts[1]}


results = [captured(argv) for argv in json.loads(sys.argv[2])]
with open(sys.argv[1], "w") as handle:
    json.dump(results, handle)
"""


def _commands_in_one_process(prefix: list[str], env: dict[str, str], record: Path, *commands: list[str]):
    """Run CLI commands one after another in one process started with `prefix`; return their results in order."""
    child = [sys.executable, "-c", COMMANDS_CHILD, str(record), json.dumps(commands)]
    done = subprocess.run([*prefix, *child], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return [
        SimpleNamespace(returncode=r["code"], stdout=r["out"], stderr=r["err"]) for r in json.loads(record.read_text())
    ]


@pytest.mark.slow
def test_read_only_commands_work_on_a_read_only_run_folder(finished, tmp_path):
    base, runs, env = finished
    prefix = _read_only_prefix(runs)
    if prefix is None:
        if os.geteuid() == 0:
            pytest.skip("root writes through permissions, and `unshare -m` is not allowed here: no read-only folder")
        prefix = []
        subprocess.run(["chmod", "-R", "a-w", str(runs)], check=True)
    try:
        listed, again, report, exported, new = _commands_in_one_process(
            prefix,
            env,
            tmp_path / "results.json",
            ["runs", "--run-dir", str(runs)],
            ["resume", "done1", "--run-dir", str(runs)],
            ["report", str(runs / "done1")],
            ["export", str(runs / "done1"), "--out", str(tmp_path / "onnx")],
            ["run", "--run-dir", str(runs), "--thread-id", "more"],
        )
        assert listed.returncode == 0 and "done1" in listed.stdout and "done" in listed.stdout, listed.stderr
        assert again.returncode == 0 and "already finished" in again.stderr and "best:" in again.stdout, again.stderr
        assert report.returncode == 2 and str(runs / "done1") in _one_line(report.stderr), report.stderr
        assert exported.returncode == 0 and (tmp_path / "onnx" / "model.onnx").is_file(), exported.stderr
        assert new.returncode == 2 and str(runs) in _one_line(new.stderr), new.stderr
    finally:
        subprocess.run(["chmod", "-R", "u+w", str(runs)], check=True)


@pytest.mark.slow
def test_runs_calls_a_thread_held_by_a_live_process_running(finished, capsys):
    from profiling_agent.graph.checkpoint import open_checkpointer
    from profiling_agent.graph.thread_lock import thread_lock

    _, runs, _ = finished
    saver = open_checkpointer(runs)
    try:
        with thread_lock(saver, runs, "done1"):  # held by this process: `runs` peeks through a descriptor of its own
            assert main(["runs", "--run-dir", str(runs)]) == 0, capsys.readouterr().err
            held = capsys.readouterr().out
            row = next(line for line in held.splitlines() if line.startswith("done1"))
            assert f"running (pid {os.getpid()}" in row and "interrupted" not in row, row
            # the peek never refuses a runner that starts at that moment: the lock is free again at once
        assert main(["runs", "--run-dir", str(runs)]) == 0
        row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("done1"))
        assert "running" not in row and " done " in f" {row} ", row
    finally:
        saver.conn.close()
