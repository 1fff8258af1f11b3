"""`langgraph dev` (Studio's server) serves the graph offline; a langgraph-sdk run ends with the best model."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.quick_assets import FAST_CONTEXT

REPO = Path(__file__).resolve().parents[2]
LANGGRAPH = Path(sys.executable).with_name("langgraph")
START_TIMEOUT = 120.0
RUN_TIMEOUT = 600.0
# no analytics, no version check, no LangSmith tracing: the server must not reach out to the network
OFFLINE_ENV = {
    "LANGGRAPH_CLI_NO_ANALYTICS": "1",
    "LANGGRAPH_NO_VERSION_CHECK": "1",
    "LANGSMITH_TRACING": "false",
    "LANGSMITH_TRACING_V2": "false",
    "LANGCHAIN_TRACING_V2": "false",
    "LANGCHAIN_TRACING": "false",
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "DO_NOT_TRACK": "1",
}
SECRETS = ("LANGSMITH_API_KEY", "LANGCHAIN_API_KEY", "LANGGRAPH_CLOUD_LICENSE_KEY", "OPENAI_API_KEY", "OPENAI_BASE_URL")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_ready(url: str, proc: subprocess.Popen, log: Path) -> None:
    import httpx

    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"langgraph dev exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(f"{url}/ok", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    pytest.fail(f"langgraph dev did not answer within {START_TIMEOUT:.0f} s:\n{log.read_text()[-3000:]}")


# run flags that name a field differently (the rest share the field's name)
FLAG_FIELDS = {
    "model": "model.ref",
    "dataset": "dataset.ref",
    "run_dir": "context.run_root",
    "temperature": "context.llm_temperature",
    "repeats": "context.latency_repeats",
    "no_augment": "context.recover_augment",
    "no_plots": "context.plots",
    "thread_id": "config.configurable.thread_id",
}
# run flags with no graph field because the server provides the thing itself
SERVER_OWNED = {"checkpoint_url": "the server brings its own checkpointer (LangGraph Server: its DATABASE_URI)"}


def test_every_run_flag_is_a_field_of_the_input_or_the_context():
    """Studio's forms (input and context schemas) offer everything `profiling-agent run` does."""
    import argparse
    import dataclasses

    from profiling_agent.graph.cli.args import build_parser
    from profiling_agent.state import Context, InputState

    fields = {"context." + f.name for f in dataclasses.fields(Context)} | {"config.configurable.thread_id"}
    for part, model in InputState.model_fields.items():
        fields |= {f"{part}.{name}" for name in model.annotation.model_fields}
    parser = build_parser()
    run = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices["run"]
    flags = [a.dest for a in run._actions if a.dest != "help" and a.dest not in SERVER_OWNED]
    assert len(flags) > 20
    missing = []
    for dest in flags:
        candidates = [FLAG_FIELDS[dest]] if dest in FLAG_FIELDS else [f for f in fields if f.split(".")[-1] == dest]
        if not candidates or candidates[0] not in fields:
            missing.append(dest)
    assert not missing, f"run flags with no input or context field: {missing}"


@pytest.fixture(scope="module")
def studio(tmp_path_factory, digits_vit):
    """A `langgraph dev` server started in the repository, offline, with a tiny model as the embedded default."""
    if not LANGGRAPH.exists():
        pytest.fail(f"{LANGGRAPH} missing: install the studio extra (pip install -e '.[studio]')")
    tmp = tmp_path_factory.mktemp("studio")
    model_dir, dataset = digits_vit.model, digits_vit.dataset
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k not in SECRETS}
    env.update(OFFLINE_ENV, PROFILING_AGENT_CACHE=str(digits_vit.cache), OMP_NUM_THREADS="1")
    state_dir = REPO / ".langgraph_api"  # the dev server keeps its in-memory state here, beside langgraph.json
    had_state = state_dir.exists()
    log = tmp / "langgraph-dev.log"
    cmd = [str(LANGGRAPH), "dev", "--no-browser", "--no-reload", "--host", "127.0.0.1", "--port", str(port)]
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(url, proc, log)
        yield {"url": url, "tmp": tmp, "model": model_dir, "dataset": dataset, "log": log}
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=20)
        if not had_state:
            shutil.rmtree(state_dir, ignore_errors=True)


@pytest.mark.slow
def test_schemas_accept_empty_input_and_the_cli_fields(studio):
    from langgraph_sdk import get_sync_client

    client = get_sync_client(url=studio["url"], api_key=None)
    (assistant,) = client.assistants.search(graph_id="profiling_agent")
    schemas = client.assistants.get_schemas(assistant["assistant_id"])
    inputs = schemas["input_schema"]
    assert not inputs.get("required")  # {} is a valid input: the embedded default
    assert {"model", "dataset", "objective"} <= set(inputs["properties"])
    defs = inputs.get("$defs") or inputs.get("definitions") or {}
    assert "approve" in defs["Objective"]["properties"] and "ratio" in defs["Objective"]["properties"]
    assert {"ref", "split", "subset", "calibration", "seed"} <= set(defs["DatasetRef"]["properties"])
    context = schemas["context_schema"]["properties"]
    assert {"run_root", "threads", "latency_repeats", "device"} <= set(context)
    assert context["run_root"].get("description")  # Studio shows the field descriptions


@pytest.mark.slow
def test_empty_input_starts_the_embedded_default(studio):
    from langgraph_sdk import get_sync_client

    client = get_sync_client(url=studio["url"], api_key=None)
    thread = client.threads.create()
    run_root = studio["tmp"] / "runs-empty"
    client.runs.wait(
        thread["thread_id"],
        "profiling_agent",
        input={},
        context={"run_root": str(run_root), **FAST_CONTEXT},
        interrupt_before=["resolve_input_shape"],  # only acquire: cheap, and proves {} was accepted
    )
    state = client.threads.get_state(thread["thread_id"])
    assert state["next"] == ["resolve_input_shape"]
    values = state["values"]
    assert values["model"]["ref"] == "embedded:vit-digits" and values["dataset"]["ref"] == "embedded:digits"
    assert values["objective"]["iterations"] == 5 and values["objective"]["approve"] is False
    assert (run_root / thread["thread_id"] / "baseline" / "model.safetensors").exists()


@pytest.mark.slow
def test_full_run_with_approval_from_studio(studio):
    from langgraph_sdk import get_sync_client

    client = get_sync_client(url=studio["url"], api_key=None, timeout=RUN_TIMEOUT)
    thread_id = client.threads.create()["thread_id"]
    run_root = studio["tmp"] / "runs"
    context = {"run_root": str(run_root), **FAST_CONTEXT, "backend": "torch"}  # Studio, not the runtimes, under test
    inputs = {
        "model": {"ref": str(studio["model"])},
        "dataset": {"ref": str(studio["dataset"]), "subset": 64, "calibration": 16, "test_subset": 32},
        "objective": {"planner": "deterministic", "iterations": 1, "approve": True},
    }

    def stream(**kw):
        nodes, progress, interrupts = [], [], []
        for part in client.runs.stream(
            thread_id, "profiling_agent", context=context, stream_mode=["updates", "custom"], **kw
        ):
            if part.event == "updates":
                for node, value in part.data.items():
                    (interrupts.extend(value) if node == "__interrupt__" else nodes.append(node))
            elif part.event == "custom":
                progress.append(part.data)
            assert part.event != "error", part.data
        return nodes, progress, interrupts

    nodes, progress, interrupts = stream(input=inputs)
    assert nodes == [
        "acquire",
        "resolve_input_shape",
        "prepare_data",
        "profile",
        "probe_sensitivity",
        "measure_baseline",
        "analyze",
    ]
    assert any(p.get("kind") == "progress" and p.get("task") == "sensitivity probe" for p in progress)
    request = interrupts[0]["value"]
    assert request["kind"] == "approve_plan" and request["iteration"] == 1
    assert request["plan"]["pruning"] and set(request["estimate"]) == {"params", "macs", "latency"}
    assert request["estimate"]["params"] > 0

    # an unsafe edited plan is refused with the reason, and the run keeps waiting
    bad = {"pruning": [{"layer": "(a+)+$", "type": "structured", "ratio": 0.3}]}
    nodes, _, interrupts = stream(command={"resume": {"decision": "edit", "plan": bad}})
    assert "catastrophic" in interrupts[0]["value"]["error"]
    assert client.threads.get_state(thread_id)["next"] == ["approve"]

    nodes, progress, interrupts = stream(command={"resume": {"decision": "approve"}})
    assert not interrupts
    assert nodes == ["approve", "prune", "recover", "quantize", "evaluate", "iterate", "evaluate_held_out", "report"]
    assert {p["task"] for p in progress} >= {"iteration 1: evaluating", "final latency (all models side by side)"}

    state = client.threads.get_state(thread_id)
    values = state["values"]
    assert state["next"] == [] and values["status"] == "done"
    best = values["best"]
    approved = values["candidates"][0]
    assert approved["iteration"] == 1 and approved["review"]["decision"] == "approve"
    if best["iteration"] == 1:  # the approved candidate, delivered
        assert best["review"]["decision"] == "approve" and best["eval"]["params"] < values["baseline_eval"]["params"]
    else:  # it missed the budget or added nothing: best/ holds the unpruned model's fastest form, saying why
        assert best["iteration"] == 0 and best["eval"]["delivery_note"].startswith("quantization only")
    best_dir = run_root / thread_id / "best"
    form = best["eval"]["delivered"]  # the delivered form: ONNX Runtime, OpenVINO or torch
    marker = "model.onnx" if form.startswith("ort_") else "openvino_model.xml" if form.startswith("ov_") else None
    assert (best_dir / (marker or "model.safetensors")).exists()
    from profiling_agent.tools.io import sha256_path

    delivered = best.get("delivered") or best["artifact"]
    assert sha256_path(run_root / thread_id / delivered["path"]) == delivered["sha256"]
    assert sha256_path(best_dir) == delivered["sha256"]
