"""Schema-constrained answers against fake OpenAI-compatible servers that behave like real ones.

llama-cpp-python's server answers `response_format: {"type": "json_schema"}` with a 500 validation error and
constrains `{"type": "json_object", "schema": ...}`; other servers ignore `response_format` altogether.
"""

from __future__ import annotations

import json
import re

import pytest
from helpers.fake_llm import (
    ScriptedOpenAIServer,
    chat_completion,
    kinds_of,
    probe_records,
    vit_profile,
    vit_sensitivity,
)

from profiling_agent.nodes.analyze import round_inputs
from profiling_agent.state import Candidate, Context, Objective, PlannerMeta, PlanningProblem, State
from profiling_agent.tools.planning.deterministic import plan_round
from profiling_agent.tools.planning.llm_planner import plan_with_llm
from profiling_agent.tools.planning.structured import (
    MAX_JUSTIFICATION,
    MAX_RATIONALE,
    ModeFinder,
    answer_token_limit,
    plan_schema,
    refuses_format,
)

PROFILE = vit_profile(n_layers=2)
SENS = vit_sensitivity(PROFILE)
GROUP_PLAN = {
    "pruning": [{"groups": ["layers.0.mlp", "layers.1.mlp"], "type": "structured", "ratio": 0.5, "justification": "x"}],
    "quantization": [{"layer": "all", "type": "dynamic", "dtype": "qint8", "justification": "Linear-heavy"}],
    "rationale": "prune both MLPs",
}
PROSE = "I would prune the MLP layers by about 40% and quantize everything to int8."
LLAMA_CPP_500 = (
    500,
    {
        "error": {
            "message": "1 validation error: {'type': 'literal_error', 'loc': ('body', 'response_format', 'type'), "
            "'msg': \"Input should be 'text' or 'json_object'\", 'input': 'json_schema'}",
            "type": "internal_server_error",
        }
    },
)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in ("OPENAI_BASE_URL", "OPENAI_API_KEY", "OPENAI_MODEL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")


def llama_cpp_like(reply_under_schema: str, reply_plain: str = PROSE):
    """A server that refuses json_schema, constrains json_object + schema, and otherwise writes `reply_plain`."""

    def answer(body):
        fmt = body.get("response_format") or {}
        if fmt.get("type") == "json_schema":
            return LLAMA_CPP_500
        if fmt.get("type") == "json_object" and "schema" in fmt:
            return chat_completion(content=reply_under_schema)
        return chat_completion(content=reply_plain)

    return answer


def ignoring(reply: str):
    """A server that ignores response_format and always writes `reply`."""
    return lambda body: chat_completion(content=reply)


def plan_with(server, tmp_path, *, structured="auto", retries=2, state=None):
    state = state or State(run_path=str(tmp_path), family="vit", objective=Objective())
    fallback = plan_round(PlanningProblem.of(PROFILE["groups"], PROFILE["group_costs"], SENS, state.objective, []))
    ctx = Context(
        llm_base_url=server.base_url,
        llm_timeout=5,
        llm_retries=retries,
        llm_tool_rounds=2,
        llm_structured=structured,
        llm_api_key_env="PA_STRUCTURED_UNSET",
    )
    return plan_with_llm(round_inputs(state, state.iteration), ctx, PROFILE, probe_records(SENS), fallback), fallback


def formats(server):
    return [(r["body"].get("response_format") or {}).get("type") for r in server.requests]


def test_a_server_refusing_json_schema_is_driven_through_json_object(tmp_path):
    with ScriptedOpenAIServer([llama_cpp_like(json.dumps(GROUP_PLAN))] * 6) as server:
        outcome, _ = plan_with(server, tmp_path)
    assert outcome.planner == "llm" and not outcome.fallbacks
    assert {(e.layer, e.ratio) for e in outcome.plan.pruning} == {
        (r"^vit\.layers\.0\.mlp\.fc1$", 0.5),
        (r"^vit\.layers\.1\.mlp\.fc1$", 0.5),
    }
    # plain first (tools offered), then json_schema (refused with a 500, not retried), then json_object
    assert formats(server) == [None, "json_schema", "json_object"]
    sent = server.requests[-1]["body"]
    # every request is capped at the longest plan this model's schema allows (OpenAI's name and the older one)
    limit = answer_token_limit(sent["response_format"]["schema"])
    assert all(r["body"]["max_completion_tokens"] == r["body"]["max_tokens"] == limit for r in server.requests)
    assert 256 < limit < 2048
    schema = sent["response_format"]["schema"]
    assert schema["required"] == ["choice", "why"]  # a choice of an offered alternative, or "own" with a plan
    assert "tools" not in sent and [k for k in schema["properties"] if k not in ("choice", "why")] == [
        "pruning",
        "quantization",
        "rationale",
    ]
    assert outcome.structured["mode"] == "json_object" and outcome.structured["confirmed"]
    assert outcome.structured["given_up"][0]["mode"] == "json_schema"
    assert "refused by the server" in outcome.structured["given_up"][0]["why"]
    assert outcome.summary("m").structured == outcome.structured  # what result.json records


def test_a_server_ignoring_response_format_falls_back_with_the_reason(tmp_path):
    with ScriptedOpenAIServer([ignoring(PROSE)] * 4) as server:
        outcome, fallback = plan_with(server, tmp_path)
    assert outcome.planner == "deterministic" and outcome.plan == fallback.plan
    record = outcome.fallbacks[0]
    assert record.stage == "parse" and "no JSON object found" in record.reason
    assert formats(server) == [None, "json_schema", "json_object"]  # each mode tried once, then given up
    assert [r["structured"] for r in record.rejected] == ["off", "json_schema", "json_object"]
    # the plain json_object ("json") would have come next, had the step any retries left
    assert outcome.structured["mode"] == "json" and not outcome.structured["confirmed"]
    assert [g["mode"] for g in outcome.structured["given_up"]] == ["json_schema", "json_object"]


def test_a_no_op_plan_is_refused_then_its_repeat_falls_back_with_the_reason(tmp_path):
    no_op = json.dumps({"pruning": [], "quantization": [], "rationale": "nothing to do"})
    with ScriptedOpenAIServer([ignoring(no_op)] * 3) as server:
        outcome, _ = plan_with(server, tmp_path)
    assert outcome.planner == "deterministic"
    record = outcome.fallbacks[0]
    assert record.stage == "guard" and len(record.rejected) == 2  # the same no-op twice: not sent back again
    assert "prunes nothing" in record.reason and "40% fewer parameters" in record.reason
    assert record.reason.startswith("the answer repeated a plan already refused")
    assert outcome.structured["confirmed"]  # the JSON parsed under json_schema: that mode works on this server


def test_a_forced_mode_is_used_first_and_a_confirmed_mode_is_remembered(tmp_path):
    with ScriptedOpenAIServer([llama_cpp_like(json.dumps(GROUP_PLAN))] * 3) as server:
        outcome, _ = plan_with(server, tmp_path, structured="json_object")
    assert outcome.planner == "llm" and formats(server) == [None, "json_object"]
    assert outcome.tools_dropped  # the first answer (tools offered) was no plan: later rounds ask without tools
    meta = PlannerMeta(llm=outcome.summary("m"))
    later = State(
        run_path=str(tmp_path),
        family="vit",
        objective=Objective(),
        iteration=1,
        candidates=[Candidate(iteration=1, planner="llm", planner_meta=meta)],
    )
    with ScriptedOpenAIServer([llama_cpp_like(json.dumps(GROUP_PLAN))] * 3) as server:
        outcome, _ = plan_with(server, tmp_path, state=later)
    assert formats(server) == ["json_object"]  # round 2 starts from the mode round 1 confirmed, without tools
    assert outcome.planner == "llm"


def test_refusal_detection_and_mode_order():
    assert refuses_format(400, "response_format json_schema is not supported")
    assert refuses_format(500, "validation error ... response_format ... json_object")
    assert not refuses_format(500, "internal error")  # a crash is a failure, not a refused format
    assert not refuses_format(401, "bad key") and not refuses_format(None, "connection refused")
    finder = ModeFinder()
    assert finder.mode == "json_schema" and finder.give_up("x") and finder.mode == "json_object"
    assert finder.give_up("y") and finder.mode == "json"  # plain json_object only after the schema-carrying ones
    assert finder.give_up("z") and finder.mode == "off" and not finder.give_up("w")
    forced = ModeFinder("json_object")
    assert forced.mode == "json_object" and not forced.give_up("refused")  # a forced mode is never dropped


def test_the_schema_bounds_what_grammar_decoders_cannot():
    from profiling_agent.tools.planning.structured import plan_schema, ratio_grid

    assert ratio_grid(0.01, 0.8) == [round(0.05 * k, 2) for k in range(1, 17)]
    linears = ["vit.layers.0.mlp.fc1", "classifier"]
    schema = plan_schema(kinds_of(PROFILE["groups"]), ("qint8",), {"structured": 0.8, "head": 0.75}, 0.01, linears)
    shapes = {
        e["properties"]["type"]["enum"][0]: e["properties"] for e in schema["properties"]["pruning"]["items"]["anyOf"]
    }
    assert max(shapes["structured"]["ratio"]["enum"]) == 0.8 and 2 not in shapes["structured"]["ratio"]["enum"]
    assert max(shapes["head"]["ratio"]["enum"]) == 0.75  # each kind's cap; a real 135M model wrote ratio 2
    assert shapes["head"]["justification"]["maxLength"] <= 300 and schema["properties"]["rationale"]["maxLength"]
    assert schema["properties"]["pruning"]["maxItems"] == len(PROFILE["groups"])  # no endless list of entries
    # a head group can only be named under type "head" (the same real model wrote "structured" for heads)
    kinds = {g["name"]: g["kind"] for g in PROFILE["groups"]}
    for kind, entry in shapes.items():
        assert entry["groups"]["items"]["enum"] and {kinds[n] for n in entry["groups"]["items"]["enum"]} == {kind}
    quant = schema["properties"]["quantization"]["items"]["properties"]
    assert quant["layer"]["enum"] == ["all", *linears] and quant["dtype"]["enum"] == ["qint8"]  # never ""
    # bounded: SmolLM2-135M wrote entries until the token limit cut its answer
    assert schema["properties"]["quantization"]["maxItems"] == 2


def test_a_constrained_answer_cut_off_at_the_token_limit_is_retried_with_the_reason(tmp_path):
    cut = chat_completion(content='{"pruning": [{"groups": ["layers.0.mlp"], "type": "structured", "ratio": 0.4')
    cut["choices"][0]["finish_reason"] = "length"  # what a server sends when max_tokens ends the answer

    def answer(body):
        if (body.get("response_format") or {}).get("type") != "json_schema":
            return chat_completion(content=PROSE)
        return (
            cut
            if len([r for r in server.requests if r["body"].get("response_format")]) == 1
            else (chat_completion(content=json.dumps(GROUP_PLAN)))
        )

    with ScriptedOpenAIServer([answer] * 4) as server:
        outcome, _ = plan_with(server, tmp_path)
    assert outcome.planner == "llm"  # the retry after the cut-off answer gave the plan
    retry = server.requests[-1]["body"]["messages"][-1]["content"]
    cap = re.search(r"cut off at the token limit \((\d+) tokens\)", retry)
    assert cap and int(cap.group(1)) == server.requests[-1]["body"]["max_tokens"]  # the limit the request had


def test_a_rambling_refused_answer_is_cut_short_in_the_retry_conversation(tmp_path):
    from profiling_agent.tools.planning.llm_session import MAX_REFUSED_IN_HISTORY

    ramble = "Let me think about which layers matter most. " * 300  # ~13,500 characters, no JSON: a 3k-token ramble
    script = [chat_completion(content=ramble), llama_cpp_like(json.dumps(GROUP_PLAN))]
    with ScriptedOpenAIServer(script + [llama_cpp_like(json.dumps(GROUP_PLAN))] * 3) as server:
        outcome, _ = plan_with(server, tmp_path)
    assert outcome.planner == "llm"
    retry = server.requests[1]["body"]["messages"]
    kept = [m["content"] for m in retry if m["role"] == "assistant"]
    assert len(kept) == 1 and kept[0].startswith(ramble[:MAX_REFUSED_IN_HISTORY])
    assert len(kept[0]) < MAX_REFUSED_IN_HISTORY + 100 and "more characters of this refused answer" in kept[0]
    assert outcome.fallbacks == [] and len(json.dumps(retry)) < len(ramble)  # the whole retry is smaller


def test_the_reply_limit_is_sized_from_the_schema_and_a_longest_plan_fits():
    caps = {"structured": 0.8, "head": 0.5, "block": 1.0}
    small, large = (plan_schema(kinds_of(vit_profile(n_layers=n)["groups"]), ("qint8",), caps, 0.05) for n in (2, 12))
    assert answer_token_limit(small) < answer_token_limit(large)  # more groups to name, more room
    groups = [g["name"] for g in vit_profile(n_layers=12)["groups"]]
    longest = {  # every group named once, in the most entries the limit allows for, every string at its cap
        "pruning": [
            {"type": "structured", "groups": groups[i::8], "ratio": 0.35, "justification": "j" * MAX_JUSTIFICATION}
            for i in range(8)
        ],
        "quantization": [
            {"layer": "all", "type": "dynamic", "dtype": "qint8", "justification": "j" * MAX_JUSTIFICATION}
        ],
        "rationale": "r" * MAX_RATIONALE,
    }
    assert len(json.dumps(longest)) / 3 < answer_token_limit(large)  # at 3 characters a token it fits
    linears = [f"vit.layers.{i}.mlp.fc1" for i in range(6)]  # as many quantization entries as the schema allows
    named = plan_schema(kinds_of(vit_profile(n_layers=12)["groups"]), ("qint8",), caps, 0.05, linears)
    quant = named["properties"]["quantization"]["maxItems"]
    entry = {"layer": linears[0], "type": "dynamic", "dtype": "qint8", "justification": "j" * MAX_JUSTIFICATION}
    assert len(json.dumps({**longest, "quantization": [entry] * quant})) / 3 < answer_token_limit(named)
