"""OpenVINO files compiled once per measurement: inside `kept_compiled`, a file timed again is not compiled again.

The profile step times the same IR files several times: the planned form's node profile until its shares agree,
the latency table's ratios and the token rates in two opposite orders each. On a small model one compilation costs
more than the timing it serves (the digits ViT's profile step compiled 63 times, 12 of its 22 s). Inside the block a
compiled model is kept for the block's span while the kept files' weights stay under `limit_bytes` (a full-size
model's forms then still compile per call rather than hold gigabytes); outside it every call compiles, as before.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from profiling_agent.tools.runtimes.openvino_model import shared_core, static_model

KEEP_BYTES = 1 << 30  # the kept files' weights (.bin) at most: 1 GiB


@dataclass
class _Scope:
    limit: int
    used: int = 0
    models: dict[tuple[Any, ...], Any] = field(default_factory=dict)


_SCOPES: list[_Scope] = []


@contextmanager
def kept_compiled(limit_bytes: int = KEEP_BYTES) -> Iterator[None]:
    """Keep what `compile_file` compiles until the block ends (nested blocks share the outermost one)."""
    if _SCOPES:
        yield
        return
    scope = _Scope(limit=limit_bytes)
    _SCOPES.append(scope)
    try:
        yield
    finally:
        _SCOPES.remove(scope)
        scope.models.clear()


def _weights_bytes(path: Path) -> int:
    weights = path.with_suffix(".bin")
    return weights.stat().st_size if weights.is_file() else path.stat().st_size


def compile_file(path: str | Path, shape: tuple[int, ...], config: Mapping[str, str]) -> Any:
    """Return the IR at `path` compiled on the CPU with `config`, for the static `shape` where that pays.

    `openvino_model.static_model` decides (only an IR with shape-dependent ops is reshaped). Inside `kept_compiled`
    a file already compiled with the same shape and settings (and unchanged since) is returned as it was.
    """
    file = Path(path).resolve()
    stat = file.stat()
    key = (str(file), stat.st_mtime_ns, stat.st_size, tuple(shape), tuple(sorted(config.items())))
    scope = _SCOPES[0] if _SCOPES else None
    if scope is not None and key in scope.models:
        return scope.models[key]
    core = shared_core()
    model = core.read_model(str(file))
    compiled = core.compile_model(static_model(model, tuple(shape)) or model, "CPU", dict(config))
    if scope is not None:
        size = _weights_bytes(file)
        if scope.used + size <= scope.limit:
            scope.models[key] = compiled
            scope.used += size
    return compiled
