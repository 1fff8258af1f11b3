"""What the tests read out of the documentation: the Python examples of a page's section."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def readme_python_blocks(section: str = "Python API", page: str = "docs/python-api.md") -> list[str]:
    """Return the ```python blocks of one `## section` of a documentation page (moved from the README), in order."""
    text = (REPO / page).read_text(encoding="utf-8")
    match = re.search(rf"^## {re.escape(section)}\n(.*?)(?=^## |\Z)", text, flags=re.S | re.M)
    assert match, f"{page} has no '## {section}' section"
    return re.findall(r"^```python\n(.*?)^```", match.group(1), flags=re.S | re.M)
