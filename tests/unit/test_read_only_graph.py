"""The graph built to read checkpoints: the same state and pending steps as the full graph, without importing a step.

`profiling-agent runs` and a resume in a read-only folder only read states; importing the steps (torch, transformers,
the runtimes) cost them about 10 CPU-seconds a call.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from profiling_agent.graph.builder import STEPS, build_graph
from profiling_agent.graph.checkpoint import close_checkpointer, open_checkpointer, thread_ids

DATA = Path(__file__).resolve().parents[1] / "data"
HEAVY = ("torch", "transformers", "openvino", "onnxruntime")


@pytest.fixture
def stored_run(tmp_path) -> Path:
    """A run folder holding a stored checkpoint of a thread stopped mid-run."""
    shutil.copy(DATA / "checkpoint_state_package.sqlite", tmp_path / "checkpoints.sqlite")
    return tmp_path


def test_the_read_only_graph_reads_what_the_full_graph_reads(stored_run):
    saver = open_checkpointer(stored_run)
    try:
        (thread,) = thread_ids(saver)
        config = {"configurable": {"thread_id": thread}}
        full = build_graph(checkpointer=saver).get_state(config)
        light = build_graph(checkpointer=saver, read_only=True).get_state(config)
    finally:
        close_checkpointer(saver)
    assert light.values == full.values and light.values
    assert light.next == full.next and [t.name for t in light.tasks] == [t.name for t in full.tasks]
    assert set(build_graph(read_only=True).get_graph().nodes) == set(build_graph().get_graph().nodes) >= set(STEPS)


def test_a_read_only_graph_runs_no_step():
    with pytest.raises(RuntimeError, match="read checkpoints"):
        build_graph(read_only=True).invoke({"model": "embedded:vit-digits"})


def test_runs_lists_a_stored_thread_without_importing_a_step(stored_run):
    code = (
        "import sys\n"
        "from profiling_agent.graph.cli.main import main\n"
        "code = main(['runs', '--run-dir', sys.argv[1]])\n"
        f"print('imported:', sorted(m for m in {HEAVY!r} if m in sys.modules), code)\n"
    )
    done = subprocess.run([sys.executable, "-c", code, str(stored_run)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "imported: [] 0" in done.stdout, done.stdout + done.stderr
    # the stored thread's row, read from typed records (a pre-split checkpoint's `runs` once failed on them)
    (row,) = [line for line in done.stdout.splitlines() if line.startswith("state-package")]
    assert "embedded:vit-digits" in row and "1/" in row
