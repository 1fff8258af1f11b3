"""The choices of the run's settings, defined once: the CLI's choices and the checks read these Literals."""

from __future__ import annotations

from typing import Literal, get_args

Runtime = Literal["torch", "onnxruntime", "openvino"]  # a runtime that executes a delivered form
Backend = Literal["torch", "onnxruntime", "openvino", "auto"]  # `--backend`: one runtime's forms, or all (auto)

RUNTIMES: tuple[Runtime, ...] = get_args(Runtime)
BACKENDS: tuple[Backend, ...] = get_args(Backend)
DEFAULT_BACKEND: Backend = "auto"


def backend_or_default(value: str | None) -> Backend:
    """Return `value` as a backend choice; an unknown or missing setting means the default (auto)."""
    return next((b for b in BACKENDS if b == value), DEFAULT_BACKEND)
