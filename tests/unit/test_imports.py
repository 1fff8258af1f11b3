"""The house rule on imports inside functions: each one says why it cannot sit at the top of its module.

An import stays inside a function only where moving it to the module's top would pull a heavy library into a
module that a light entry point loads without it (`# lazy: ...`) or would close an import cycle (`# cycle: ...`);
the reason stands as a trailing comment on the statement.
"""

from __future__ import annotations

import ast
from pathlib import Path

from helpers.source_trees import ROOT, package_sources, parsed

MARKS = ("# lazy:", "# cycle:")


def _unmarked(path: Path) -> list[int]:
    """Return the line numbers of the in-function imports of `path` that carry no reason."""
    lines = path.read_text(encoding="utf-8").splitlines()
    found = set()
    for fn in ast.walk(parsed(path)):
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
    for path in package_sources():
        rel = path.relative_to(ROOT).as_posix()
        missing += [f"{rel}:{line}" for line in _unmarked(path)]
    assert not missing, "imports inside functions without a trailing '# lazy: ...' or '# cycle: ...': " + ", ".join(
        missing
    )
