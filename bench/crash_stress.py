"""Crash stress: the profile step repeated in one process and in fresh ones, and whole short runs; crashes counted.

Usage:
    python bench/crash_stress.py                        # 100 profile steps in one process and in fresh ones, 20 runs
    python bench/crash_stress.py --steps 3 --runs 1     # quicker
    python bench/crash_stress.py --steps 50 --fresh 0 --runs 10   # steps in one process and whole runs only
    python bench/crash_stress.py --tiny                 # smoke test: 1 step, 1 run of 16 images, no distillation,
                                                        # ONNX Runtime's forms only
    python bench/crash_stress.py --work DIR --json out.json

The model is `embedded:vit-digits` (trained on first use, about a minute, where PROFILING_AGENT_CACHE points). The
agent runs it in this process up to its profile step (the graph stops before it), which gives the state every
repeat starts from. Then, each in processes of its own, so that a crash ends only that process:
- one process: a child runs the profile node --steps times on that state, as the graph calls it;
- fresh processes: --steps children run it once each;
- whole runs: --runs CLI runs (`profiling-agent run`, `--iterations 1`, --subset validation and test images).
Every child keeps a faulthandler file (tools.interrupt: every thread's stack on a fatal signal). The table gives,
per mode, the attempts, the crashes (ended by a signal), the other failures, their exit codes and fault files.
Target (issue 49): 0 crashes in 100 + 100 profile steps and 20 whole short runs.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

THREAD = "base"  # the thread whose state, stopped before its profile step, every repeat starts from
STEP_TIMEOUT_S = 1800  # one child's limit (a hang counts as a failure, not a crash)


def prepare(work: Path, subset: int, backend: str = "auto") -> None:
    """Run the agent on embedded:vit-digits up to its profile step (trains the model on first use)."""
    from profiling_agent.graph.builder import build_graph
    from profiling_agent.graph.checkpoint import open_checkpointer
    from profiling_agent.state import Context

    inputs = {
        "model": {"ref": "embedded:vit-digits"},
        "dataset": {"ref": "embedded:digits", "subset": subset, "test_subset": subset, "calibration": 16},
        "objective": {"planner": "deterministic", "iterations": 1},
    }
    graph = build_graph(checkpointer=open_checkpointer(work))
    config = {"configurable": {"thread_id": THREAD}}
    context = Context(run_root=str(work), backend=backend)  # type: ignore[arg-type]
    graph.invoke(inputs, config, context=context, durability="sync", interrupt_before=["profile"])
    assert graph.get_state(config).next == ("profile",), "the prepared run did not stop before its profile step"


def profile_steps(work: Path, count: int, faults: Path, backend: str = "auto") -> None:
    """Run the profile node `count` times on the prepared state in this process, its fault file in `faults`."""
    from types import SimpleNamespace

    from profiling_agent.graph.builder import build_graph
    from profiling_agent.graph.checkpoint import open_checkpointer
    from profiling_agent.nodes.profile import profile
    from profiling_agent.state import Context, State
    from profiling_agent.tools import interrupt

    interrupt.enable_fault_file(faults)
    values = build_graph(checkpointer=open_checkpointer(work)).get_state({"configurable": {"thread_id": THREAD}})
    state = State.model_validate(values.values)
    context = Context(run_root=str(work), backend=backend)  # type: ignore[arg-type]
    runtime = SimpleNamespace(context=context, stream_writer=None, execution_info=None)
    for _ in range(count):
        profile(state, runtime)  # type: ignore[arg-type]
    interrupt.disable_fault_file()


def _child(command: list[str], faults: Path) -> dict[str, Any]:
    """Run one child to its end; return its exit code, seconds, last error line and the fault files it left."""
    began = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=STEP_TIMEOUT_S)
        code, err = done.returncode, done.stderr
    except subprocess.TimeoutExpired:
        code, err = None, f"timed out after {STEP_TIMEOUT_S} s"
    left = sorted(str(p) for p in faults.rglob("faulthandler-*.log") if p.stat().st_size > 0)
    last = next((line for line in reversed((err or "").splitlines()) if line.strip()), "")
    return {"exit": code, "seconds": round(time.perf_counter() - began, 2), "faults": left, "last": last[:200]}


def steps_command(work: Path, count: int, faults: Path, backend: str = "auto") -> list[str]:
    """The command of a child that runs the profile step `count` times (profiling the `backend` forms)."""
    return [
        *(sys.executable, __file__, "--work", str(work), "--child-steps", str(count), "--faults", str(faults)),
        *("--backend", backend),
    ]


# --tiny's whole run: ONNX Runtime's forms (native runtimes built and timed, without OpenVINO's and NNCF's long
# builds), recovery without distillation, few test images and no report charts (matplotlib's drawing)
TINY_RUN_FLAGS = (
    *("--recover", "reconstruct", "--test-subset", "16", "--repeats", "2", "--backend", "onnxruntime"),
    "--no-plots",
)


def run_command(work: Path, index: int, subset: int, extra: tuple[str, ...] = ()) -> list[str]:
    """The command of one whole short CLI run (`extra`: further `run` flags)."""
    return [
        sys.executable, "-m", "profiling_agent.graph.cli", "run", "--model", "embedded:vit-digits",
        "--dataset", "embedded:digits", "--subset", str(subset), "--calibration", "16", "--iterations", "1",
        "--planner", "deterministic", "--run-dir", str(work / "runs"), "--thread-id", f"run-{index:03d}", *extra,
    ]  # fmt: skip


def summarize(mode: str, children: list[dict[str, Any]], attempts: int) -> dict[str, Any]:
    """One table row: attempts, crashes (a signal ended the child, or it left a fault file), other failures."""
    crashed = [c for c in children if (c["exit"] is not None and c["exit"] < 0) or c["faults"]]
    failed = [c for c in children if c not in crashed and c["exit"] != 0]
    return {
        "mode": mode,
        "attempts": attempts,
        "crashes": len(crashed),
        "failures": len(failed),
        "exit_codes": sorted({str(c["exit"]) for c in crashed + failed}),
        "fault_files": [f for c in crashed for f in c["faults"]],
        "last_lines": [c["last"] for c in crashed + failed][:5],
        "seconds": round(sum(c["seconds"] for c in children), 1),
    }


def stress(
    work: Path,
    steps: int,
    runs: int,
    subset: int,
    extra: tuple[str, ...] = (),
    fresh_steps: int | None = None,
    backend: str = "auto",
) -> list[dict[str, Any]]:
    """Run the three modes (`fresh_steps` fresh processes, None: as many as `steps`); return one summary per mode."""
    rows = []
    fresh_steps = steps if fresh_steps is None else fresh_steps
    one = _child(steps_command(work, steps, work / "faults" / "one", backend), work / "faults" / "one")
    rows.append(summarize("profile step, one process", [one], steps))
    # one step: the one-process child already was a fresh process running it once, the same command
    fresh = [one] if steps == 1 and fresh_steps == 1 else [
        _child(steps_command(work, 1, work / "faults" / f"fresh-{i:03d}", backend), work / "faults" / f"fresh-{i:03d}")
        for i in range(fresh_steps)
    ]  # fmt: skip
    rows.append(summarize("profile step, fresh processes", fresh, fresh_steps))
    whole = [_child(run_command(work, i, subset, extra), work / "runs" / f"run-{i:03d}") for i in range(runs)]
    rows.append(summarize("whole short run (CLI)", whole, runs))
    return rows


def main(argv: list[str] | None = None) -> int:
    """Parse the flags, prepare the state, stress, print the table (with --strict, exit 1 when anything crashed)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100, help="profile steps in one process, and fresh processes")
    parser.add_argument("--fresh", type=int, default=None, help="profile steps in fresh processes (default: --steps)")
    parser.add_argument("--runs", type=int, default=20, help="whole short runs")
    parser.add_argument("--subset", type=int, default=64, help="validation and test images of each run")
    parser.add_argument("--work", type=Path, default=None, help="working folder (default: a temporary one)")
    parser.add_argument("--json", type=Path, default=None, help="write the table here as JSON")
    parser.add_argument("--strict", action="store_true", help="exit 1 when anything crashed")
    parser.add_argument(
        "--tiny",
        action="store_true",
        help="smoke test: 1 step, 1 run of 16 images, no distillation, ONNX Runtime's forms",
    )
    parser.add_argument("--child-steps", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--faults", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--backend", default="auto", help=argparse.SUPPRESS)  # the profile step's (--tiny's: ORT)
    args = parser.parse_args(argv)
    if args.tiny:  # the profile steps profile ONNX Runtime's forms, as the tiny whole run does (no NNCF build)
        args.steps, args.runs, args.subset, args.backend = 1, 1, 16, "onnxruntime"
    if args.child_steps:
        profile_steps(args.work, args.child_steps, args.faults, args.backend)
        return 0
    work = args.work or Path(tempfile.mkdtemp(prefix="crash-stress-"))
    prepare(work, args.subset, args.backend)
    extra = TINY_RUN_FLAGS if args.tiny else ()
    rows = stress(work, args.steps, args.runs, args.subset, extra, args.fresh, args.backend)
    for row in rows:
        print(
            f"{row['mode']:<32} {row['crashes']}/{row['attempts']} crashed, {row['failures']} other failures, "
            f"{row['seconds']} s" + (f"; exit codes {', '.join(row['exit_codes'])}" if row["exit_codes"] else "")
        )
        for line in row["fault_files"] + row["last_lines"]:
            print(f"    {line}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    crashed = any(row["crashes"] for row in rows)
    return 1 if crashed and args.strict else 0


if __name__ == "__main__":
    sys.exit(main())
