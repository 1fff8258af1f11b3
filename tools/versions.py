"""Versions of the libraries a run, an artifact or a trained model depends on: the one place that lists them."""

from __future__ import annotations

import importlib
import platform

from profiling_agent import __version__

_CORE = ("torch", "transformers")
_DISTRIBUTIONS = {"scikit-learn": "sklearn"}  # distribution name -> import name, where they differ


def versions(*extra: str) -> dict[str, str]:
    """Return the Python, profiling-agent, torch and transformers versions, plus those of `extra` libraries.

    Args:
        extra: Distribution names (e.g. "safetensors", "datasets", "scikit-learn") to add.
    """
    found = {"python": platform.python_version(), "profiling_agent": __version__}
    for name in (*_CORE, *extra):
        module = importlib.import_module(_DISTRIBUTIONS.get(name, name))
        found[name] = str(getattr(module, "__version__", "unknown"))
    return found
