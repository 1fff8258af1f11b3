"""A refused plan's own groups sized to the goal in the repair, and more than one alternative for one-kind models."""

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
from profiling_agent.state import Context, Objective, PlannerProfile, PlanningProblem, State
from profiling_agent.tools.planning.alternatives import OfferInputs, offer_alternatives
from profiling_agent.tools.planning.deterministic import plan_round
from profiling_agent.tools.planning.llm_planner import plan_with_llm
from profiling_agent.tools.planning.plan_guard import GuardConfig

PROFILE = vit_profile(n_layers=3)
SENS = vit_sensitivity(PROFILE)
MINE = ["layers.0.mlp", "layers.1.mlp", "layers.0.heads"]
SMALL = {  # sensible groups at ratios far below half of the 40% objective: refused in round 1
    "pruning": [
        {"groups": MINE[:2], "type": "structured", "ratio": 0.1, "justification": "cheap MLPs"},
        {"groups": MINE[2:], "type": "head", "ratio": 0.1, "justification": "one layer's heads"},
    ],
    "quantization": [{"layer": "all", "type": "dynamic", "dtype": "qint8", "justification": "Linear-heavy"}],
}


@pytest.fixture(autouse=True)
def local_only(monkeypatch):
    local_llm_only(monkeypatch)


def plan_via(server, tmp_path):
    state = State(run_path=str(tmp_path), family="vit", objective=Objective())
    fallback = plan_round(PlanningProblem.of(PROFILE["groups"], PROFILE["group_costs"], SENS, state.objective, []))
    ctx = Context(llm_base_url=server.base_url, llm_timeout=10, llm_tool_rounds=2, llm_api_key_env="PA_RESIZE_UNSET")
    return plan_with_llm(round_inputs(state, state.iteration), ctx, PROFILE, probe_records(SENS), fallback)


def resized_in(text: str) -> dict:
    found = re.search(r"The groups your plan named.*?the guard accepts it:\n(\{.*?\})\n", text, re.DOTALL)
    assert found, text
    return json.loads(found.group(1))


def events(tmp_path, outcome) -> list[dict]:
    return [json.loads(line) for line in (tmp_path / outcome.transcript).read_text().splitlines()]


def test_a_too_small_plans_groups_come_back_at_the_goal_and_taking_them_is_recorded_as_resized(tmp_path):
    def take_resized(body):
        return chat_completion(json.dumps(resized_in(body["messages"][-1]["content"])))

    with ScriptedOpenAIServer([chat_completion(json.dumps(SMALL)), take_resized, take_resized]) as server:
        outcome = plan_via(server, tmp_path)
        repair = server.requests[1]["body"]["messages"][-1]["content"]
    shown = resized_in(repair)
    named = {g for e in shown["pruning"] for g in e["groups"]}
    assert named and named <= set(MINE)  # only the groups the refused plan named, at other ratios
    assert {e["ratio"] for e in shown["pruning"]} != {0.1}
    (event,) = [e for e in events(tmp_path, outcome) if e["event"] == "resized"]
    assert event["estimate"]["params"] >= 0.2  # over the round-1 floor (half the 40% objective)
    assert f"params -{event['estimate']['params']:.1%}" in repair  # its numbers are shown with it
    short = event["estimate"]["params"] < event["goal"] - 0.005  # said plainly when its groups cannot reach the goal
    assert ("come closest to this round's goal (params -" in repair) is short
    assert ("at the ratios that reach this round's goal" in repair) is not short
    assert "The alternatives offered above, again:" in repair  # the alternatives stay on offer beside it
    assert "Answer with that plan, one of the alternatives by its label, an edit of one" in repair
    assert outcome.planner == "llm" and outcome.vs_proposal is not None
    assert outcome.vs_proposal.verdict == "resized" and outcome.vs_proposal.label().startswith("resized")
    assert outcome.summary("m").applied.startswith("resized: the groups of its own refused plan")
    kinds = [e["event"] for e in events(tmp_path, outcome)]
    assert "resized" in kinds and kinds.index("resized") < kinds.index("final")


def test_an_edit_of_the_resized_plan_is_recorded_as_an_edit_of_it(tmp_path):
    def edit_resized(body):
        plan = resized_in(body["messages"][-1]["content"])
        plan["pruning"][0]["ratio"] = round(plan["pruning"][0]["ratio"] - 0.05, 2)
        return chat_completion(json.dumps(plan))

    with ScriptedOpenAIServer([chat_completion(json.dumps(SMALL)), edit_resized, edit_resized]) as server:
        outcome = plan_via(server, tmp_path)
    diff = outcome.vs_proposal
    assert outcome.planner == "llm" and diff is not None and diff.verdict == "edited" and diff.changes >= 1
    assert diff.alternative == "its refused plan's groups, sized to the goal"
    assert outcome.summary("m").applied.startswith("edited: its refused plan's groups, sized to the goal")


def test_no_resize_is_offered_when_it_would_repeat_an_offered_alternative(tmp_path):
    mlps = {**SMALL, "pruning": [{"groups": [f"layers.{i}.mlp" for i in range(3)], "type": "structured", "ratio": 0.1}]}
    choose_a = chat_completion(json.dumps({"choice": "A", "why": "the default"}))
    with ScriptedOpenAIServer([chat_completion(json.dumps(mlps)), choose_a, choose_a]) as server:
        outcome = plan_via(server, tmp_path)
        first = server.requests[0]["body"]["messages"][-1]["content"]
        repair = server.requests[1]["body"]["messages"][-1]["content"]
    assert "B (MLP channels only)" in first  # every MLP at the goal is alternative B already
    assert "The groups your plan named" not in repair
    assert "resized" not in [e["event"] for e in events(tmp_path, outcome)]
    assert outcome.vs_proposal is not None and outcome.vs_proposal.verdict == "copied"


def one_kind() -> tuple[PlannerProfile, PlanningProblem]:
    groups = [g for g in PROFILE["groups"] if g["kind"] == "structured"]
    costs = {g["name"]: PROFILE["group_costs"][g["name"]] for g in groups}
    profile = {**PROFILE, "groups": groups, "group_costs": costs}
    problem = PlanningProblem.of(groups, costs, probe_records(SENS), Objective())
    return PlannerProfile.of(profile), problem


def test_a_model_with_one_kind_of_group_is_offered_the_other_emphases_as_alternatives():
    facts, problem = one_kind()
    offer = offer_alternatives(OfferInputs(facts, problem, 0.25, [], None, None, None, None), GuardConfig())
    names = [a.name for a in offer.alternatives]
    assert names[0] == "default: the deterministic proposal" and len(names) >= 2
    assert set(names[1:]) <= {"costliest groups harder", "sensitive groups spared"}
    ratios = [json.dumps(a.record.ratios, sort_keys=True) for a in offer.alternatives]
    assert len(set(ratios)) == len(ratios)  # each a different plan
    spared = next(a for a in offer.alternatives if a.name == "sensitive groups spared")
    default = offer.alternatives[0]
    # the most damaged MLP (layer 2) keeps more of its channels when sensitive groups are spared
    assert spared.record.ratios.get("layers.2.mlp", 0.0) < default.record.ratios.get("layers.2.mlp", 0.0)
