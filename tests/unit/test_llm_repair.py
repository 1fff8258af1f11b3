"""Repairs a small model can follow, answers constrained to this model, and the applied status of each round."""

from __future__ import annotations

import json
import re

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
from profiling_agent.state import Context, Objective, PlanningProblem, State
from profiling_agent.tools.planning import llm_planner
from profiling_agent.tools.planning.alternatives import Offer
from profiling_agent.tools.planning.deterministic import plan_round
from profiling_agent.tools.planning.llm_planner import plan_with_llm, proposal_goal
from profiling_agent.tools.planning.llm_repair import REPAIR_MARK
from profiling_agent.tools.planning.plan_guard import GuardConfig
from profiling_agent.tools.planning.proposal import propose
from profiling_agent.tools.planning.structured import ratio_grid
from profiling_agent.tools.reporting.markdown import proposal_lines

PROFILE = vit_profile(n_layers=3)
SENS = vit_sensitivity(PROFILE)
QUANT = [{"layer": "all", "type": "dynamic", "dtype": "qint8", "justification": "Linear-heavy"}]
TIMID = {  # predicted far below half of the 40% objective: the guard refuses it in round 1
    "pruning": [{"groups": ["layers.0.mlp"], "type": "structured", "ratio": 0.2, "justification": "timid"}],
    "quantization": QUANT,
    "rationale": "a little",
}
LLAMA_CPP_500 = (
    500,
    {"error": {"message": "response_format.type: Input should be 'text' or 'json_object'", "type": "server_error"}},
)


@pytest.fixture(autouse=True)
def local_only(monkeypatch):
    local_llm_only(monkeypatch)


def llama_cpp_like(answer):
    """A server like llama-cpp-python's: json_schema refused (500), json_object + schema constrained."""

    def reply(body):
        fmt = body.get("response_format") or {}
        if fmt.get("type") == "json_schema":
            return LLAMA_CPP_500
        return answer(body) if callable(answer) else chat_completion(json.dumps(answer))

    return reply


def plan_via(server, tmp_path, retries=2):
    state = State(run_path=str(tmp_path), family="vit", objective=Objective())
    fallback = plan_round(PlanningProblem.of(PROFILE["groups"], PROFILE["group_costs"], SENS, state.objective, []))
    ctx = Context(
        llm_base_url=server.base_url,
        llm_timeout=10,
        llm_retries=retries,
        llm_tool_rounds=2,
        llm_api_key_env="PA_REPAIR_UNSET",
    )
    return plan_with_llm(round_inputs(state, state.iteration), ctx, PROFILE, probe_records(SENS), fallback), fallback


def formats(server):
    return [(r["body"].get("response_format") or {}).get("type") for r in server.requests]


def proposal_in(text):
    """The JSON plan a repair turn shows inline (between the proposal line and the closing request)."""
    match = re.search(r"the guard accepts it:\n(\{.*\})\nAnswer with this plan", text, re.DOTALL)
    assert match, text
    return json.loads(match.group(1))


def test_fallback_order_and_a_schema_of_this_models_groups_and_ratio_grid(tmp_path):
    with ScriptedOpenAIServer([llama_cpp_like(TIMID)] * 8) as server:
        outcome, _ = plan_via(server, tmp_path)
    # plain first (tools offered), json_schema refused (500: no retry of a refused format), then json_object + schema
    assert formats(server)[:3] == [None, "json_schema", "json_object"]
    constrained = [r["body"]["response_format"] for r in server.requests if r["body"].get("response_format")]
    assert all("schema" in f for f in constrained if f["type"] == "json_object")
    schema = constrained[-1]["schema"]
    entries = schema["properties"]["pruning"]["items"]["anyOf"]
    named = {name for e in entries for name in e["properties"]["groups"]["items"]["enum"]}
    assert named == {g["name"] for g in PROFILE["groups"]}  # no group this model does not have
    by_kind = {e["properties"]["type"]["enum"][0]: e["properties"]["ratio"]["enum"] for e in entries}
    guard = GuardConfig()
    assert by_kind["structured"] == ratio_grid(guard.min_ratio, guard.max_ratio_structured)
    assert by_kind["head"] == ratio_grid(guard.min_ratio, guard.max_ratio_head)
    assert outcome.structured["mode"] == "json_object" and outcome.structured["confirmed"]
    assert [g["mode"] for g in outcome.structured["given_up"]] == ["json_schema"]
    assert outcome.summary("m").structured == outcome.structured  # result.json's planner.llm.structured


def test_the_repair_turn_carries_the_proposal_and_an_edit_of_it_is_applied_as_edited(tmp_path, monkeypatch):
    # a step without measured alternatives (none the guard accepts): the repair shows the proposal on its own
    monkeypatch.setattr(llm_planner, "offer_alternatives", lambda inputs, guard: Offer())

    def edit(body):
        plan = proposal_in(body["messages"][-1]["content"])
        plan["pruning"][0]["ratio"] = round(plan["pruning"][0]["ratio"] - 0.05, 2)
        return chat_completion(json.dumps(plan))

    with ScriptedOpenAIServer([chat_completion(json.dumps(TIMID))] + [llama_cpp_like(edit)] * 4) as s:
        outcome, fallback = plan_via(s, tmp_path)
        repair = s.requests[1]["body"]["messages"][-1]["content"]
    state = State(objective=Objective())
    goal = proposal_goal(fallback, state.objective)
    expected, record = propose(
        PlanningProblem.of(PROFILE["groups"], PROFILE["group_costs"], SENS, state.objective), goal, "balanced", []
    )
    assert proposal_in(repair)["pruning"] == expected.wire()["pruning"]  # the deterministic proposal, as JSON
    refused = [e for e in (tmp_path / outcome.transcript).read_text().splitlines() if '"event": "guard"' in e]
    mine = json.loads(refused[0])["estimate"]["params"]
    assert f"Your plan is predicted to remove {mine:.1%} of the params" in repair  # the refused plan's number
    assert f"predicted to remove {record.estimate['params']:.1%} of the params" in repair  # the proposal's
    assert "less than 50% of the objective's 40%" in repair  # the guard's reason
    assert outcome.planner == "llm" and outcome.vs_proposal is not None
    assert outcome.vs_proposal.verdict == "edited" and outcome.vs_proposal.proposals == 1
    applied = outcome.summary("m").applied
    assert applied.startswith("edited: the deterministic proposal") and "after 1 answer(s) sent back" in applied
    assert outcome.plan != fallback.plan


def test_with_alternatives_offered_the_repair_lists_them_all_again_and_a_choice_after_it_is_recorded(tmp_path):
    choose_b = llama_cpp_like({"choice": "B", "why": "the MLPs are cheap to prune"})
    with ScriptedOpenAIServer([chat_completion(json.dumps(TIMID)), *[choose_b] * 3]) as server:
        outcome, fallback = plan_via(server, tmp_path)
        first = server.requests[0]["body"]["messages"][-1]["content"]
        repair = server.requests[1]["body"]["messages"][-1]["content"]
    offered = first[first.index("Measured alternatives") :]
    assert "A (default: the deterministic proposal)" in offered and "B (MLP channels only)" in offered
    assert "less than 50% of the objective's 40%" in repair and "Your plan is predicted to remove" in repair
    assert offered in repair  # every alternative again, with its numbers, the default as one of them
    assert REPAIR_MARK not in repair and "Answer with this plan as it is" not in repair
    assert repair.endswith(
        "Answer with one of them by its label, an edit of one, or a plan of your own, as one JSON object only."
    )
    assert outcome.planner == "llm" and outcome.plan != fallback.plan
    diff = outcome.vs_proposal
    assert diff is not None and diff.verdict == "chosen" and diff.choice == "B"
    applied = outcome.summary("m").applied
    assert (
        applied.startswith("chosen: alternative B (MLP channels only) unchanged") and "1 answer(s) sent back" in applied
    )


def test_a_repeated_refused_plan_ends_the_turn_after_the_second_refusal(tmp_path):
    with ScriptedOpenAIServer([chat_completion(json.dumps(TIMID))] + [llama_cpp_like(TIMID)] * 5) as server:
        outcome, fallback = plan_via(server, tmp_path, retries=5)
        answered = sum(
            1 for r in server.requests if (r["body"].get("response_format") or {}).get("type") != "json_schema"
        )
    assert answered == 2  # the identical plan is not sent back a third time
    assert outcome.planner == "deterministic" and outcome.plan == fallback.plan
    (record,) = outcome.fallbacks
    assert record.stage == "guard" and len(record.rejected) == 2
    assert record.reason.startswith("the answer repeated a plan already refused (the plan is predicted to remove")
    applied = outcome.summary("m").applied
    assert applied.startswith("replaced: the deterministic plan was applied (guard: the answer repeated")
    events = [json.loads(e)["event"] for e in (tmp_path / outcome.transcript).read_text().splitlines()]
    assert "repeated" in events and events[-1] == "final"


def test_the_applied_status_of_each_round_is_recorded_for_the_report(tmp_path):
    with ScriptedOpenAIServer([chat_completion(json.dumps(TIMID))] + [llama_cpp_like(TIMID)] * 3) as server:
        replaced, _ = plan_via(server, tmp_path)
    own = {  # far from every plan it was shown (all groups, the MLPs only, the heads only): its own
        "pruning": [
            {"groups": ["layers.1.mlp"], "type": "structured", "ratio": 0.5},
            {"groups": ["layers.1.heads", "layers.2.heads"], "type": "head", "ratio": 0.5},
        ],
        "quantization": QUANT,
        "rationale": "the MLPs",
    }
    with ScriptedOpenAIServer([chat_completion(json.dumps(own))]) as server:
        applied, _ = plan_via(server, tmp_path)
    assert applied.summary("m").applied == "applied: the LLM's own plan, accepted by the guard"
    candidates = [  # result.json's candidate rows
        {"iteration": 1, "planner": "llm", "turn": "llm", "llm": applied.summary("m").model_dump()},
        {"iteration": 2, "planner": "deterministic", "turn": "reference"},
        {"iteration": 3, "planner": "deterministic", "turn": "llm", "llm": replaced.summary("m").model_dump()},
    ]
    candidates[0]["vs_proposal"] = applied.vs_proposal.model_dump() if applied.vs_proposal else None
    lines = proposal_lines(candidates)
    assert lines[0].startswith("- Iteration 1: LLM plan own")
    assert lines[2].startswith("- Iteration 3: LLM plan replaced: the deterministic plan was applied (guard:")
