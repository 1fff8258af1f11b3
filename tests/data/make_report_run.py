"""Write tests/data/report_run/: a finished run's report inputs and the result.json and report.md its run wrote.

Made at commit 5d74f3e (before reporting took typed records) from a one-round run of the embedded digits ViT:
`profiling-agent run --model embedded:vit-digits --iterations 1 --val-subset 64 --test-subset 64 --calibration 16
--threads 1 --recover-steps 20 --repeats 5 --beyond-target 0 --run-dir RUN_ROOT --thread-id ref1`, then
`python tests/data/make_report_run.py RUN_ROOT ref1 tests/data/report_run`.

It keeps the state the report node was handed (`state.json`, read from the run's checkpoints; `run_path` blanked,
the report reads the folder it is given) and the run files the report reads: the final joint timing, the
profile and the distillation curve. tests/unit/test_report_records.py rebuilds the report from them.
"""

import shutil
import sys
from pathlib import Path

from profiling_agent.graph.builder import build_graph
from profiling_agent.graph.checkpoint import close_checkpointer, open_checkpointer
from profiling_agent.state import State

FILES = ("result.json", "report.md", "final_latency.json", "profile.json")


def main(run_root: str, thread: str, out: str) -> None:
    """Copy the run's files and write the state before its report step into `out`."""
    saver = open_checkpointer(run_root, read_only=True)
    try:
        graph = build_graph(saver)
        history = graph.get_state_history({"configurable": {"thread_id": thread}})
        snap = next(s for s in history if s.next == ("report",))
        state = State.model_validate(snap.values).model_copy(update={"run_path": ""})
    finally:
        close_checkpointer(saver)
    run, target = Path(run_root) / thread, Path(out)
    target.mkdir(parents=True, exist_ok=True)
    (target / "state.json").write_text(state.model_dump_json(indent=1))
    for name in FILES:
        shutil.copy(run / name, target / name)
    for cand in state.candidates:
        curve = cand.recovery.curve if cand.recovery else None
        if curve:
            (target / curve).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(run / curve, target / curve)


if __name__ == "__main__":
    main(*sys.argv[1:4])
