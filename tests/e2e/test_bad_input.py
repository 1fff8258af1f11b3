"""Every row of docs/errors.md's "Bad input" table: one line on stderr, exit 2, no traceback, no half-made thread."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from profiling_agent.graph.cli.main import main

# a thread that pauses for approval: acquire, profile and the sensitivity probe of a tiny model (seconds)
PAUSED = "paused"


@pytest.fixture(scope="module")
def assets(tmp_path_factory, digits_vit):
    """The session's digits ViT, the digits dataset and broken variants of both."""
    from datasets import ClassLabel, load_from_disk
    from transformers import BertConfig, BertModel

    root = tmp_path_factory.mktemp("bad-input")
    digits, model = digits_vit.dataset, digits_vit.model
    test = load_from_disk(str(digits))["test"]
    no_image = root / "no-image"
    test.remove_columns("image").save_to_disk(str(no_image))
    words = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
    unmappable = root / "unmappable"
    test.cast_column("label", ClassLabel(names=words)).save_to_disk(str(unmappable))
    bert = root / "bert"
    BertModel(
        BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32)
    ).save_pretrained(bert)
    runs = root / "runs"
    fast = ["--subset", "48", "--calibration", "8", "--test-subset", "32", "--repeats", "2", "--threads", "1",
            "--backend", "torch", "--run-dir", str(runs)]  # fmt: skip
    code = main(["run", "--model", str(model), "--dataset", str(digits), "--planner", "deterministic",
                 "--iterations", "1", "--approve", "--thread-id", PAUSED, *fast])  # fmt: skip
    assert code == 0
    return {
        "root": root, "model": str(model), "digits": str(digits), "no_image": str(no_image),
        "unmappable": str(unmappable), "bert": str(bert), "runs": runs, "fast": fast,
    }  # fmt: skip


def one_line_error(capfd, args: list[str]) -> str:
    """Run the CLI in-process; assert exit code 2 and exactly one stderr line, no traceback; return the line."""
    try:
        code = main(args)
    except SystemExit as exc:  # argparse's own errors (unknown choice, missing value)
        code = exc.code
    out, err = capfd.readouterr()
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, err
    assert len(lines) == 1, err
    assert "Traceback" not in out + err
    return lines[0]


def _thread_ids(runs: Path) -> list[str]:
    from profiling_agent.graph.checkpoint import open_checkpointer, thread_ids

    saver = open_checkpointer(runs)
    try:
        return thread_ids(saver)
    finally:
        saver.conn.close()


# ------------------------------------------------------------------ model and dataset


@pytest.mark.slow
@pytest.mark.parametrize(
    "case, needle",
    [
        ("no_model", "cannot fetch hub model no-such-org/no-such-model: offline mode is on"),
        ("bert", "is not an image classifier: model type 'bert'"),
        ("no_dataset_hub", "cannot fetch hub dataset no-such-org/no-such-dataset: offline mode is on"),
        ("wrong_split", "split 'validation' not found"),
        ("no_image", "no image column found"),
        ("wrong_label_column", "label column 'digit' not in the dataset"),
        ("unmappable", "dataset classes match no model label"),
    ],
)
def test_refused_model_or_dataset_leaves_no_thread(assets, capfd, monkeypatch, case, needle):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model, dataset, extra = assets["model"], assets["digits"], []
    if case == "no_model":
        model = "no-such-org/no-such-model"
    elif case == "bert":
        model = assets["bert"]
    elif case == "no_dataset_hub":
        dataset = "no-such-org/no-such-dataset"
    elif case == "wrong_split":
        extra = ["--split", "validation"]
    elif case == "no_image":
        dataset = assets["no_image"]
    elif case == "wrong_label_column":
        extra = ["--label-column", "digit"]
    elif case == "unmappable":
        dataset = assets["unmappable"]
    thread = f"bad-{case}"
    args = ["run", "--model", model, "--dataset", dataset, *extra, "--thread-id", thread, *assets["fast"]]
    line = one_line_error(capfd, args)
    assert line.startswith("profiling-agent: error: ") and needle in line, line
    assert thread not in _thread_ids(assets["runs"]) and not (assets["runs"] / thread).exists()
    assert needle in one_line_error(capfd, args)  # the same thread id can be tried again


def test_missing_dataset_path(tmp_path, capfd):
    line = one_line_error(capfd, ["run", "--dataset", "./no-such-dataset", "--run-dir", str(tmp_path)])
    assert line == "profiling-agent: error: dataset path not found: ./no-such-dataset"


@pytest.mark.slow
def test_unreachable_hub_is_one_line(tmp_path):
    """Not offline, but the hub does not answer (a closed local port stands in for no network)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed once the block ends: connections are refused at once
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env.update(HF_ENDPOINT=f"http://127.0.0.1:{port}", HF_HOME=str(tmp_path / "hf"))
    cmd = [sys.executable, "-m", "profiling_agent.graph.cli", "run", "--model", "no-such-org/no-such-model",
           "--run-dir", str(tmp_path / "runs")]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and "the hub is unreachable" in lines[0] and "not in the local cache" in lines[0], lines
    assert "Traceback" not in proc.stderr + proc.stdout


# ------------------------------------------------------------------ objective values and run folder


@pytest.mark.parametrize(
    "flag, value",
    [
        ("--target-reduction", "1.5"),
        ("--target-reduction", "0"),
        ("--max-acc-drop", "150"),
        ("--iterations", "51"),
        ("--subset", "0"),
        ("--calibration", "1"),
        ("--ratio", "0.3"),  # only for the l1/l2/random baselines
        ("--threads", "0"),
        ("--repeats", "0"),
        ("--recover-batch", "0"),
        ("--recover-lr", "0"),
        ("--recover-steps", "-1"),
        ("--recover-minutes", "-1"),
    ],
)
def test_out_of_range_values(tmp_path, capfd, flag, value):
    line = one_line_error(capfd, ["run", flag, value, "--run-dir", str(tmp_path)])
    assert line.startswith("profiling-agent: error: invalid ") and flag in line, line
    assert not (tmp_path / "checkpoints.sqlite").exists()  # refused before any thread is made


def test_unwritable_run_dir(tmp_path, capfd):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    line = one_line_error(capfd, ["run", "--run-dir", str(blocker / "runs")])
    assert "is not writable" in line and str(blocker / "runs") in line


# ------------------------------------------------------------------ plan files, resume


@pytest.mark.slow
@pytest.mark.parametrize(
    "content, needle",
    [
        (None, "plan file not found"),
        ("{not json", "not JSON"),
        ("[1, 2]", "plan: Input should be a valid dictionary"),
        ({"pruning": [{"layer": "mlp", "type": "structured", "ratio": 1.5}]}, "pruning.0.ratio"),
        ({"pruning": [{"layer": "mlp", "type": "channels", "ratio": 0.3}]}, "pruning.0.type"),
        ({"pruning": [{"layer": "a" * 201, "type": "structured", "ratio": 0.3}]}, "1..200 characters"),
        ({"pruning": [{"layer": "(a+)+$", "type": "structured", "ratio": 0.3}]}, "catastrophically"),
        ({"pruning": [{"layer": "no_such_layer", "type": "structured", "ratio": 0.3}]}, "matches no structured"),
        ({"pruning": [{"layer": "classifier", "type": "structured", "ratio": 0.3}]}, "matches protected module"),
        ({"pruning": [], "quantization": []}, "the plan is empty"),
        ({"plan": {"pruning": "all of it"}}, "pruning: Input should be a valid list"),
    ],
)
def test_malformed_plan_file(assets, capfd, tmp_path, content, needle):
    plan = tmp_path / "plan.json"
    if content is not None:
        plan.write_text(content if isinstance(content, str) else json.dumps(content))
    args = ["resume", PAUSED, "--run-dir", str(assets["runs"]), "--decision", "edit", "--plan", str(plan)]
    line = one_line_error(capfd, args)
    assert needle in line, line
    assert "waiting for approval" in one_line_error(capfd, ["resume", PAUSED, "--run-dir", str(assets["runs"])])


@pytest.mark.slow
def test_resume_unknown_thread(assets, capfd):
    line = one_line_error(capfd, ["resume", "no-such-thread", "--run-dir", str(assets["runs"])])
    assert "unknown thread no-such-thread" in line


@pytest.mark.slow
@pytest.mark.parametrize(
    "extra, needle",
    [
        (["--model", "other"], "--model cannot change them"),
        (["--iterations", "3", "--approve"], "--approve, --iterations cannot change them"),
        (["--trust-remote-code"], "--trust-remote-code cannot change them"),
        (["--plan", "x.json"], "--plan goes with --decision edit"),
        (["--decision", "approve", "--plan", "x.json"], "--plan goes with --decision edit"),
        (["--decision", "edit"], "--decision edit needs --plan"),
        (["--decision", "maybe"], "invalid choice"),
        ([], "waiting for approval of iteration 1's plan"),
        (["--threads", "0"], "invalid --threads"),
    ],
)
def test_resume_with_conflicting_arguments(assets, capfd, extra, needle):
    line = one_line_error(capfd, ["resume", PAUSED, "--run-dir", str(assets["runs"]), *extra])
    assert needle in line, line


@pytest.mark.slow
def test_decision_for_a_thread_that_is_not_waiting(assets, capfd):
    runs, thread = str(assets["runs"]), "finished"
    args = ["run", "--model", assets["model"], "--dataset", assets["digits"], "--planner", "deterministic",
            "--iterations", "1", "--approve", "--thread-id", thread, *assets["fast"]]  # fmt: skip
    assert main(args) == 0
    assert main(["resume", thread, "--run-dir", runs, "--decision", "reject"]) == 0  # ends the one-iteration run
    out, _ = capfd.readouterr()
    assert "rejected" in out and "stopped: iteration bound reached (1)" in out
    line = one_line_error(capfd, ["resume", thread, "--run-dir", runs, "--decision", "approve"])
    assert f"thread {thread} is not waiting for approval (it has nothing left to run)" in line
