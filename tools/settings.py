"""The runtime and backend choices as the tools read them: the Literals themselves are defined once, in state."""

from __future__ import annotations

from typing import Literal, get_args

from profiling_agent.schemas.settings import BackendChoice

Runtime = Literal["torch", "onnxruntime", "openvino"]  # a runtime that executes a delivered form
Backend = BackendChoice  # `--backend`: one runtime's forms, or all (auto)

RUNTIMES: tuple[Runtime, ...] = get_args(Runtime)
BACKENDS: tuple[Backend, ...] = get_args(Backend)
DEFAULT_BACKEND: Backend = "auto"


def backend_or_default(value: str | None) -> Backend:
    """Return `value` as a backend choice; an unknown or missing setting means the default (auto)."""
    return next((b for b in BACKENDS if b == value), DEFAULT_BACKEND)
