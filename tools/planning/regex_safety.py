"""Static and timed checks that an untrusted module-name regex cannot backtrack catastrophically."""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
from typing import Any

from profiling_agent.state import MAX_REGEX_LEN

logger = logging.getLogger(__name__)

if sys.version_info >= (3, 11):
    import re._constants as _sre
    import re._parser as _sre_parse
else:  # pragma: no cover - Python 3.10
    import sre_constants as _sre
    import sre_parse as _sre_parse

_REPEATS = {_sre.MAX_REPEAT, _sre.MIN_REPEAT}
_POSSESSIVE = getattr(_sre, "POSSESSIVE_REPEAT", None)
_MAX_UNBOUNDED = 6  # more unbounded quantifiers than this in one module-name regex is suspicious


# ---------------------------------------------------------------- regex safety


def _first_chars(items: list[Any]) -> set[int] | None:
    """Return the set of characters a subpattern can start with, or None when unknown or possibly empty."""
    for op, av in items:
        if op in (_sre.AT, _sre.ASSERT, _sre.ASSERT_NOT):
            continue
        if op is _sre.LITERAL:
            return {av}
        if op is _sre.IN:
            return _class_chars(av)
        if op is _sre.SUBPATTERN:
            return _first_chars(list(av[-1]))
        if op is _sre.BRANCH:
            sets = [_first_chars(list(b)) for b in av[1]]
            known = [s for s in sets if s is not None]
            return None if len(known) < len(sets) else set().union(*known)
        if op in _REPEATS or op is _POSSESSIVE:
            return _first_chars(list(av[2])) if av[0] > 0 else None
        return None
    return None


def _class_chars(items: list[Any]) -> set[int] | None:
    chars: set[int] = set()
    for op, av in items:
        if op is _sre.LITERAL:
            chars.add(av)
        elif op is _sre.RANGE and av[1] - av[0] < 4096:
            chars.update(range(av[0], av[1] + 1))
        elif op is _sre.CATEGORY and av is _sre.CATEGORY_DIGIT:
            chars.update(range(48, 58))
        else:
            return None
    return chars


def _has_variable_repeat(items: list[Any]) -> bool:
    for op, av in items:
        if op in _REPEATS and av[0] != av[1]:
            return True
        if any(_has_variable_repeat(sub) for sub in _children(op, av)):
            return True
    return False


def _children(op: Any, av: Any) -> list[list[Any]]:
    if op in _REPEATS or op is _POSSESSIVE:
        return [list(av[2])]
    if op is _sre.SUBPATTERN:
        return [list(av[-1])]
    if op in (_sre.ASSERT, _sre.ASSERT_NOT):
        return [list(av[1])]
    if op is _sre.BRANCH:
        return [list(b) for b in av[1]]
    if op is getattr(_sre, "ATOMIC_GROUP", None):
        return [list(av)]
    if op is _sre.GROUPREF_EXISTS:
        return [list(b) for b in av[1:] if b is not None]
    return []


def _overlapping_branches(items: list[Any]) -> bool:
    for op, av in items:
        if op is _sre.SUBPATTERN:
            return _overlapping_branches(list(av[-1]))
        if op is _sre.BRANCH:
            sets = [_first_chars(list(b)) for b in av[1]]
            known = [s for s in sets if s is not None]
            if len(known) < len(sets):
                return True
            return any(known[i] & known[j] for i in range(len(known)) for j in range(i + 1, len(known)))
    return False


def _walk_problems(items: list[Any], counts: dict[str, int]) -> str | None:
    for op, av in items:
        if op in (_sre.GROUPREF, _sre.GROUPREF_EXISTS):
            return "backreferences are not allowed"
        if op in _REPEATS:
            high, body = av[1], list(av[2])
            unbounded = high == _sre.MAXREPEAT
            counts["unbounded"] += int(unbounded)
            if (unbounded or high > 16) and _has_variable_repeat(body):
                return "nested quantifiers such as (a+)+ or (.*)* can backtrack catastrophically"
            if (unbounded or high > 16) and _overlapping_branches(body):
                return (
                    "a repeated alternation whose branches can start alike, such as (a|aa)+, can backtrack "
                    "catastrophically"
                )
        for sub in _children(op, av):
            problem = _walk_problems(sub, counts)
            if problem:
                return problem
    return None


def regex_problem(pattern: str, max_len: int = MAX_REGEX_LEN) -> str | None:
    """Return why `pattern` is unsafe or invalid as a module-name regex, or None when it is fine.

    Checked statically, without running the pattern: length, syntax, backreferences, nested quantifiers,
    repeated overlapping alternations and too many unbounded quantifiers.
    """
    if not isinstance(pattern, str) or not pattern:
        return "the regex is empty"
    if len(pattern) > max_len:
        return f"the regex has {len(pattern)} characters (at most {max_len})"
    try:
        parsed = _sre_parse.parse(pattern)
        re.compile(pattern)
    except (re.error, RecursionError, OverflowError, ValueError) as exc:
        return f"the regex does not compile: {exc}"
    counts = {"unbounded": 0}
    try:
        problem = _walk_problems(list(parsed), counts)
    except RecursionError:
        return "the regex is nested too deeply"
    if problem:
        return problem
    if counts["unbounded"] > _MAX_UNBOUNDED:
        return f"the regex has {counts['unbounded']} unbounded quantifiers (at most {_MAX_UNBOUNDED})"
    return None


_TIMING_CHILD = """
import json, re, sys
data = json.load(sys.stdin)
for pattern in data["patterns"]:
    compiled = re.compile(pattern)
    for subject in data["subjects"]:
        compiled.search(subject)
    sys.stdout.write("."); sys.stdout.flush()
"""


def slow_patterns(patterns: list[str], subjects: list[str], budget: float) -> list[str] | None:
    """Run every search in a child process under a time budget; return the patterns that did not finish.

    Python's `re` cannot be interrupted inside the process, so the searches run in `python -I -S` (patterns
    and subjects passed as JSON data, never as code) and the child is killed when the budget runs out.
    Returns None when the child could not be started (the static checks still apply).
    """
    if not patterns or not subjects or budget <= 0:
        return []
    if not sys.executable:
        return None
    payload = json.dumps({"patterns": patterns, "subjects": subjects})
    try:
        subprocess.run(
            [sys.executable, "-I", "-S", "-c", _TIMING_CHILD],
            input=payload,
            capture_output=True,
            text=True,
            timeout=budget,
            check=True,
        )
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout or b""
        done = out.count(b".") if isinstance(out, bytes) else out.count(".")
        return patterns[done : done + 1]
    except (OSError, subprocess.SubprocessError) as exc:
        logger.warning("regex timing check skipped: %s", exc)
        return None
    return []
