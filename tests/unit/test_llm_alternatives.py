"""Measured alternatives offered beside the proposal: a choice by label, an edited choice, the default copied."""

from __future__ import annotations

import json

import pytest
from helpers.fake_llm import (
    ScriptedOpenAIServer,
    chat_completion,
    kinds_of,
    local_llm_only,
    probe_records,
    vit_profile,
    vit_sensitivity,
)

from profiling_agent.nodes.analyze import round_inputs
from profiling_agent.state import Context, Objective, PlanningProblem, State, Trial
from profiling_agent.tools.planning.deterministic import plan_round
from profiling_agent.tools.planning.llm_planner import plan_with_llm

PROFILE = vit_profile(n_layers=2)
SENS = vit_sensitivity(PROFILE)


@pytest.fixture(autouse=True)
def local_only(monkeypatch):
    local_llm_only(monkeypatch)


def plan_via(server, tmp_path, trials=None):
    state = State(run_path=str(tmp_path), family="vit", objective=Objective())
    fallback = plan_round(PlanningProblem.of(PROFILE["groups"], PROFILE["group_costs"], SENS, state.objective, []))
    fallback.predicted_pp = 1.25  # the round's own trial of the deterministic plan

    def evaluate(plan):
        trials.append(plan)
        return Trial(accuracy_drop_pp=2.5)

    ctx = Context(llm_base_url=server.base_url, llm_timeout=10, llm_tool_rounds=2, llm_api_key_env="PA_ALT_UNSET")
    inputs = round_inputs(state, state.iteration)
    return plan_with_llm(
        inputs, ctx, PROFILE, probe_records(SENS), fallback, evaluate_fn=evaluate if trials is not None else None
    )


def offered(server) -> str:
    return server.requests[0]["body"]["messages"][-1]["content"]


def test_a_reply_choosing_b_applies_bs_plan_and_records_the_choice(tmp_path):
    trials: list[dict] = []
    reply = chat_completion(json.dumps({"choice": "B", "why": "MLPs are cheap to prune here"}))
    with ScriptedOpenAIServer([reply]) as server:
        outcome = plan_via(server, tmp_path, trials)
    prompt = offered(server)
    assert "A (default: the deterministic proposal)" in prompt and "loss 1.25 pp" in prompt
    assert "B (MLP channels only)" in prompt and "loss 2.50 pp (trial)" in prompt
    assert len(trials) == 2  # B and C measured; A reuses the round's trial
    assert outcome.planner == "llm" and not outcome.fallbacks
    pruned = {e.layer for e in outcome.plan.pruning}
    assert pruned and all("mlp" in layer for layer in pruned)  # B prunes the MLPs only
    diff = outcome.vs_proposal
    assert diff is not None and diff.verdict == "chosen" and diff.choice == "B"
    assert diff.label() == "chosen alternative B" and diff.why == "MLPs are cheap to prune here"
    assert outcome.summary("m").applied.startswith("chosen: alternative B (MLP channels only) unchanged")
    constrained = server.requests[0]["body"]
    assert "tools" in constrained  # a frontier model keeps its tools; the schema of constrained requests below


def test_an_edited_choice_records_the_edit(tmp_path):
    edit = {"groups": ["layers.0.mlp"], "type": "structured", "ratio": 0.5, "justification": "keep more of layer 0"}
    reply = chat_completion(json.dumps({"choice": "B", "why": "gentler on layer 0", "pruning": [edit]}))
    with ScriptedOpenAIServer([reply]) as server:
        outcome = plan_via(server, tmp_path)
    diff = outcome.vs_proposal
    assert outcome.planner == "llm" and diff is not None
    assert diff.verdict == "edited" and diff.choice == "B" and diff.changes == 1
    assert list(diff.ratios) == ["layers.0.mlp"] and diff.ratios["layers.0.mlp"][1] == 0.5
    assert diff.label() == "edited (1 changes) from alternative B" and diff.offered == 3  # A, B and C
    assert "edited: alternative B (MLP channels only)" in outcome.applied()


def test_the_default_choice_is_recorded_as_copied_and_an_unknown_label_is_sent_back(tmp_path):
    with ScriptedOpenAIServer([chat_completion(json.dumps({"choice": "A", "why": "safest"}))]) as server:
        outcome = plan_via(server, tmp_path)
    assert outcome.vs_proposal is not None and outcome.vs_proposal.verdict == "copied"
    assert outcome.vs_proposal.choice == "A" and outcome.applied().startswith("copied:")
    script = [chat_completion(json.dumps({"choice": "Z", "why": "?"})), chat_completion(json.dumps({"choice": "C"}))]
    with ScriptedOpenAIServer(script) as server:
        outcome = plan_via(server, tmp_path)
    assert "choice 'Z' is not one of the alternatives A, B, C" in json.dumps(server.requests[1]["body"]["messages"])
    assert outcome.vs_proposal is not None and outcome.vs_proposal.label() == "chosen alternative C"


def offered_plan(prompt: str, label: str) -> dict:
    """The plan of alternative `label` as the prompt lists it, written out as entries (one per group)."""
    line = prompt.split(f"\n{label} (")[1].split("\n   prune ")[1].split("\n")[0]
    entries = []
    for part in line.split("; "):
        if " at " not in part:
            continue
        names, ratio = part.rsplit(" at ", 1)
        for name in names.split(", "):
            kind = "head" if name.endswith(".heads") else "structured"
            entries.append({"groups": [name], "type": kind, "ratio": float(ratio)})
    return {"pruning": entries, "quantization": []}


def test_a_written_plan_one_group_short_of_an_alternative_is_recorded_as_an_edit_of_it(tmp_path):
    # Qwen2.5-Coder-1.5B's first answer on the embedded ResNet (docs/llm-planner.md): A with one group left out
    def a_but_one(body):
        plan = offered_plan(body["messages"][-1]["content"], "A")
        plan["pruning"] = plan["pruning"][:-1]
        return chat_completion(json.dumps(plan))

    with ScriptedOpenAIServer([a_but_one]) as server:
        outcome = plan_via(server, tmp_path)
    diff = outcome.vs_proposal
    assert outcome.planner == "llm" and diff is not None
    assert diff.verdict == "edited" and diff.choice == "A" and diff.changes == 1 and len(diff.removed) == 1
    assert outcome.applied().startswith("edited: alternative A (default: the deterministic proposal)")


def test_the_constrained_schema_allows_a_choice():
    from profiling_agent.tools.planning.structured import plan_schema

    schema = plan_schema(
        kinds_of(PROFILE["groups"]), ("qint8",), {"structured": 0.8, "head": 0.5}, 0.05, choices=["A", "B"]
    )
    assert schema["required"] == ["choice", "why"]
    assert schema["properties"]["choice"]["enum"] == ["A", "B", "own"] and "pruning" in schema["properties"]


def test_a_round_whose_trials_backed_off_below_the_floor_still_offers_its_alternatives(tmp_path):
    # the zoo ResNet: the deterministic round's trials backed off to -7.7% of the params; a floor at half the 40%
    # objective refused every alternative at that goal, so none were offered (docs/llm-planner.md). The floor
    # is for plans the model writes: an offered alternative, chosen, is accepted under it.
    state = State(run_path=str(tmp_path), family="vit", objective=Objective())
    problem = PlanningProblem.of(PROFILE["groups"], PROFILE["group_costs"], SENS, state.objective, [])
    fallback = plan_round(problem, goal=0.1)
    assert fallback.target_estimate is not None and fallback.target_estimate < 0.2  # under half the objective
    with ScriptedOpenAIServer([chat_completion(json.dumps({"choice": "A", "why": "the trials backed off"}))]) as s:
        ctx = Context(llm_base_url=s.base_url, llm_timeout=10, llm_tool_rounds=2, llm_api_key_env="PA_ALT_UNSET")
        outcome = plan_with_llm(round_inputs(state, state.iteration), ctx, PROFILE, probe_records(SENS), fallback)
    prompt = offered(s)
    assert "A (default: the deterministic proposal)" in prompt
    assert "a plan predicted to remove less than half of it is sent back" in prompt  # a written plan's floor
    assert outcome.planner == "llm" and outcome.vs_proposal is not None and outcome.vs_proposal.verdict == "copied"
    assert outcome.estimate["params"] < 0.2  # chosen under the floor
