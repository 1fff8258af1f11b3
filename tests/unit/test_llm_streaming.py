"""Streamed replies: a slow but steady reply completes past a total time; a stalled one is cut by the idle limit."""

from __future__ import annotations

import json
import time

import pytest
from helpers.fake_llm import (
    ScriptedOpenAIServer,
    chat_completion,
    local_llm_only,
    probe_records,
    quick_request_retry,
    vit_profile,
    vit_sensitivity,
)
from langchain_core.messages import HumanMessage
from llm_fake_server import FakeSmallModel

from profiling_agent.nodes.analyze import round_inputs
from profiling_agent.state import Context, Objective, PlanningProblem, State
from profiling_agent.tools.planning.deterministic import plan_round
from profiling_agent.tools.planning.llm_client import (
    PlannerFailure,
    RequestLimits,
    build_chat_model,
    call_model,
    overdue,
    request_limits,
)
from profiling_agent.tools.planning.llm_planner import plan_with_llm

PROSE = "I would prune the MLP layers by about half."


@pytest.fixture(autouse=True)
def local_only(monkeypatch):
    local_llm_only(monkeypatch)


def ctx_for(url: str, **limits: float) -> Context:
    return Context(llm_base_url=url, llm_api_key_env="PA_STREAM_UNSET", **limits)


def ask(url: str, **limits: float):
    ctx = ctx_for(url, **limits)
    started = time.monotonic()
    try:
        return call_model(build_chat_model(ctx), [HumanMessage(content="plan")], request_limits(ctx))
    finally:
        ask.elapsed = time.monotonic() - started  # type: ignore[attr-defined]


def test_the_limits_cut_a_request_only_when_it_is_overdue():
    limits = RequestLimits(first_token=10.0, idle=2.0, total=None)
    assert overdue(limits, 9.0, None, 0) is None  # still reading the prompt
    assert "--llm-first-token-timeout" in (overdue(limits, 10.5, None, 0) or "")
    assert overdue(limits, 500.0, 1.5, 300) is None  # slow but steady: no total limit by default
    assert "stalled" in (overdue(limits, 30.0, 2.5, 12) or "") and "--llm-idle-timeout" in overdue(limits, 30, 3, 1)
    capped = RequestLimits(first_token=10.0, idle=2.0, total=20.0)
    assert "--llm-timeout" in (overdue(capped, 20.5, 0.1, 40) or "")


def test_the_defaults_wait_minutes_for_the_first_token_and_a_minute_between_tokens():
    limits = request_limits(Context())
    assert (limits.first_token, limits.idle, limits.total) == (900.0, 60.0, None)
    assert request_limits(Context(llm_timeout=300)).total == 300.0  # --llm-timeout keeps a total when given


def test_a_slow_but_steady_reply_completes_past_the_old_total_timeout():
    # 14 chunks 0.09 s apart after a 0.8 s prompt read (longer than the idle limit): at least 2.06 s in all, more
    # than the old total of 2 s
    with FakeSmallModel(first_delay=0.8, interval=0.09) as fake:
        reply = ask(fake.url, llm_idle_timeout=0.6, llm_first_token_timeout=5.0)
    assert reply.content == PROSE and ask.elapsed > 2.0  # type: ignore[attr-defined]
    assert reply.usage_metadata and reply.usage_metadata["total_tokens"] == 960  # the stream's last chunk


def test_a_reply_that_stalls_mid_way_is_cut_with_a_clear_message():
    with FakeSmallModel(interval=0.05, stall_after=4) as fake:
        with pytest.raises(PlannerFailure) as caught:
            ask(fake.url, llm_idle_timeout=0.3, llm_first_token_timeout=30.0)
    assert caught.value.stage == "timeout"
    assert "stalled: no new token for 0.3 s" in caught.value.reason and "--llm-idle-timeout" in caught.value.reason
    assert ask.elapsed < 10.0  # type: ignore[attr-defined]


def test_a_server_that_never_starts_is_cut_at_the_first_token_limit():
    with FakeSmallModel(first_delay=30.0) as fake:
        with pytest.raises(PlannerFailure) as caught:
            ask(fake.url, llm_idle_timeout=0.3, llm_first_token_timeout=0.4)
    assert caught.value.stage == "timeout" and "no first token within 0.4 s" in caught.value.reason
    assert ask.elapsed < 10.0  # type: ignore[attr-defined]


def test_streamed_tool_calls_are_joined_and_a_reply_at_the_token_limit_is_cut_off():
    call = chat_completion(tool_calls=[{"name": "estimate_plan", "args": {"plan_json": "{}"}, "id": "c1"}])
    cut = chat_completion('{"pruning": [')
    cut["choices"][0]["finish_reason"] = "length"
    with ScriptedOpenAIServer([call, cut]) as server:
        reply = ask(server.base_url, llm_idle_timeout=5.0)
        assert [(c["name"], c["args"], c["id"]) for c in reply.tool_calls] == [
            ("estimate_plan", {"plan_json": "{}"}, "c1")
        ]
        with pytest.raises(PlannerFailure) as caught:
            ask(server.base_url, llm_idle_timeout=5.0)
    assert "LengthFinishReasonError" in caught.value.reason
    assert all(r["body"].get("stream") for r in server.requests)


def plan_via(fake: FakeSmallModel, tmp_path, **limits: float):
    profile = vit_profile(n_layers=2)
    sens = vit_sensitivity(profile)
    state = State(run_path=str(tmp_path), family="vit", objective=Objective())
    fallback = plan_round(PlanningProblem.of(profile["groups"], profile["group_costs"], sens, state.objective, []))
    ctx = Context(llm_base_url=fake.url, llm_tool_rounds=0, llm_retries=0, llm_api_key_env="PA_STREAM_UNSET", **limits)
    return plan_with_llm(round_inputs(state, 1), ctx, profile, probe_records(sens), fallback)


def test_a_planning_step_on_a_slow_steady_server_applies_the_models_plan(tmp_path):
    with FakeSmallModel(first_delay=0.7, interval=0.05) as fake:
        outcome = plan_via(fake, tmp_path, llm_idle_timeout=0.5, llm_first_token_timeout=5.0)
    assert outcome.planner == "llm" and not outcome.fallbacks
    assert {e.layer for e in outcome.plan.pruning} == {r"^vit\.layers\.0\.mlp\.fc1$", r"^vit\.layers\.1\.mlp\.fc1$"}


def test_a_planning_step_on_a_stalling_server_falls_back_and_says_why(tmp_path, monkeypatch):
    quick_request_retry(monkeypatch)
    with FakeSmallModel(interval=0.05, stall_after=3) as fake:
        outcome = plan_via(fake, tmp_path, llm_idle_timeout=0.3, llm_first_token_timeout=5.0)
    assert outcome.planner == "deterministic"
    record = outcome.fallbacks[-1]
    assert record.stage == "timeout" and "--llm-idle-timeout" in record.reason
    events = [json.loads(line) for line in (tmp_path / outcome.transcript).read_text().splitlines()]
    assert not [e for e in events if e["event"] == "reply"]  # nothing half-said was taken for an answer
    assert fake.streamed == 2  # the node's retry policy sent it once more, then the deterministic plan took over
