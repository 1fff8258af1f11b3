"""Checkpoints written by earlier layouts of the state (tests/data/*.sqlite) load as today's models and resume."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from profiling_agent.graph.checkpoint import close_checkpointer, migrate_checkpoint, open_checkpointer, saved_format
from profiling_agent.nodes.common import event
from profiling_agent.state import (
    Best,
    Candidate,
    DataRef,
    DatasetRef,
    EvalRecord,
    Fallback,
    HistoryEvent,
    InputShape,
    LabelMap,
    ModelRef,
    ProfileSummary,
    ReportRef,
    State,
)
from profiling_agent.state import (
    TestEval as HeldOutEval,
)

DATA = Path(__file__).resolve().parents[1] / "data"
# each stored checkpoint, by the script beside it that wrote it
STORED = {
    "checkpoint_format0.sqlite": "make_checkpoint_format0.py",
    "checkpoint_state_package.sqlite": "make_checkpoint_state_package.py",
}


def _writer(script: str):
    """The script that wrote a stored checkpoint (loaded by path: it holds the graph and the thread id)."""
    spec = importlib.util.spec_from_file_location(Path(script).stem, DATA / script)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_checkpoint_written_while_the_state_was_a_package_resumes(tmp_path, caplog):
    """Its models are named by the package's modules (`profiling_agent.state.records.Candidate`, ...), which no
    longer exist: they rebuild as today's classes, without a warning, and the thread runs on."""
    writer = _writer("make_checkpoint_state_package.py")
    shutil.copy(DATA / "checkpoint_state_package.sqlite", tmp_path / "checkpoints.sqlite")
    saver = open_checkpointer(tmp_path)
    config = {"configurable": {"thread_id": writer.THREAD}}
    assert saved_format(saver, config) == 1
    seen = {}

    def second(state: State) -> dict:
        seen["best"] = state.best.reduction if state.best else None
        seen["mode"] = state.history[-1].planner_choice.mode if state.history[-1].planner_choice else None
        return {"history": event("second", "resumed")}

    graph = writer.graph(saver, second)
    with caplog.at_level("WARNING"):
        values = graph.get_state(config).values
        expected = {
            "model": ModelRef,
            "dataset": DatasetRef,
            "labels": LabelMap,
            "data": DataRef,
            "input_shape": InputShape,
            "profile": ProfileSummary,
            "baseline_eval": EvalRecord,
            "current": Candidate,
            "best": Best,
            "test_eval": HeldOutEval,
            "report": ReportRef,
        }
        assert {k: type(values[k]) for k in expected} == expected
        assert isinstance(values["fallbacks"][0], Fallback) and isinstance(values["history"][1], HistoryEvent)
        assert values["current"].recovery.method == "reconstruct" and values["best"].applied[0].units_after == 6
        assert values["dataset"].subset == 64 and values["history"][1].planner_choice.mode == "deterministic"
        assert migrate_checkpoint(graph, saver, config) == []
        graph.invoke(None, config)
    assert seen == {"best": 0.25, "mode": "deterministic"}
    assert graph.get_state(config).values["history"][-1]["node"] == "second"
    assert not [r for r in caplog.records if "profiling_agent." in r.getMessage()], caplog.text
    close_checkpointer(saver)


STRICT_READ = """
import importlib.util, json, logging, shutil, sys
from pathlib import Path
logging.basicConfig(level=logging.WARNING, stream=sys.stdout, format="%(message)s")
from profiling_agent.graph.checkpoint import close_checkpointer, open_checkpointer
stored, script, folder = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
spec = importlib.util.spec_from_file_location(script.stem, script)
writer = importlib.util.module_from_spec(spec)
spec.loader.exec_module(writer)
shutil.copy(stored, folder / "checkpoints.sqlite")
saver = open_checkpointer(folder)
config = {"configurable": {"thread_id": writer.THREAD}}
seen = {}
graph = writer.graph(saver, lambda state: seen.update(speedup=state.current.eval.speedup) or {})
values = graph.get_state(config).values
graph.invoke(None, config)
close_checkpointer(saver)
kinds = {k: type(v).__name__ for k, v in values.items() if k in ("profile", "current", "candidates", "plan")}
print(json.dumps({"kinds": kinds, "first": type(values["candidates"][0]).__name__, **seen}), flush=True)
"""


def test_both_stored_checkpoints_rebuild_under_langgraphs_strict_msgpack_mode(tmp_path):
    """With LANGGRAPH_STRICT_MSGPACK=true LangGraph rebuilds only registered types: the serializer's mapping of the
    old module names keeps both layouts' models typed (a fresh process: the mode is read at import)."""
    env = {**os.environ, "LANGGRAPH_STRICT_MSGPACK": "true"}
    for stored, script in STORED.items():
        folder = tmp_path / stored
        folder.mkdir()
        args = [sys.executable, "-c", STRICT_READ, str(DATA / stored), str(DATA / script), str(folder)]
        proc = subprocess.run(args, capture_output=True, text=True, env=env)
        assert proc.returncode == 0, proc.stderr[-2000:]
        *logged, last = proc.stdout.splitlines()
        assert not [line for line in logged if "profiling_agent" in line], logged  # nothing blocked or warned
        result = json.loads(last)
        assert result["kinds"] == {
            "profile": "ProfileSummary",
            "plan": "CompressionPlan",
            "current": "Candidate",
            "candidates": "list",
        }, (stored, result)
        assert result["first"] == "Candidate" and result["speedup"] == 1.33, (stored, result)
