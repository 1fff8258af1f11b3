"""End-to-end CLI runs with `--planner llm|auto` against scripted OpenAI-compatible servers on 127.0.0.1."""

from __future__ import annotations

import json
import re
import socket

import pytest
from helpers.fake_llm import ScriptedOpenAIServer, chat_completion

from profiling_agent.graph.cli.main import main
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
        # held-out images only report the result and no test reads a chart: a few of them, and no charts drawn
        "--test-subset",
        "32",
        "--no-plots",
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
        # the planner, not the runtimes or recovery, is under test: torch forms only (every form is exercised in
        # test_graph) and the least-squares refit without distillation (tests/e2e/test_recover_node.py has that)
        "--backend",
        "torch",
        "--recover",
        "reconstruct",
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


PLAN_BIG = {  # predicted to remove more than half of the 95% objective: the first plan's floor
    "pruning": [
        {"layer": r"^vit\.layers\.\d+\.mlp\.fc1$", "type": "structured", "ratio": 0.8, "justification": "all MLPs"},
        {"layer": r"^vit\.layers\.\d+\.attention$", "type": "head", "ratio": 0.75, "justification": "3 of 4 heads"},
    ],
    "quantization": QUANT,
    "rationale": "server plan one, after the floor sent the timid one back",
}


def test_a_sensible_server_plans_every_round_beside_the_deterministic_sequence(tmp_path, assets, capsys, monkeypatch):
    script = [
        chat_completion(tool_calls=[{"name": "evaluate_plan", "args": {"plan_json": json.dumps(PLAN1)}}]),
        chat_completion(json.dumps(PLAN1)),  # under half the target: sent back with the numbers
        chat_completion(json.dumps(PLAN_BIG)),
        chat_completion("Here it is:\n```json\n" + json.dumps(PLAN2) + "\n```"),
    ]
    with ScriptedOpenAIServer(script, lifetime=1800) as server:
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
    assert "[analyze #1] llm plan" in err and "[analyze #3] llm plan" in err
    assert "(LLM plan applied: the LLM's own plan, accepted by the guard)" in err  # round 3, said plainly
    assert "[analyze #2] reference round" in err and "[analyze #4] reference round" in err
    # LLM turns apply the server's plans; each is followed by the deterministic planner's own next round
    cands = result["candidates"]
    assert [c["planner"] for c in cands] == ["llm", "deterministic", "llm", "deterministic"]
    assert [c["turn"] for c in cands] == ["llm", "reference", "llm", "reference"]
    assert [cands[0]["plan"], cands[2]["plan"]] == [
        CompressionPlan.model_validate(p).model_dump() for p in (PLAN_BIG, PLAN2)
    ]
    # round 1 offered the deterministic round's alternatives (its trials backed off below the floor, which applies to
    # written plans only) and its repair listed them again: the answer is compared with them; round 3 asked for none
    assert cands[0]["vs_proposal"]["verdict"] == "own" and cands[0]["vs_proposal"]["proposals"] == 0
    assert cands[2]["vs_proposal"]["verdict"] == "own" and cands[2]["vs_proposal"]["proposals"] == 0
    assert "after 1 answer(s) sent back" in cands[0]["llm"]["applied"]
    pruned = [{a["group"] for a in c["applied"] if a["units_after"] < a["units_before"]} for c in cands[::2]]
    assert pruned[1] == {"layers.2.mlp", "layers.3.mlp", "layers.3.heads"} and len(pruned[0]) == 8
    assert "iteration bound reached (2 rounds of each planner)" in result["stop_reason"]
    planner = result["planner"]
    assert planner["requested"] == "llm" and planner["mode"] == "llm"
    assert planner["used"] == ["deterministic", "llm"] and planner["fallbacks"] == []
    # four replies at 120 + 30 tokens each (the fake server's usage), two transcripts
    assert planner["llm"]["usage"] == {"calls": 4, "input_tokens": 480, "output_tokens": 120, "total_tokens": 600}
    assert planner["llm"]["model"] == "fake-model"
    assert planner["llm"]["transcripts"] == ["iter_01/llm_transcript.jsonl", "iter_03/llm_transcript.jsonl"]
    assert [c["llm"]["usage"]["calls"] for c in cands[::2]] == [3, 1]
    assert len(requests) == 4 and all(r["body"]["model"] == "fake-model" for r in requests)
    # evaluate_plan really pruned a copy and measured it on the trial slice of the validation rows; the answer went
    # back
    measured = json.loads(_tool_messages(requests[1])[0])["measured"]
    trial = json.loads((run / "subsets.json").read_text())["trial"]
    n_trial = len(trial["indices"]) if isinstance(trial, dict) else len(trial)
    assert measured["images"] == n_trial and measured["groups_pruned"] == 2 and 0 < measured["params_reduction"] < 0.2
    floor = requests[2]["body"]["messages"][-1]["content"]
    assert "predicted to remove" in floor and "less than 50% of the objective's 95%" in floor
    assert "The alternatives offered above, again:" in floor and "A (default: the deterministic proposal)" in floor
    events = [e["event"] for e in _transcript(run, 1)]
    assert events[:2] == ["prompt", "prompt"] and "tool_result" in events and events[-1] == "final"
    report = (run / "report.md").read_text()
    assert "- LLM: fake-model, 4 calls, 600 tokens" in report and "Planner fallbacks" not in report
    # far from every alternative offered; the closest one (how many were offered and at which goal follows this
    # machine's trials) and what the plan changed from it are named
    for iteration in (1, 3):
        line = rf"- Iteration {iteration}: LLM plan own vs the closest of the \d alternatives offered, at goal \d+%: \S"
        assert re.search(line, report), report
    assert "- Iteration 2: reference round" in report
    # the state history (what Studio shows) carries the transcript and the usage
    from profiling_agent.graph.builder import build_graph
    from profiling_agent.graph.checkpoint import open_checkpointer

    graph = build_graph(checkpointer=open_checkpointer(tmp_path / "runs"))
    history = graph.get_state({"configurable": {"thread_id": "t"}}).values["history"]
    analyzed = [e for e in history if e["node"] == "analyze" and e.get("llm")]
    assert [e["llm"]["transcript"] for e in analyzed] == planner["llm"]["transcripts"]
    assert analyzed[0]["llm"]["usage"]["total_tokens"] == 450
    # never worse than the fallback: the best is chosen over both sequences (the deterministic sequence's plans
    # repeat with the same seed: tests/e2e/test_same_plan.py)
    best = result["best"]
    assert best["iteration"] in [c["iteration"] for c in cands]
    if best["within_budget"]:  # no candidate of either sequence is as accurate and smaller
        scored = [c for c in cands if c["accuracy"] is not None and c["params"] is not None]
        assert all(c["params"] >= best["params"] for c in scored if c["accuracy"] >= best["accuracy"])


def test_explicit_llm_that_is_never_reached_stops_with_one_line(tmp_path, assets, capsys):
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}/v1"
    code, run, _ = _run(tmp_path, assets, "--planner", "llm", "--iterations", "1", "--llm-base-url", url)
    err = capsys.readouterr().err
    assert code == 2
    (line,) = [x for x in err.splitlines() if x.startswith("profiling-agent:")]
    assert "--planner llm: the LLM gpt-4o at " + url in line and "could not be used" in line
    assert "structured output" not in err and "Traceback" not in err
    assert not (run / "iter_01" / "plan.json").exists()  # nothing was applied


def test_explicit_llm_answering_garbage_fails_with_one_line_and_auto_falls_back(tmp_path, assets, capsys, monkeypatch):
    garbage = [(200, {"not": "a chat completion"})] * 8
    with ScriptedOpenAIServer(garbage, lifetime=1800) as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
        code, _, _ = _run(tmp_path / "llm", assets, "--planner", "llm", "--iterations", "1", "--llm-timeout", "5")
    err = capsys.readouterr().err
    assert code == 1
    (line,) = [x for x in err.splitlines() if x.startswith("profiling-agent:")]
    assert "LLMUnreachable: --planner llm: the LLM gpt-4o at" in line and "never gave a usable reply" in line
    assert "structured output" not in err
    with ScriptedOpenAIServer(garbage, lifetime=1800) as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
        code, _, result = _run(tmp_path / "auto", assets, "--planner", "auto", "--iterations", "1")
    err = capsys.readouterr().err
    assert code == 0 and result["planner"]["used"] == ["deterministic"]
    assert "[LLM: no reply;" in err and "structured output" not in err


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
    # the first answer is a plan: a first answer in prose would end the tools for the run (round 2 uses them)
    round1 = [
        _plan(*everything),
        "<script>alert(1)</script> Sure! Just make the model smaller, it will be fine. No JSON from me.",
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
    with ScriptedOpenAIServer(script, lifetime=1800) as server:
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
    assert [r["stage"] for r in first["rejected"]] == ["guard", "parse", "guard", "guard"]
    reasons1 = [" ".join(r["reasons"]) for r in first["rejected"]]
    assert "exceeds the structured cap" in reasons1[0] and "exceeds the head cap" in reasons1[0]
    assert "no JSON object" in reasons1[1] or "JSON" in reasons1[1]
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
    script = [("sleep", 300, chat_completion(json.dumps(PLAN1)))] * 4
    with ScriptedOpenAIServer(script, lifetime=1800) as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
        code, run, result = _run(tmp_path, assets, "--planner", "auto", "--iterations", "1", "--llm-timeout", "0.5")
        # the run finished while every request was still asleep: it never waited out a 300 s reply
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


PLAN_MLP = {  # every MLP at 0.3: about a fifth of the params, a plan the budget keeps
    "pruning": [
        {"layer": r"^vit\.layers\.\d+\.mlp\.fc1$", "type": "structured", "ratio": 0.3, "justification": "MLPs"}
    ],
    "quantization": QUANT,
    "rationale": "the MLPs, lightly",
}


def test_a_plan_measured_before_is_built_once(tmp_path, assets, capsys):
    """Round 3's LLM plan is round 1's again: the turn records round 1's model and figures instead of a rebuild.

    The same holds for a reference round that plans what the LLM turn before it copied (`paired.repeated_round`).
    """
    script = [chat_completion(json.dumps(PLAN_MLP)), chat_completion(json.dumps(PLAN_MLP))]
    with ScriptedOpenAIServer(script) as server:
        argv = ["--planner", "llm", "--iterations", "2", "--llm-model", "fake-model", "--target-reduction", "0.2"]
        code, run, result = _run(tmp_path, assets, *argv, "--llm-base-url", server.base_url)
    err = capsys.readouterr().err
    assert code == 0, err[-2000:]
    cands = result["candidates"]
    assert [c["turn"] for c in cands] == ["llm", "reference", "llm", "reference"]
    first, third = cands[0], cands[2]
    assert CompressionPlan.model_validate(third["plan"]).effect() == CompressionPlan.model_validate(PLAN_MLP).effect()
    assert first["status"] == third["status"] == "ok"
    # one model, one set of measurements: iteration 3 records iteration 1's files and figures
    assert third["path"] == first["path"] and third["path"].startswith("iter_01/")
    assert (third["accuracy"], third["params"]) == (first["accuracy"], first["params"])
    assert not [p for p in (run / "iter_03").rglob("*.safetensors")]  # nothing pruned, recovered or saved again
    assert "the plan of iteration 1 again" in err and "[prune #3]" not in err and "[evaluate #3]" not in err
    assert [p for p in (run / "iter_02").rglob("*.safetensors")]  # the reference round's own plan was built
    report = (run / "report.md").read_text()
    assert "the plan of iteration 1 again: its model and measurements, built once" in report
