"""Work for spawned child processes, in a module that imports nothing heavy: a spawned child imports the module
its work is defined in, and a test file's own imports (torch) would cost each child seconds."""

from __future__ import annotations

import os


def ends_by(signum: int) -> None:
    """End this process with `signum` (what a Ctrl-C or a kill does to a spawned child)."""
    os.kill(os.getpid(), signum)
