"""The repository's Python files parsed once per test process, for the tests that check the code itself."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository root, which is the package
PACKAGE_DIRS = ("schemas", "graph", "nodes", "tools", "prompts")
PACKAGE_FILES = ("state.py", "__init__.py", "__main__.py")


@functools.cache
def parsed(path: Path) -> ast.Module:
    """Return the syntax tree of `path`, parsed on the first call in this process (callers only read it)."""
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def package_sources() -> list[Path]:
    """Return the package's Python files: the top-level modules, then every file of its folders, sorted."""
    top = [ROOT / name for name in PACKAGE_FILES if (ROOT / name).is_file()]
    return top + [path for folder in PACKAGE_DIRS for path in sorted((ROOT / folder).rglob("*.py"))]
