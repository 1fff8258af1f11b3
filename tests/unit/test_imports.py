"""The house rule on imports inside functions: each one says why it cannot sit at the top of its module.

An import stays inside a function only where moving it to the module's top would pull a heavy library into a
module that a light entry point loads without it (`# lazy: ...`) or would close an import cycle (`# cycle: ...`);
the reason stands as a trailing comment on the statement.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCE_DIRS = ("schemas", "graph", "nodes", "tools", "prompts")
SOURCE_FILES = ("state.py", "__init__.py", "__main__.py")
MARKS = ("# lazy:", "# cycle:")


def _sources() -> Iterator[Path]:
    for name in SOURCE_FILES:
        if (ROOT / name).is_file():
            yield ROOT / name
    for folder in SOURCE_DIRS:
        yield from sorted((ROOT / folder).rglob("*.py"))


def _unmarked(path: Path) -> list[int]:
    """Return the line numbers of the in-function imports of `path` that carry no reason."""
    text = path.read_text()
    lines = text.splitlines()
    found = set()
    for fn in ast.walk(ast.parse(text)):
        if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for node in ast.walk(fn):
            if isinstance(node, ast.Import | ast.ImportFrom):
                span = lines[node.lineno - 1 : (node.end_lineno or node.lineno)]
                if not any(mark in line for line in span for mark in MARKS):
                    found.add(node.lineno)
    return sorted(found)


def test_every_import_inside_a_function_says_why():
    missing = []
    for path in _sources():
        rel = path.relative_to(ROOT).as_posix()
        missing += [f"{rel}:{line}" for line in _unmarked(path)]
    assert not missing, "imports inside functions without a trailing '# lazy: ...' or '# cycle: ...': " + ", ".join(
        missing
    )
