"""Each test file's seconds from a JUnit XML report: the table `tests/file_seconds.json` that orders the suite.

`make test` spreads files over processes (pytest-xdist, `--dist loadfile`) in the order the conftest gives them:
longest first, so that no long file starts last and runs alone. The table is read only for that order; a stale or
missing entry changes the order, never a result. Regenerate it from a whole-suite report with
`python tests/helpers/file_seconds.py REPORT.xml` (`make test` writes one to .cache/junit.xml).
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

TABLE = Path(__file__).resolve().parents[1] / "file_seconds.json"


def file_of(classname: str) -> str:
    """Return the test file of a JUnit `classname` (`tests.e2e.test_x` or `tests.e2e.test_x.TestClass`)."""
    parts = classname.split(".")
    for end in range(len(parts), 0, -1):
        path = "/".join(parts[:end]) + ".py"
        if (TABLE.parents[1] / path).is_file():
            return path
    return "/".join(parts) + ".py"


def seconds_by_file(report: Path) -> dict[str, float]:
    """Return each file's summed test seconds in a JUnit XML report."""
    totals: dict[str, float] = defaultdict(float)
    for case in ET.parse(report).getroot().iter("testcase"):
        totals[file_of(case.get("classname", ""))] += float(case.get("time") or 0.0)
    return {name: round(total, 1) for name, total in sorted(totals.items())}


def read_table() -> dict[str, float]:
    """Return the stored seconds per test file (empty when there is no table)."""
    try:
        return dict(json.loads(TABLE.read_text(encoding="utf-8"))["seconds"])
    except (OSError, ValueError, KeyError):
        return {}


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not Path(argv[0]).is_file():
        print("usage: python tests/helpers/file_seconds.py REPORT.xml (a JUnit XML report of the whole suite)")
        return 2
    seconds = seconds_by_file(Path(argv[0]))
    TABLE.write_text(json.dumps({"seconds": seconds}, indent=1) + "\n", encoding="utf-8")
    print(f"{TABLE.name}: {len(seconds)} files, {sum(seconds.values()):.0f} s in all")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
