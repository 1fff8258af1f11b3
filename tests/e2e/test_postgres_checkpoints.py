"""Checkpoints in PostgreSQL: LangGraph's PostgresSaver by URL, its threads, and one-line errors for bad URLs."""

from __future__ import annotations

import runpy
import socket
import sys
from collections import Counter
from typing import TypedDict

import pytest

from profiling_agent.graph.checkpoint import DB_NAME, close_checkpointer, is_postgres, open_checkpointer, thread_ids
from profiling_agent.graph.checkpoint_pg import EXTRA_HINT, CheckpointStoreError, redact
from profiling_agent.graph.cli.main import main


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]  # closed once the block ends: connections are refused at once


def _one_line_error(capfd, args: list[str]) -> str:
    code = main(args)
    out, err = capfd.readouterr()
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, err
    assert len(lines) == 1 and "Traceback" not in out + err, err
    return lines[0]


def test_redact_hides_passwords():
    assert redact("postgresql://bob:s3cret@db:5432/runs") == "postgresql://bob:***@db:5432/runs"
    assert redact("postgresql://db/runs?password=s3cret&sslmode=require") == (
        "postgresql://db/runs?password=***&sslmode=require"
    )
    assert redact("postgresql://bob@db/runs") == "postgresql://bob@db/runs"


BAD_URLS = [
    ("mysql://bob:s3cret@127.0.0.1/runs", "invalid checkpoint URL (scheme 'mysql'): expected postgresql://"),
    ("bob:s3cret@127.0.0.1", "invalid checkpoint URL (not a URL): expected postgresql://"),
    ("postgresql://bob:s3cret@127.0.0.1:notaport/runs", "postgresql://bob:***@127.0.0.1:notaport/runs"),
    ("postgresql://bob:s3cret@127.0.0.1:{port}/runs", "cannot connect to the checkpoint database"),
]


@pytest.mark.parametrize("command", ["run", "resume", "runs"])
@pytest.mark.parametrize("url, needle", BAD_URLS, ids=["scheme", "not-a-url", "bad-port", "unreachable"])
def test_bad_checkpoint_url_is_one_line(tmp_path, capfd, monkeypatch, command, url, needle):
    for key in ("OPENAI_API_KEY", "OPENAI_BASE_URL"):
        monkeypatch.delenv(key, raising=False)
    url = url.format(port=_closed_port())
    args = {"run": ["run", "--thread-id", "t"], "resume": ["resume", "t"], "runs": ["runs"]}[command]
    line = _one_line_error(capfd, [*args, "--run-dir", str(tmp_path), "--checkpoint-url", url])
    assert line.startswith("profiling-agent: error: ") and needle in line, line
    assert "s3cret" not in line  # the password is never echoed
    if "unreachable" in needle or "cannot connect" in needle:
        assert "Connection refused" in line, line
    assert not (tmp_path / DB_NAME).exists() and not (tmp_path / "t").exists()  # nothing written


def test_checkpoint_url_from_the_environment(tmp_path, capfd, monkeypatch):
    monkeypatch.setenv("PROFILING_AGENT_CHECKPOINT_URL", f"postgresql://bob@127.0.0.1:{_closed_port()}/runs")
    line = _one_line_error(capfd, ["runs", "--run-dir", str(tmp_path)])
    assert "cannot connect to the checkpoint database postgresql://bob@127.0.0.1:" in line, line


def test_missing_postgres_extra_is_named(tmp_path, capfd, monkeypatch):
    monkeypatch.setitem(sys.modules, "langgraph.checkpoint.postgres", None)  # as if the extra were not installed
    with pytest.raises(CheckpointStoreError, match="postgres extra"):
        open_checkpointer(tmp_path, "postgresql://bob@127.0.0.1/runs")
    line = _one_line_error(capfd, ["runs", "--checkpoint-url", "postgresql://bob@127.0.0.1/runs"])
    assert line == f"profiling-agent: error: {EXTRA_HINT}"


class Toy(TypedDict, total=False):
    a: int
    b: int


def _toy_graph(saver, calls: Counter):
    from langgraph.graph import END, START, StateGraph

    def node_a(state: Toy) -> dict:
        calls["a"] += 1
        return {"a": 1}

    def node_b(state: Toy) -> dict:
        calls["b"] += 1
        return {"b": 2}

    builder = StateGraph(Toy)
    builder.add_node("a", node_a)
    builder.add_node("b", node_b)
    builder.add_edge(START, "a")
    builder.add_edge("a", "b")
    builder.add_edge("b", END)
    return builder.compile(checkpointer=saver)


def test_postgres_threads_survive_the_connection(tmp_path, postgres_url):
    """Threads written through one connection are listed (oldest first) and resumed through another."""
    first = open_checkpointer(tmp_path, postgres_url)
    assert is_postgres(first) and thread_ids(first) == []
    calls = Counter()
    graph = _toy_graph(first, calls)
    graph.invoke({}, {"configurable": {"thread_id": "older"}}, durability="sync")
    graph.invoke({}, {"configurable": {"thread_id": "newer"}}, durability="sync", interrupt_after=["a"])
    close_checkpointer(first)
    assert not (tmp_path / DB_NAME).exists()  # no SQLite file beside the runs

    second = open_checkpointer(tmp_path, postgres_url)  # setup() again on existing tables is harmless
    try:
        assert thread_ids(second) == ["older", "newer"]
        graph = _toy_graph(second, calls)
        config = {"configurable": {"thread_id": "newer"}}
        assert graph.get_state(config).next == ("b",)
        assert graph.invoke(None, config, durability="sync") == {"a": 1, "b": 2}
        assert calls == {"a": 2, "b": 2}  # the resumed thread did not run `a` again
    finally:
        close_checkpointer(second)


@pytest.mark.slow
def test_readme_postgres_example_runs(tmp_path, postgres_url, quick_resnet, monkeypatch, capsys):
    """docs/deployment.md's PostgreSQL example runs as written and leaves its thread in the database, none in SQLite.

    The example runs as a script in this process (`runpy`), in a folder of its own and with the environment it
    documents: the same code a fresh interpreter would run, without importing torch and the graph a second time.
    """
    from helpers.docs import readme_python_blocks

    from profiling_agent.graph.builder import build_graph
    from profiling_agent.tools.io import sha256_path

    blocks = readme_python_blocks("Deployment: shared runs, PostgreSQL, LangGraph Server", "docs/deployment.md")
    assert len(blocks) == 1
    script = tmp_path / "readme_postgres.py"
    script.write_text(blocks[0], encoding="utf-8")
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("PROFILING_AGENT_CACHE", str(quick_resnet[2]))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("PROFILING_AGENT_CHECKPOINT_URL", postgres_url)
    for key in ("OPENAI_API_KEY", "OPENAI_BASE_URL"):
        monkeypatch.delenv(key, raising=False)
    runpy.run_path(str(script), run_name="__main__")
    assert "done ['shared-demo']" in capsys.readouterr().out
    runs = work / "runs"
    assert not (runs / DB_NAME).exists() and not (runs / ".locks").exists()  # PostgreSQL: no SQLite file, no lock file

    saver = open_checkpointer(runs, postgres_url)
    try:
        values = build_graph(checkpointer=saver).get_state({"configurable": {"thread_id": "shared-demo"}}).values
    finally:
        close_checkpointer(saver)
    assert values["status"] == "done" and values["model"]["ref"] == "embedded:resnet-digits"
    for cand in (c for c in values["candidates"] if c["status"] == "ok"):
        assert sha256_path(runs / "shared-demo" / cand["artifact"]["path"]) == cand["artifact"]["sha256"]
