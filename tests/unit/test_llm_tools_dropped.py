"""A model whose first answer cannot use tools (prose, a timeout, a malformed call) is asked without them after."""

from __future__ import annotations

import json

import pytest
from helpers.fake_llm import (
    ScriptedOpenAIServer,
    chat_completion,
    local_llm_only,
    probe_records,
    vit_profile,
    vit_sensitivity,
)

from profiling_agent.nodes.analyze import round_inputs
from profiling_agent.state import Candidate, Context, Objective, PlannerMeta, PlanningProblem, State
from profiling_agent.tools.planning.deterministic import plan_round
from profiling_agent.tools.planning.llm_planner import plan_with_llm

PROFILE = vit_profile(n_layers=2)
SENS = vit_sensitivity(PROFILE)
CHOICE = chat_completion(json.dumps({"choice": "A", "why": "the default"}))


@pytest.fixture(autouse=True)
def local_only(monkeypatch):
    local_llm_only(monkeypatch)


def plan_via(server, tmp_path, state=None, timeout=10.0):
    state = state or State(run_path=str(tmp_path), family="vit", objective=Objective())
    fallback = plan_round(PlanningProblem.of(PROFILE["groups"], PROFILE["group_costs"], SENS, state.objective, []))
    ctx = Context(llm_base_url=server.base_url, llm_timeout=timeout, llm_tool_rounds=2, llm_api_key_env="PA_TD_UNSET")
    return plan_with_llm(round_inputs(state, state.iteration), ctx, PROFILE, probe_records(SENS), fallback)


def offered_tools(server) -> list[bool]:
    return ["tools" in r["body"] for r in server.requests]


def test_a_prose_first_answer_drops_the_tools_for_this_step_and_the_next_rounds(tmp_path):
    with ScriptedOpenAIServer([chat_completion("I would prune the MLPs, they are cheap."), CHOICE]) as server:
        outcome = plan_via(server, tmp_path)
    assert offered_tools(server) == [True, False]
    assert "response_format" in server.requests[1]["body"]  # the second request is schema-constrained
    assert outcome.planner == "llm" and outcome.tools_dropped and "prose" in outcome.tools_dropped
    step = outcome.summary("m")
    assert step.tools_dropped == outcome.tools_dropped  # result.json's planner record says so
    # a later round of the run reads it and offers no tools from its first request
    earlier = Candidate(iteration=1, planner="llm", planner_meta=PlannerMeta(llm=step))
    state = State(run_path=str(tmp_path), family="vit", objective=Objective(), iteration=2, candidates=[earlier])
    with ScriptedOpenAIServer([CHOICE]) as server:
        later = plan_via(server, tmp_path, state)
    assert offered_tools(server) == [False] and later.tools_dropped is None  # said once: in the round that found it


def test_a_plan_that_cannot_be_read_drops_the_tools_and_says_why_not_prose(tmp_path):
    broken = '{"pruning": [{"groups": ["layers.0.mlp"], "type": "structured", "ratio": 0.5}'  # cut: no closers
    with ScriptedOpenAIServer([chat_completion(broken), CHOICE]) as server:
        outcome = plan_via(server, tmp_path)
    assert offered_tools(server) == [True, False]
    assert outcome.tools_dropped is not None and "prose" not in outcome.tools_dropped
    assert "a plan the parser could read (the reply's JSON is cut off" in outcome.tools_dropped


def test_a_first_request_that_times_out_is_sent_again_without_tools(tmp_path):
    with ScriptedOpenAIServer([("sleep", 5.0, CHOICE), CHOICE]) as server:
        outcome = plan_via(server, tmp_path, timeout=1.0)
    assert offered_tools(server) == [True, False]
    assert outcome.planner == "llm" and "timed out" in (outcome.tools_dropped or "")


def test_a_malformed_first_tool_call_drops_the_tools(tmp_path):
    bad = chat_completion(tool_calls=[{"name": "estimate_plan", "args": {}}])
    bad["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] = '{"plan_json": '
    with ScriptedOpenAIServer([bad, CHOICE]) as server:
        outcome = plan_via(server, tmp_path)
    assert offered_tools(server) == [True, False]
    assert outcome.planner == "llm" and "malformed" in (outcome.tools_dropped or "")


def test_a_first_answer_that_calls_tools_keeps_them():
    from profiling_agent.tools.planning.llm_conversation import first_with_tools
    from profiling_agent.tools.planning.llm_session import Conversation

    conv = Conversation.__new__(Conversation)
    conv.has_tools = True
    assert first_with_tools({"requests": 1}, conv) and not first_with_tools({"requests": 2}, conv)
    assert not first_with_tools({"requests": 1, "constrained": True}, conv)
