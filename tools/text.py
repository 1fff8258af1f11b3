"""Short text for people and prompts: one-line error messages and the number formats every report shares."""

from __future__ import annotations

from typing import Any


def one_line(text: object, limit: int = 300) -> str:
    """Return the first non-empty line of `text`, cut to `limit` characters."""
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    first = lines[0] if lines else type(text).__name__
    return first if len(first) <= limit else first[: limit - 3] + "..."


def as_number(value: Any) -> float | None:
    """Return `value` as a float when it is a real number (bools excluded), else None."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def number(value: Any, spec: str = ".2f", suffix: str = "") -> str:
    """Format a number with a format spec and a suffix ("," gives a whole number with thousands separators).

    Returns "-" when `value` is not a number (None, a string, a bool).
    """
    n = as_number(value)
    if n is None:
        return "-"
    return (format(int(n), ",") if spec == "," else format(n, spec)) + suffix


def human(value: Any, fmt: str = ".2f") -> str:
    """Format a count with a K/M/G suffix (`fmt` applies to the scaled value); "n/a" when it is not a number."""
    number = as_number(value)
    if number is None:
        return "n/a"
    for unit, scale in (("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(number) >= scale:
            return f"{number / scale:{fmt}}{unit}"
    return f"{number:.0f}"


def percent(fraction: Any, digits: int = 1) -> str:
    """Format a fraction as a percentage ("12.5%"); "-" when it is not a number."""
    number = as_number(fraction)
    return "-" if number is None else f"{number:.{digits}%}"
