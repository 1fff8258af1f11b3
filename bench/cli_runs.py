"""Run `profiling-agent ARGV` for a benchmark: in a fresh process, or in this one for a smoke test's short runs."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys


def run_cli(argv: list[str], in_process: bool = False) -> tuple[int, str]:
    """Run `profiling-agent ARGV`; return its exit code and stderr.

    A fresh process by default. `in_process` runs the CLI's main in this process instead: a smoke test's runs are
    seconds long, and a fresh process would spend longer importing the libraries than running.
    """
    if not in_process:
        cmd = [sys.executable, "-m", "profiling_agent.graph.cli", *argv]
        done = subprocess.run(
            cmd, capture_output=True, text=True, env={**os.environ, "TRANSFORMERS_VERBOSITY": "error"}
        )
        return done.returncode, done.stderr
    from profiling_agent.graph.cli.main import main as cli_main

    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code = cli_main(argv)
    return code, err.getvalue()
