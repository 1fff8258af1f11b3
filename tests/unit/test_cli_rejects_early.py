"""A rejected flag is named in one line before the CLI imports torch or transformers (seconds of imports)."""

from __future__ import annotations

import subprocess
import sys

import pytest

PROBE = """
import sys
from profiling_agent.graph.cli.main import entry
sys.argv = ["profiling-agent", *sys.argv[1:]]
try:
    code = entry()
except SystemExit as stop:
    code = stop.code
print("imported:", sorted(m for m in ("torch", "transformers") if m in sys.modules), "exit:", code)
"""


@pytest.mark.parametrize(
    "args, message",
    [(["run", "--iterations", "0"], "invalid --iterations"), (["run", "--max-acc-drop", "-1"], "--max-acc-drop")],
)
def test_a_rejected_flag_exits_2_in_one_line_without_importing_torch(args, message):
    done = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip().endswith("imported: [] exit: 2"), (done.stdout, done.stderr)
    errors = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and message in errors[0] and "Traceback" not in done.stderr, done.stderr
