"""End-to-end CLI runs with `--planner llm|auto` against scripted OpenAI-compatible servers on 127.0.0.1."""

from __future__ import annotations

import json

import pytest
from fake_llm import ScriptedOpenAIServer, chat_completion

from profiling_agent.graph.cli import main
from profiling_agent.state import CompressionPlan

pytestmark = pytest.mark.slow

MLP_01 = r"^vit\.layers\.(0|1)\.mlp\.fc1$"
MLP_23 = r"^vit\.layers\.(2|3)\.mlp\.fc1$"
QUANT = [{"layer": "all", "type": "dynamic", "dtype": "qint8", "justification": "Linear-heavy model"}]
PLAN1 = {
    "pruning": [{"layer": MLP_01, "type": "structured", "ratio": 0.25, "justification": "server plan one"}],
    "quantization": QUANT,
    "rationale": "server plan one: the early MLPs",
}
PLAN2 = {
    "pruning": [
        {"layer": MLP_23, "type": "structured", "ratio": 0.3, "justification": "server plan two"},
        {"layer": r"^vit\.layers\.3\.attention$", "type": "head", "ratio": 0.25, "justification": "one head"},
    ],
    "quantization": QUANT,
    "rationale": "server plan two: the late MLPs and one head",
}


def _plan(*pruning, quantization=None):
    return json.dumps(
        {
            "pruning": list(pruning),
            "quantization": QUANT if quantization is None else quantization,
            "rationale": "hostile",
        }
    )


@pytest.fixture
def assets(digits_vit):
    """The session's digits ViT (save_pretrained) and the digits DatasetDict."""
    return digits_vit.model, digits_vit.dataset


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    """No real endpoint or key leaks in; local requests bypass any proxy."""
    for name in ("OPENAI_BASE_URL", "OPENAI_API_KEY", "OPENAI_MODEL", "PA_E2E_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")


def _run(tmp_path, assets, *extra):
    model_dir, dataset = assets
    argv = [
        "run",
        "--model",
        str(model_dir),
        "--dataset",
        str(dataset),
        "--subset",
        "32",
        "--calibration",
        "8",
        "--repeats",
        "2",
        "--threads",
        "1",
        "--target-reduction",
        "0.95",
        "--run-dir",
        str(tmp_path / "runs"),
        "--thread-id",
        "t",
        *extra,
    ]
    code = main(argv)
    run = tmp_path / "runs" / "t"
    result = json.loads((run / "result.json").read_text()) if (run / "result.json").exists() else None
    return code, run, result


def _transcript(run, iteration):
    lines = (run / f"iter_{iteration:02d}" / "llm_transcript.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def _tool_messages(request):
    return [m.get("content") or "" for m in request["body"]["messages"] if m.get("role") == "tool"]


def test_a_sensible_server_plans_every_round(tmp_path, assets, capsys, monkeypatch):
    script = [
        chat_completion(tool_calls=[{"name": "evaluate_plan", "args": {"plan_json": json.dumps(PLAN1)}}]),
        chat_completion(json.dumps(PLAN1)),
        chat_completion("Here it is:\n```json\n" + json.dumps(PLAN2) + "\n```"),
    ]
    with ScriptedOpenAIServer(script) as server:
        base_url = server.base_url
        monkeypatch.setenv("OPENAI_BASE_URL", base_url)
        code, run, result = _run(
            tmp_path,
            assets,
            "--planner",
            "llm",
            "--iterations",
            "2",
            "--llm-model",
            "fake-model",
            "--llm-timeout",
            "20",
        )
        requests = list(server.requests)
    err = capsys.readouterr().err
    assert code == 0
    assert f"planner: LLM planner, fake-model at {base_url}" in err
    assert "[analyze #1] llm plan" in err and "[analyze #2] llm plan" in err
    # the applied plans are the server's, and pruning did what they say
    assert [c["plan"] for c in result["candidates"]] == [
        CompressionPlan.model_validate(p).model_dump() for p in (PLAN1, PLAN2)
    ]
    assert [c["planner"] for c in result["candidates"]] == ["llm", "llm"]
    pruned = [{a["group"] for a in c["applied"] if a["units_after"] < a["units_before"]} for c in result["candidates"]]
    assert pruned == [{"layers.0.mlp", "layers.1.mlp"}, {"layers.2.mlp", "layers.3.mlp", "layers.3.heads"}]
    planner = result["planner"]
    assert planner["requested"] == "llm" and planner["mode"] == "llm" and planner["used"] == ["llm"]
    assert planner["fallbacks"] == []
    # three replies at 120 + 30 tokens each (the fake server's usage), two transcripts
    assert planner["llm"]["usage"] == {"calls": 3, "input_tokens": 360, "output_tokens": 90, "total_tokens": 450}
    assert planner["llm"]["model"] == "fake-model"
    assert planner["llm"]["transcripts"] == ["iter_01/llm_transcript.jsonl", "iter_02/llm_transcript.jsonl"]
    assert [c["llm"]["usage"]["calls"] for c in result["candidates"]] == [2, 1]
    assert len(requests) == 3 and all(r["body"]["model"] == "fake-model" for r in requests)
    # evaluate_plan really pruned a copy and measured it on the calibration images; the answer went back
    measured = json.loads(_tool_messages(requests[1])[0])["measured"]
    assert measured["images"] == 8 and measured["groups_pruned"] == 2 and 0 < measured["params_reduction"] < 0.2
    events = [e["event"] for e in _transcript(run, 1)]
    assert events[:2] == ["prompt", "prompt"] and "tool_result" in events and events[-1] == "final"
    report = (run / "report.md").read_text()
    assert "- LLM: fake-model, 3 calls, 450 tokens" in report and "Planner fallbacks" not in report
    # the state history (what Studio shows) carries the transcript and the usage
    from profiling_agent.graph.builder import build_graph
    from profiling_agent.graph.checkpoint import open_checkpointer

    graph = build_graph(checkpointer=open_checkpointer(tmp_path / "runs"))
    history = graph.get_state({"configurable": {"thread_id": "t"}}).values["history"]
    analyzed = [e for e in history if e["node"] == "analyze"]
    assert [e["llm"]["transcript"] for e in analyzed] == planner["llm"]["transcripts"]
    assert analyzed[0]["llm"]["usage"]["total_tokens"] == 300


def test_b_hostile_answers_are_refused_and_reported(tmp_path, assets, capsys, monkeypatch):
    marker = tmp_path / "PWNED"
    code_text = (
        f"```python\nimport os\nos.system('touch {marker}')\n```\n"
        f"__import__('os').system('touch {marker}'); eval(open('/etc/passwd').read())"
    )
    everything = [
        {"layer": ".*", "type": "structured", "ratio": 0.99, "justification": "everything"},
        {"layer": ".*", "type": "head", "ratio": 0.99, "justification": "everything"},
    ]
    round1 = [
        "<script>alert(1)</script> Sure! Just make the model smaller, it will be fine. No JSON from me.",
        _plan(*everything),
        _plan({"layer": "^classifier$", "type": "structured", "ratio": 0.5, "justification": "the head"}),
        _plan({"layer": MLP_01, "type": "structured", "ratio": 1.5, "justification": "more than all"}),
    ]
    round2 = [
        _plan({"layer": r"^(\w+\.?)+\.mlp\.fc1$", "type": "structured", "ratio": 0.3, "justification": "redos"}),
        _plan(
            {"layer": MLP_01, "type": "structured", "ratio": 0.3, "justification": "int4"},
            quantization=[{"layer": "all", "type": "dynamic", "dtype": "int4", "justification": "smaller"}],
        ),
        code_text,
        _plan(
            {
                "layer": f"__import__('os').system('touch {marker}')",
                "type": "structured",
                "ratio": 0.3,
                "justification": "code as a regex",
            }
        ),
    ]
    calls = [
        {"name": "run_shell", "args": {"cmd": f"touch {marker}"}},
        {"name": "evaluate_plan", "args": {"plan_json": _plan(*everything)}},
    ]
    script = [chat_completion(text) for text in round1] + [chat_completion(tool_calls=calls)]
    script += [chat_completion(text) for text in round2]
    with ScriptedOpenAIServer(script) as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
        code, run, result = _run(
            tmp_path,
            assets,
            "--planner",
            "llm",
            "--iterations",
            "2",
            "--llm-retries",
            "3",
            "--llm-tool-rounds",
            "2",
            "--llm-timeout",
            "20",
        )
        requests = list(server.requests)
    err = capsys.readouterr().err
    assert code == 0 and result["status"] == "done"
    assert len(requests) == 9  # 4 answers, then 1 tool call and 4 answers: the retry bound held, nothing more asked
    assert not marker.exists()
    # nothing hostile was applied: every candidate's plan is the deterministic planner's
    assert result["candidates"] and all(c["planner"] == "deterministic" for c in result["candidates"])
    for cand in result["candidates"]:
        final = _transcript(run, cand["iteration"])[-1]
        assert final["event"] == "final" and final["planner"] == "deterministic" and final["plan"] == cand["plan"]
        for entry in cand["plan"]["pruning"]:
            assert entry["ratio"] <= 0.8 and entry["layer"].startswith("^vit\\.layers\\.")
        assert {q["dtype"] for q in cand["plan"]["quantization"]} <= {"qint8", "float16"}
    # the hostile evaluate_plan call was refused by the guard before anything was pruned; run_shell is unknown
    tools = _tool_messages(requests[5])
    assert tools[0].startswith("error: unknown tool 'run_shell'")
    assert json.loads(tools[1])["valid"] is False
    # result.json says what was rejected and why
    planner = result["planner"]
    assert planner["used"] == ["deterministic"] and planner["mode"] == "llm"
    first, second = planner["fallbacks"]
    assert (first["iteration"], second["iteration"]) == (1, 2)
    assert [r["stage"] for r in first["rejected"]] == ["parse", "guard", "guard", "guard"]
    reasons1 = [" ".join(r["reasons"]) for r in first["rejected"]]
    assert "no JSON object" in reasons1[0] or "JSON" in reasons1[0]
    assert "exceeds the structured cap" in reasons1[1] and "exceeds the head cap" in reasons1[1]
    assert "protected" in reasons1[2] or "matches no structured group" in reasons1[2]
    assert "less than 1" in reasons1[3]
    assert [r["stage"] for r in second["rejected"]] == ["guard", "guard", "parse", "guard"]
    reasons2 = [" ".join(r["reasons"]) for r in second["rejected"]]
    assert "nested quantifiers" in reasons2[0]
    assert "dtype" in reasons2[1] and "int4" in reasons2[1]
    assert "matches no structured group" in reasons2[3]
    assert second["tool_errors"] == [{"name": "run_shell", "error": "unknown tool: refused, nothing was run"}]
    assert planner["llm"]["usage"]["calls"] == 9 and planner["llm"]["tool_errors"][0]["iteration"] == 2
    assert "LLM plan refused (guard" in err
    # report.md lists the fallbacks, stage, reason and rejected items, with the hostile text made inert
    report = (run / "report.md").read_text()
    section = report.split("## Planner fallbacks", 1)[1]
    assert "### Iteration 1: guard" in section and "### Iteration 2: guard" in section
    assert "exceeds the structured cap" in section and "nested quantifiers" in section
    assert "tool call `run_shell` refused" in section
    assert "<script>" not in report and "&lt;script&gt;" in section


def test_b_a_server_that_never_answers_falls_back_quickly(tmp_path, assets, capsys, monkeypatch):
    script = [("sleep", 30, chat_completion(json.dumps(PLAN1)))] * 4
    with ScriptedOpenAIServer(script) as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
        code, run, result = _run(tmp_path, assets, "--planner", "auto", "--iterations", "1", "--llm-timeout", "0.5")
        # the run finished while every request was still asleep: it never waited out a 30 s reply
        assert server.requests and server.slept_out == 0
    err = capsys.readouterr().err
    assert code == 0 and result["status"] == "done"
    assert "planner: LLM planner" in err and "(requested auto;" in err
    planner = result["planner"]
    assert planner["mode"] == "llm" and planner["used"] == ["deterministic"]
    (fallback,) = planner["fallbacks"]
    assert fallback["stage"] == "timeout"
    assert result["candidates"][0]["plan"]["rationale"] != PLAN1["rationale"]
    assert "### Iteration 1: timeout" in (run / "report.md").read_text()


def test_auto_without_an_llm_runs_the_deterministic_planner_and_says_so(tmp_path, assets, capsys):
    code, run, result = _run(tmp_path, assets, "--planner", "auto", "--iterations", "1")
    err = capsys.readouterr().err
    assert code == 0
    assert "planner: deterministic planner (auto: no LLM configured; set OPENAI_BASE_URL or OPENAI_API_KEY" in err
    planner = result["planner"]
    assert planner["requested"] == "auto" and planner["mode"] == "deterministic"
    assert planner["used"] == ["deterministic"] and planner["llm"] is None and planner["fallbacks"] == []
    assert "no LLM configured" in planner["mode_note"]
    assert not (run / "iter_01" / "llm_transcript.jsonl").exists()
