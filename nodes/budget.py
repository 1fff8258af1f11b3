"""The time budget around every node: its expected and spent seconds, its knobs, a ticking bar and the budget's cuts."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import threading
import time
from typing import Any, Protocol

from langgraph.runtime import Runtime

from profiling_agent.nodes.common import event, read_context
from profiling_agent.state import BudgetPlan, Context, State
from profiling_agent.tools.planning import time_budget as tb

LONG_STEP_S = 20.0  # a step expected to take longer shows a ticking progress bar
TICK_S = 1.0  # seconds between the bar's updates
PARAM_MACS = 180.0  # MACs per parameter of one image before the profile measured them (ViT-B/16 205, ResNet-50 160)


class Node(Protocol):
    """A graph node: the state and the run's runtime in, a partial update out."""

    def __call__(self, state: State, runtime: Runtime[Context]) -> dict[str, Any]: ...  # noqa: D102


def full_knobs(state: State, ctx: Context) -> tb.Knobs:
    """Return the knobs the run's settings ask for (no budget)."""
    return tb.Knobs(state.objective.iterations, ctx.trials or tb.FULL_TRIALS, ctx.recover_minutes, ctx.backend)


def gmacs(state: State) -> float:
    """Return one image's GMAC: profiled, else estimated from the baseline's parameters, else 1."""
    macs = (state.profile.totals.get("macs") if state.profile else None) or 0
    if not macs and state.baseline is not None:
        macs = state.baseline.params * PARAM_MACS
    return float(macs) / 1e9 if macs else 1.0


def run_progress(state: State, extra: list[dict[str, Any]] | None = None) -> tb.Progress:
    """Return the run's finished steps (its history, plus `extra` events) as the budget planner's Progress."""
    history = [e.model_dump() for e in state.history] + list(extra or [])
    return tb.progress_of(history, gmacs(state))


def budget_plan(state: State, ctx: Context, extra: list[dict[str, Any]] | None = None) -> BudgetPlan:
    """Return the time budget's plan of the remaining steps (no cuts without a budget)."""
    minutes = state.objective.time_budget
    return tb.plan_budget(minutes * 60 if minutes else None, run_progress(state, extra), full_knobs(state, ctx))


def budgeted_context(ctx: Context, plan: BudgetPlan) -> Context:
    """Return `ctx` with the plan's knobs: trials, the distillation cap and the backend."""
    return dataclasses.replace(ctx, trials=plan.trials, recover_minutes=plan.recover_minutes, backend=plan.backend)


def last_cuts(state: State) -> tuple[list[str], int]:
    """Return the knobs cut by the run's last budget event and its rounds (nothing cut before any)."""
    plans = [e.budget for e in state.history if e.budget is not None]
    return (plans[-1].cut, plans[-1].rounds) if plans else ([], state.objective.iterations)


class Ticker:
    """Emit a progress event every TICK_S seconds while a long step runs: its elapsed against expected seconds."""

    def __init__(self, runtime: Runtime[Context] | None, task: str, expected_s: float) -> None:
        """Start ticking unless the step is short or nobody streams."""
        self._writer = getattr(runtime, "stream_writer", None)
        self._task, self._total = task, max(2, int(round(expected_s)))
        self._stop = threading.Event()
        self._start = time.perf_counter()
        self._thread: threading.Thread | None = None
        if self._writer is not None and expected_s >= LONG_STEP_S:
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()

    def _send(self, done: int) -> None:
        try:
            self._writer(  # type: ignore[misc]
                {"kind": "progress", "task": self._task, "done": done, "total": self._total, "label": "s"}
            )
        except Exception:  # a stream writer outside a streaming run must never break a node
            pass

    def _run(self) -> None:
        while not self._stop.wait(TICK_S):
            self._send(min(self._total - 1, int(time.perf_counter() - self._start)))

    def stop(self) -> None:
        """Stop ticking and close the bar."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._send(self._total)


def stamped(update: dict[str, Any], spent_s: float, expected_s: float) -> dict[str, Any]:
    """Return `update` with the step's spent and expected seconds on its last history event."""
    history = [dict(e) for e in update.get("history") or []]
    if not history:
        return update
    history[-1].update(spent_s=round(spent_s, 3), expected_s=round(expected_s, 3))
    return {**update, "history": history}


def after_step(state: State, ctx: Context, node: str, update: dict[str, Any]) -> dict[str, Any]:
    """Add the budget's decisions after `node`: an event when its cuts changed; iterate's stop when no round fits."""
    if not state.objective.time_budget:
        return update
    done = list(update.get("history") or [])
    plan = budget_plan(state, ctx, done)
    extra: list[dict[str, Any]] = []
    if (plan.cut, plan.rounds) != last_cuts(state):  # a new cut or round count (not each new distillation cap)
        message = f"time budget {state.objective.time_budget:g} min ({plan.spent_s:.0f} s spent, "
        message += f"{plan.expected_s:.0f} s expected): cut " + ("; ".join(plan.cuts) or "nothing")
        extra = event("budget", message, state.iteration, budget=plan)
    if node == "iterate" and not update.get("stop_reason"):
        if not tb.another_round_fits(plan, run_progress(state, done)):
            update = {**update, "stop_reason": f"time budget: {plan.rounds} round(s) fit in it"}
    return {**update, "history": done + extra} if extra else update


def timed(node: str, fn: Node) -> Node:
    """Wrap node `fn`: run it with the budget's knobs and stamp its history event with spent and expected seconds.

    `fn` may take the state alone, as LangGraph allows a node to: it is then called without the runtime.
    """
    takes_runtime = len(inspect.signature(fn).parameters) > 1

    @functools.wraps(fn)
    def run(state: State, runtime: Runtime[Context]) -> dict[str, Any]:
        ctx = read_context(runtime)
        plan = budget_plan(state, ctx)
        if state.objective.time_budget and runtime is not None:
            runtime = runtime.override(context=budgeted_context(ctx, plan))
        it = state.iteration + 1 if node == "analyze" else state.iteration
        expected_s = tb.next_step_s(plan, run_progress(state), full_knobs(state, ctx), node, it)
        ticker = Ticker(runtime, f"{node} (about {expected_s:.0f} s)", expected_s)
        start = time.perf_counter()
        try:
            update = fn(state, runtime) if takes_runtime else fn(state)  # type: ignore[call-arg]
        finally:
            ticker.stop()
        update = stamped(update, time.perf_counter() - start, expected_s)
        return after_step(state, ctx, node, update)

    # LangGraph reads the wrapper's own signature (state, runtime), not that of a one-argument fn; `__wrapped__` stays
    # so that `get_graph(xray=True)` still finds the subgraph the wrapped node runs
    run.__signature__ = inspect.signature(run, follow_wrapped=False)  # type: ignore[attr-defined]
    return run
