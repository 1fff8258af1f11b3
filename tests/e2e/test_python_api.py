"""The Python API examples of docs/python-api.md run as written (on a small model) and leave their runs."""

from __future__ import annotations

import json
import os
import runpy
from pathlib import Path

import pytest
from helpers.docs import readme_python_blocks

REPO = Path(__file__).resolve().parents[2]


def test_readme_has_the_documented_examples():
    code = "\n".join(readme_python_blocks())
    for needle in (
        "open_checkpointer(",
        "graph.invoke(inputs, config, context=context",
        "graph.stream(",
        "stream_mode=",
        "graph.stream(None",  # resume after an interruption
        "Command(resume=",
        "get_state_history(",
        "fork_run(",
        "graph.invoke(None, fork_config",
    ):
        assert needle in code, needle


@pytest.mark.slow
def test_readme_python_api_examples_run(tmp_path, digits_vit, monkeypatch, capsys):
    from profiling_agent.graph.builder import build_graph
    from profiling_agent.graph.checkpoint import open_checkpointer, thread_ids
    from profiling_agent.tools.io import sha256_path

    script = tmp_path / "readme_python_api.py"
    script.write_text("\n\n".join(readme_python_blocks()), encoding="utf-8")
    work = tmp_path / "work"
    work.mkdir()
    # one Python session, as the page says: this one (its libraries already imported), in a fresh folder
    monkeypatch.chdir(work)
    monkeypatch.setenv("PROFILING_AGENT_CACHE", str(digits_vit.cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for key in ("OPENAI_API_KEY", "OPENAI_BASE_URL"):
        monkeypatch.delenv(key, raising=False)
    runpy.run_path(str(script), run_name="__main__")
    out = capsys.readouterr().out
    assert "[profile]" in out and "sensitivity probe: 8/8" in out  # streamed updates and progress events
    assert "waiting for approval of iteration 1" in out and "('analyze',)" in out

    runs = work / "runs"
    graph = build_graph(checkpointer=open_checkpointer(runs))
    assert set(thread_ids(graph.checkpointer)) == {"demo", "demo-stream"}
    streamed = graph.get_state({"configurable": {"thread_id": "demo-stream"}}).values
    assert streamed["status"] == "done" and streamed["best"]["review"]["decision"] == "approve"
    assert [h["node"] for h in streamed["history"]].count("profile") == 1  # the resume did not profile again

    # the fork is the newest branch of "demo"; the original branch is intact, with its own files
    config = {"configurable": {"thread_id": "demo"}}
    forked = graph.get_state(config).values
    history = list(graph.get_state_history(config))
    original = next(s for s in history if s.next == () and s.values["objective"]["target"] == "params")
    assert forked["objective"]["target"] == "macs" and forked["objective"]["max_acc_drop"] == 1.0
    assert original.values["objective"]["max_acc_drop"] == 2.0
    assert Path(forked["run_path"]) == runs / "demo" / "forks" / "fork-1"
    assert any(h["node"] == "fork" for h in forked["history"])
    for values in (original.values, forked):
        root = Path(values["run_path"])
        for cand in values["candidates"]:
            assert sha256_path(root / cand["artifact"]["path"]) == cand["artifact"]["sha256"]
        result = json.loads((root / "result.json").read_text())
        assert result["thread_id"] == "demo" and result["objective"]["target"] == values["objective"]["target"]
    base_file = "baseline/model.safetensors"
    assert os.path.samefile(runs / "demo" / base_file, runs / "demo" / "forks" / "fork-1" / base_file)  # hard link
