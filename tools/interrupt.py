"""Cooperative stop: Ctrl-C or SIGTERM sets a flag that the heavy loops check, so a run stops within moments.

Nodes run in LangGraph's worker thread, where a signal's KeyboardInterrupt never arrives; the main thread would
wait for the whole step. `request_stop` sets a process-wide flag and makes every later torch module forward
raise `Interrupted`, so training, probing, distillation, evaluation and export stop at their next forward pass
(or at an explicit `check()` between steps) with nothing half-written: the step is re-run by a resume.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

_stop = threading.Event()
_reason: list[str] = []
_hook: list[Any] = []  # the torch forward pre-hook handle while a stop is requested


class Interrupted(KeyboardInterrupt):
    """A stop was requested (Ctrl-C or SIGTERM); raised inside the running step at its next check.

    A KeyboardInterrupt, so `except Exception` in a step (which records a failure and goes on) never swallows it.
    """


def _raise_on_forward(module: Any, args: Any) -> None:
    raise Interrupted(stop_reason() or "stop requested")


def request_stop(reason: str = "interrupted") -> None:
    """Ask every running step to stop: `check()` and every torch module forward raise `Interrupted` from now on."""
    if not _stop.is_set():
        _reason[:] = [reason]
        _stop.set()
    torch = sys.modules.get("torch")  # no torch loaded yet: nothing can be running a forward pass
    if torch is not None and not _hook:
        _hook.append(torch.nn.modules.module.register_module_forward_pre_hook(_raise_on_forward))


def stop_requested() -> bool:
    """Return whether a stop has been requested."""
    return _stop.is_set()


def stop_reason() -> str:
    """Return why a stop was requested ("" when none was)."""
    return _reason[0] if _reason and _stop.is_set() else ""


def check() -> None:
    """Raise `Interrupted` when a stop has been requested (call it between the steps of a long loop)."""
    if _stop.is_set():
        raise Interrupted(stop_reason())


def clear() -> None:
    """Forget a stop request (for a process that goes on after handling one, e.g. tests)."""
    _stop.clear()
    _reason.clear()
    while _hook:
        _hook.pop().remove()


@contextmanager
def stop_on_signals(on_second: Callable[[str], None] | None = None, grace_s: float = 0.0) -> Iterator[None]:
    """Turn SIGINT and SIGTERM into a cooperative stop for the block (main thread only; elsewhere a no-op).

    The first signal requests a stop and raises `Interrupted` in the main thread (so SIGTERM ends a run like
    Ctrl-C); a second one, or `grace_s` seconds without the block having ended, calls `on_second(signal name)`,
    which may end the process at once (a step stuck in library code that never reaches a check). Previous
    handlers and the flag are restored after the block.

    Args:
        on_second: Called on a repeated signal while the running step winds down (None: ignore repeats).
        grace_s: Seconds after the first signal before `on_second` is called anyway (0: never).
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    timers: list[threading.Timer] = []

    def handle(signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        if _stop.is_set():
            if on_second is not None:
                on_second(name)
            return
        request_stop(name)
        if on_second is not None and grace_s > 0:
            timer = threading.Timer(grace_s, on_second, args=(name,))
            timer.daemon = True
            timers.append(timer)
            timer.start()
        raise Interrupted(name)

    previous = {sig: signal.signal(sig, handle) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for timer in timers:
            timer.cancel()
        for sig, old in previous.items():
            signal.signal(sig, old)
        clear()
