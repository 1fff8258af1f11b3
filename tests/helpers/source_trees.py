"""The repository's Python files parsed once per test process, for the tests that check the code itself."""

from __future__ import annotations

import ast
import functools
from pathlib import Path


@functools.cache
def parsed(path: Path) -> ast.Module:
    """Return the syntax tree of `path`, parsed on the first call in this process (callers only read it)."""
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
