"""Check that every direct dependency is installed at the floor pyproject.toml declares (a floor that is true)."""

from __future__ import annotations

import importlib.metadata
import sys
from pathlib import Path

import tomllib
from packaging.requirements import Requirement
from packaging.version import Version


def _release(version: str) -> tuple[int, ...]:
    """Return a version's release numbers without trailing zeros (2.13 == 2.13.0; the +cpu label is ignored)."""
    numbers = list(Version(version).release)
    while numbers and numbers[-1] == 0:
        numbers.pop()
    return tuple(numbers)


def mismatches(pyproject: Path) -> list[str]:
    """Return one line per direct dependency whose installed version is not its declared floor."""
    project = tomllib.loads(pyproject.read_text())["project"]
    requirements = list(project["dependencies"])
    for extra in project.get("optional-dependencies", {}).values():
        requirements += extra
    out = []
    for text in requirements:
        requirement = Requirement(text)
        floors = [spec.version for spec in requirement.specifier if spec.operator == ">="]
        if requirement.name == project["name"] or not floors:
            continue
        installed = importlib.metadata.version(requirement.name)
        if _release(installed) != _release(floors[0]):
            out.append(f"{requirement.name}: declared >={floors[0]}, installed {installed} (raise the floor to it)")
    return out


def main() -> int:
    """Print the mismatches, one a line, and return 1 when there is any."""
    lines = mismatches(Path(sys.argv[1] if len(sys.argv) > 1 else "pyproject.toml"))
    for line in lines:
        sys.stderr.write(f"floors: {line}\n")
    return 1 if lines else 0


if __name__ == "__main__":
    sys.exit(main())
