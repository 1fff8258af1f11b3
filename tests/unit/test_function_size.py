"""The house rule on function size, checked on the source: no package function over 80 lines."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from helpers.source_trees import ROOT, package_sources, parsed

MAX_FUNCTION_LINES = 80  # from `def` (decorators not counted) to the last line, docstring included
# Known exceptions, each with its length today; a length here may only shrink, and the entry goes once it fits.
ALLOWED: dict[str, int] = {}


def _functions(tree: ast.AST, prefix: str = "") -> Iterator[tuple[str, int]]:
    """Yield (qualified name, lines) of every function and method in `tree`, nested ones included."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield f"{prefix}{node.name}", (node.end_lineno or node.lineno) - node.lineno + 1
            yield from _functions(node, f"{prefix}{node.name}.")
        elif isinstance(node, ast.ClassDef):
            yield from _functions(node, f"{prefix}{node.name}.")
        else:
            yield from _functions(node, prefix)


def _lengths() -> dict[str, int]:
    out = {}
    for path in package_sources():
        rel = path.relative_to(ROOT).as_posix()
        out.update({f"{rel}:{name}": n for name, n in _functions(parsed(path))})
    assert len(out) > 1000, "the walk found too few functions: is ROOT the repository root?"
    return out


def test_no_package_function_over_80_lines():
    lengths = _lengths()
    too_long = {name: n for name, n in lengths.items() if n > MAX_FUNCTION_LINES and name not in ALLOWED}
    assert not too_long, too_long


def test_the_allowed_long_functions_only_shrink():
    lengths = _lengths()
    grown = {name: (lengths.get(name), n) for name, n in ALLOWED.items() if lengths.get(name, 0) > n}
    assert not grown, grown


def test_the_walk_finds_methods_and_nested_functions():
    tree = ast.parse("class A:\n    def f(self):\n        def g():\n            pass\n\n        return g\n")
    assert dict(_functions(tree)) == {"A.f": 5, "A.f.g": 2}
