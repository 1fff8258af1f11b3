"""The CLI with one step ended by a real SIGSEGV, for the tests of native crash reports.

`python crash_cli.py FUNCTION WHERE CLI-ARGS...` runs the CLI with the node function FUNCTION (its name in
graph/builder.py's STEPS: `profile`, `probe` ...) replaced by one that calls `faulthandler._sigsegv()`, in the CLI's own
process (WHERE "run") or in a child process it starts with `run_in_child` (WHERE "child"). `install(FUNCTION, WHERE)`
does the same replacement in a process that calls the CLI's `entry()` itself.
"""

from __future__ import annotations

import faulthandler
import sys
from typing import Any


def segfault_in_step() -> None:
    """Die by a real SIGSEGV (faulthandler's own test hook): the stack on record names this function."""
    faulthandler._sigsegv()


def crashing_node(where: str):
    """Return a node that dies by SIGSEGV here ("run") or in a child process started by `run_in_child` ("child")."""
    from profiling_agent.tools.interrupt import run_in_child

    def crashing_step(state: Any) -> dict[str, Any]:
        if where == "child":
            run_in_child(segfault_in_step)
        else:
            segfault_in_step()
        return {}

    return crashing_step


def crashing_steps(function: str, where: str):
    """Return `builder.step` with the node function named `function` (`profile`, `probe` ...) replaced."""
    from profiling_agent.graph import builder

    real = builder.step
    names = [name for name, path in builder.STEPS.items() if path.split(":")[1] == function]
    if not names:
        raise SystemExit(f"no node function {function} in graph/builder.py's STEPS")

    def step(name: str):
        return crashing_node(where) if name in names else real(name)

    return step


def install(function: str, where: str) -> None:
    """Make the graph's builder use the crashing node for `function` (before the CLI builds its graph).

    A `functools.partial` of it is the `prepare` of a forked CLI process (helpers.forked_cli), which then runs as
    this script would, without a fresh interpreter's imports.
    """
    from profiling_agent.graph import builder

    builder.step = crashing_steps(function, where)


if __name__ == "__main__":
    from profiling_agent.graph.cli.main import entry

    function, where, *argv = sys.argv[1:]
    install(function, where)
    sys.argv = [sys.argv[0], *argv]
    entry()
