"""Fork a run from an earlier checkpoint with a changed objective, into a folder of its own."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any

from profiling_agent.state import Objective
from profiling_agent.tools import run_layout

FORKS = run_layout.FORKS
# written from the state by later nodes (or by the report): never carried into a fork
_NOT_CARRIED = {
    FORKS,
    run_layout.BEST,
    run_layout.RESULT,
    run_layout.REPORT_MD,
    run_layout.REPORT_HTML,
    run_layout.PLOTS,
}


def _link_tree(src: Path, dst: Path) -> None:
    """Copy a file or folder by hard links (artifacts are replaced, never modified in place), else by copying."""

    def link(a: str, b: str) -> None:
        try:
            os.link(a, b)
        except OSError:
            shutil.copy2(a, b)

    if src.is_dir():
        shutil.copytree(src, dst, copy_function=link)
    else:
        link(str(src), str(dst))


def carried_entries(run_path: Path, iteration: int) -> list[Path]:
    """Return the run folder's entries a fork at `iteration` needs: inputs, profile, and iterations 1..iteration."""
    keep = []
    for entry in sorted(run_path.iterdir()):
        number = run_layout.iteration_of(entry.name)
        if entry.name.startswith(".") or entry.name in _NOT_CARRIED or (number is not None and number > iteration):
            continue
        keep.append(entry)
    return keep


def fork_run(graph: Any, config: dict[str, Any], *, objective: dict[str, Any] | None = None) -> dict[str, Any]:
    """Branch a thread at the checkpoint in `config`, with objective fields changed, in its own run folder.

    The fork is a new checkpoint on the same thread (graph.update_state), so invoking the graph with the
    returned config (input None) continues from there, and a plain resume of the thread continues the fork.
    Files the fork reuses (baseline, prepared data, profile, earlier iterations) are hard-linked into
    RUN_DIR/THREAD/forks/fork-N, so the original branch's artifacts are never overwritten.

    Args:
        graph: The compiled graph, with a checkpointer.
        config: {"configurable": {"thread_id": ..., "checkpoint_id": ...}} of a checkpoint taken after acquire
            (e.g. `snapshot.config` from graph.get_state_history).
        objective: Objective fields to change, e.g. {"max_acc_drop": 1.0, "target": "macs"}.

    Returns:
        The config of the fork's checkpoint.

    Raises:
        ValueError: The checkpoint precedes acquire (nothing to reuse yet) or the objective is invalid.
    """
    snapshot = graph.get_state(config)
    values = snapshot.values or {}
    if not values.get("run_path"):
        raise ValueError("fork from a checkpoint taken after acquire (this one has no run folder yet)")
    new_objective = Objective.model_validate({**(values.get("objective") or {}), **(objective or {})}).model_dump()
    source = Path(values["run_path"])
    home = source.parent.parent if source.parent.name == FORKS else source
    forks = home / FORKS
    forks.mkdir(parents=True, exist_ok=True)
    taken = [int(p.name[len("fork-") :]) for p in forks.glob("fork-*") if p.name[len("fork-") :].isdigit()]
    n = 1 + max(taken, default=0)
    target = forks / f"fork-{n}"
    staging = forks / f".fork-{n}.tmp"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    for entry in carried_entries(source, int(values.get("iteration") or 0)):
        _link_tree(entry, staging / entry.name)
    os.replace(staging, target)
    checkpoint_id = snapshot.config["configurable"].get("checkpoint_id", "")
    changed = {k: v for k, v in new_objective.items() if (values.get("objective") or {}).get(k) != v}
    note = {
        "node": "fork",
        "iteration": int(values.get("iteration") or 0),
        "time": round(time.time(), 3),
        "message": f"forked from checkpoint {checkpoint_id} into {target}; objective changes: {changed or 'none'}",
    }
    update = {"objective": new_objective, "run_path": str(target), "history": [note]}
    return graph.update_state(snapshot.config, update)
