"""LLM plans that are the LLM's own: the format example refused, the first plan's floor, propose_plan, paired rounds."""

from __future__ import annotations

import dataclasses
import json

import pytest
from helpers.fake_llm import (
    ScriptedOpenAIServer,
    chat_completion,
    guard_profile,
    local_llm_only,
    probe_records,
    vit_profile,
    vit_sensitivity,
)

from profiling_agent.graph.routing import after_analyze
from profiling_agent.nodes.analyze import round_inputs
from profiling_agent.prompts.analysis import DEFAULT_BOUNDS, render_analysis
from profiling_agent.prompts.plan_example import EXAMPLE_PREFIX, example_plan_json
from profiling_agent.state import (
    Candidate,
    CompressionPlan,
    Context,
    EvalRecord,
    Fallback,
    LLMStep,
    Objective,
    PlannerMeta,
    PlannerProfile,
    PlanningProblem,
    Review,
    State,
)
from profiling_agent.tools.planning.deterministic import plan_round
from profiling_agent.tools.planning.llm_client import LLMUnreachable, llm_console_note, never_reached
from profiling_agent.tools.planning.llm_planner import plan_with_llm
from profiling_agent.tools.planning.llm_tools import make_planning_tools
from profiling_agent.tools.planning.paired import (
    deterministic_sequence,
    measured_before,
    paired_stop,
    reference_due,
    repeated_round,
    round_bound,
)
from profiling_agent.tools.planning.plan_guard import GuardConfig, check_plan
from profiling_agent.tools.planning.proposal import (
    Proposal,
    ProposalAnswer,
    ProposedPlan,
    compare_to_proposals,
    propose,
)

PROFILE = vit_profile(n_layers=2)
SENS = vit_sensitivity(PROFILE)
QUANT = [{"layer": "all", "type": "dynamic", "dtype": "qint8", "justification": "Linear-heavy"}]
OWN_PLAN = {  # the LLM's own: both MLPs hard, one head; predicted about 30% of the params
    "pruning": [
        {"groups": ["layers.0.mlp", "layers.1.mlp"], "type": "structured", "ratio": 0.6, "justification": "cheap"},
        {"groups": ["layers.1.heads"], "type": "head", "ratio": 0.5, "justification": "late heads"},
    ],
    "quantization": QUANT,
    "rationale": "prune the MLPs hard and two heads of layer 1",
}


@pytest.fixture(autouse=True)
def local_only(monkeypatch):
    local_llm_only(monkeypatch)


def plan_via(server, tmp_path, state=None, retries=2):
    """Plan one step against the scripted server (tools offered, structured mode found from its answers)."""
    state = state or State(run_path=str(tmp_path), family="vit", objective=Objective())
    fallback = plan_round(PlanningProblem.of(PROFILE["groups"], PROFILE["group_costs"], SENS, state.objective, []))
    ctx = Context(
        llm_base_url=server.base_url,
        llm_timeout=10,
        llm_retries=retries,
        llm_tool_rounds=2,
        llm_api_key_env="PA_PROPOSAL_UNSET",
    )
    return plan_with_llm(round_inputs(state, state.iteration), ctx, PROFILE, probe_records(SENS), fallback), fallback


def transcript(tmp_path, outcome):
    return [json.loads(line) for line in (tmp_path / outcome.transcript).read_text().splitlines()]


def sent_back(server):
    """The human turns the planner sent after a refused answer (the last message of each later request)."""
    return [
        r["body"]["messages"][-1]["content"] for r in server.requests[1:] if r["body"]["messages"][-1]["role"] == "user"
    ]


# ---------------------------------------------------------------- item 1: no copyable example


def test_the_prompts_format_example_names_no_group_of_this_model():
    system, user = (m.content for m in render_analysis(PROFILE, SENS, Objective()))
    example = json.loads(example_plan_json())
    named = {n for e in example["pruning"] for n in e["groups"]}
    assert named and all(n.startswith(EXAMPLE_PREFIX) for n in named)
    assert not named & ({g["name"] for g in PROFILE["groups"]} | {g["module"] for g in PROFILE["groups"]})
    assert example_plan_json() in system and "DIFFERENT, made-up model" in system
    assert "A valid plan for this model" not in user and "propose_plan" in system + user
    # the bounds quoted when no guard is passed are the guard's defaults
    assert DEFAULT_BOUNDS == {k: v for k, v in dataclasses.asdict(GuardConfig()).items() if k in DEFAULT_BOUNDS}


def test_a_run_without_tools_is_not_told_to_call_them():
    """--llm-tool-rounds 0 binds no tool: the prompt must not ask a small model for a call it cannot make."""
    system, user = (m.content for m in render_analysis(PROFILE, SENS, Objective(), tool_rounds=0))
    assert "propose_plan" not in system + user and "at most 0 rounds" not in system
    assert "No tools are offered in this run" in system and user.rstrip().endswith("Answer with the JSON plan only.")
    with_tools, user_tools = (m.content for m in render_analysis(PROFILE, SENS, Objective(), tool_rounds=2))
    assert "at most 2 rounds" in with_tools and "call propose_plan" in user_tools
    assert len(system) < len(with_tools)


def test_a_copied_example_and_its_translation_are_refused_then_an_own_plan_is_applied(tmp_path):
    translated = {  # the example mapped onto this model position by position
        "pruning": [
            {"groups": ["layers.0.mlp", "layers.1.mlp"], "type": "structured", "ratio": 0.3, "justification": "x"},
            {"groups": ["layers.0.heads"], "type": "head", "ratio": 0.25, "justification": "x"},
        ],
        "quantization": QUANT,
        "rationale": "r",
    }
    script = [chat_completion(example_plan_json()), chat_completion(json.dumps(translated))]
    script += [chat_completion(json.dumps(OWN_PLAN))] * 2
    with ScriptedOpenAIServer(script) as server:
        outcome, _ = plan_via(server, tmp_path)
        back = sent_back(server)
    assert outcome.planner == "llm" and outcome.estimate["params"] > 0.2
    assert {e.ratio for e in outcome.plan.pruning} == {0.6, 0.5}
    guards = [e for e in transcript(tmp_path, outcome) if e["event"] == "guard"]
    assert [g["ok"] for g in guards] == [False, False, True]
    assert "format example's made-up model" in guards[0]["reasons"][0] and "layers.0.heads" in guards[0]["reasons"][0]
    assert "format example translated onto this model" in " ".join(guards[1]["reasons"])
    assert "made-up model" in back[0] and "translated" in back[1]  # the reasons went back to the LLM


def test_a_human_edited_plan_equal_to_the_examples_shape_is_not_refused():
    translated = {
        "pruning": [
            {"groups": ["layers.0.mlp", "layers.1.mlp"], "type": "structured", "ratio": 0.3},
            {"groups": ["layers.0.heads"], "type": "head", "ratio": 0.25},
        ]
    }
    profile = PlannerProfile.of(PROFILE)
    assert check_plan(translated, profile).ok  # a reviewer never saw the example
    assert not check_plan(translated, profile, GuardConfig(refuse_example=True)).ok


def test_an_under_target_first_plan_is_sent_back_with_the_numbers(tmp_path):
    small = {
        "pruning": [{"groups": ["layers.0.mlp"], "type": "structured", "ratio": 0.2, "justification": "timid"}],
        "quantization": QUANT,
        "rationale": "a little",
    }
    with ScriptedOpenAIServer([chat_completion(json.dumps(small)), chat_completion(json.dumps(OWN_PLAN))]) as server:
        outcome, _ = plan_via(server, tmp_path)
        back = sent_back(server)
    assert outcome.planner == "llm" and outcome.plan.rationale == OWN_PLAN["rationale"]
    (refused,) = [e for e in transcript(tmp_path, outcome) if e["event"] == "guard" and not e["ok"]]
    assert refused["estimate"]["params"] < 0.2
    reason = refused["reasons"][0]
    assert f"predicted to remove {refused['estimate']['params']:.1%} of the params" in reason
    assert "less than 50% of the objective's 40%" in reason and "at least 20%" in reason
    assert reason in back[0]
    # from the second round on the same plan is the LLM's to make (the loop measures it)
    later = State(run_path=str(tmp_path), family="vit", objective=Objective(), iteration=2)
    with ScriptedOpenAIServer([chat_completion(json.dumps(small))]) as server:
        outcome, _ = plan_via(server, tmp_path, state=later)
    assert outcome.planner == "llm" and outcome.transcript == "iter_02/llm_transcript.jsonl"


# ---------------------------------------------------------------- item 2: propose_plan and what the LLM changed


def _proposal_in(body):
    """The plan propose_plan returned, read from the request (what a real LLM would see)."""
    tool = next(m for m in body["messages"] if m.get("role") == "tool")
    return json.loads(tool["content"])["plan"]


def _edit(body):
    plan = _proposal_in(body)
    first = plan["pruning"][0]
    first["ratio"] = round(first["ratio"] + 0.05, 2) if first["ratio"] < 0.75 else 0.5
    return chat_completion(json.dumps(plan))


def test_an_edited_proposal_is_applied_and_recorded_as_edited(tmp_path):
    ask = chat_completion(tool_calls=[{"name": "propose_plan", "args": {"goal": 40, "emphasis": "balanced"}}])
    with ScriptedOpenAIServer([ask, _edit]) as server:
        outcome, fallback = plan_via(server, tmp_path)
        proposal = _proposal_in(server.requests[1]["body"])
    assert outcome.planner == "llm" and not outcome.fallbacks
    diff = outcome.vs_proposal
    assert diff is not None and diff.verdict == "edited" and diff.proposals == 1 and diff.goal == 0.4
    edited = proposal["pruning"][0]
    assert diff.changes == len(edited["groups"]) and set(diff.ratios) == set(edited["groups"])
    assert not diff.added and not diff.removed and diff.quantization == ""
    assert diff.label() == f"edited ({diff.changes} changes)"
    assert outcome.summary("m").vs_proposal == diff.label()
    assert outcome.plan != fallback.plan  # the applied plan is the LLM's edit, not the deterministic fallback
    logged = next(e for e in transcript(tmp_path, outcome) if e["event"] == "vs_proposal")
    assert logged["verdict"] == "edited" and logged["label"] == diff.label()


def test_a_copied_proposal_is_recorded_as_copied_and_a_plan_without_one_as_own(tmp_path):
    ask = chat_completion(tool_calls=[{"name": "propose_plan", "args": {"goal": 0.4}}])
    with ScriptedOpenAIServer([ask, lambda body: chat_completion(json.dumps(_proposal_in(body)))]) as server:
        outcome, _ = plan_via(server, tmp_path)
    assert outcome.planner == "llm" and outcome.vs_proposal is not None
    assert outcome.vs_proposal.verdict == "copied" and outcome.vs_proposal.changes == 0
    with ScriptedOpenAIServer([chat_completion(json.dumps(OWN_PLAN))]) as server:
        outcome, _ = plan_via(server, tmp_path)
    assert outcome.vs_proposal is not None and outcome.vs_proposal.verdict == "own"
    assert outcome.vs_proposal.proposals == 0


def _answer(goal: float, emphasis: str) -> ProposalAnswer:
    return ProposalAnswer(goal=goal, emphasis=emphasis, predicted_reduction={}, plan=ProposedPlan())


def test_propose_plan_tool_reaches_its_goal_on_the_ratio_grid_and_passes_the_guard():
    objective = Objective()
    plan, record = propose(
        PlanningProblem.of(PROFILE["groups"], PROFILE["group_costs"], SENS, objective), 0.4, "balanced", []
    )
    plan = plan.wire()  # as the LLM reads it
    ratios = [e["ratio"] for e in plan["pruning"]]
    assert all(abs(r * 20 - round(r * 20)) < 1e-9 for r in ratios)  # multiples of 0.05
    assert record.estimate["params"] == pytest.approx(0.4, abs=0.06)
    guard = GuardConfig(target="params", target_reduction=0.4, refuse_example=True, min_share_of_target=0.5)
    verdict = check_plan(plan, guard_profile(PROFILE["groups"], PROFILE["protected"], PROFILE["group_costs"]), guard)
    assert verdict.ok, verdict.reasons
    assert verdict.ratios == record.ratios
    spare = propose(
        PlanningProblem.of(PROFILE["groups"], PROFILE["group_costs"], SENS, objective), 0.4, "sensitivity", []
    )[1]
    heads = [g["name"] for g in PROFILE["groups"] if g["kind"] == "head"]  # the probe's sensitive groups
    assert sum(spare.ratios.get(h, 0) for h in heads) <= sum(record.ratios.get(h, 0) for h in heads)

    calls = []
    tools = make_planning_tools(
        PlannerProfile.of(PROFILE), probe_records(SENS), propose_fn=lambda g, e: calls.append((g, e)) or _answer(g, e)
    )
    tool = next(t for t in tools if t.name == "propose_plan")
    assert json.loads(tool.invoke({"goal": 35}))["goal"] == 0.35 and calls == [(0.35, "balanced")]
    assert tool.invoke({"goal": 0}).startswith("error:") and tool.invoke({"goal": 150}).startswith("error:")


# ---------------------------------------------------------------- item 4: paired rounds


def _cand(iteration, planner, turn, accuracy, params, goal=0.3):
    ev = {
        "name": f"iter_{iteration}",
        "accuracy": accuracy,
        "agreement": 90.0,
        "n_samples": 100,
        "latency_ms": 1.0,
        "latency_batch_ms": 8.0,
        "batch_size": 16,
        "baseline_latency_ms": 1.0,
        "speedup": 1.0,
        "memory_bytes": 1,
        "size_mb": 0.1,
        "params": params,
        "macs": params,
        "threads": 1,
    }
    meta = {"goal": goal, "gamma": 1.0, "turn": turn}
    return Candidate(iteration=iteration, status="ok", planner=planner, planner_meta=meta, eval=ev)


BASE = EvalRecord(
    name="baseline",
    accuracy=90.0,
    agreement=100.0,
    n_samples=100,
    latency_ms=1.0,
    latency_batch_ms=8.0,
    batch_size=16,
    baseline_latency_ms=1.0,
    speedup=1.0,
    memory_bytes=1,
    size_mb=0.4,
    params=1000,
    macs=1000,
    threads=1,
)


def test_paired_rounds_follow_the_deterministic_sequence_and_stop_when_it_would():
    objective = Objective(iterations=2, target_reduction=0.4, max_acc_drop=2.0)
    llm1 = _cand(1, "llm", "llm", 89.5, 500)  # the LLM's plan meets the objective at once
    assert reference_due([llm1]) and round_bound(objective, [llm1]) == 4
    assert paired_stop([llm1], BASE, objective)[0] == ""  # never stop before the reference turn
    ref1 = _cand(2, "deterministic", "reference", 89.0, 700)  # the deterministic round 1 misses the target
    assert deterministic_sequence([llm1, ref1]) == [ref1] and not reference_due([llm1, ref1])
    assert paired_stop([llm1, ref1], BASE, objective)[0] == ""  # the deterministic run would go on: so do we
    fell_back = _cand(3, "deterministic", "llm", 85.0, 400)  # an LLM turn that fell back counts as its round 2
    stop, det_best = paired_stop([llm1, ref1, fell_back], BASE, objective)
    assert (
        "iteration bound reached (2 rounds of each planner)" in stop
        and det_best is not None
        and det_best.iteration == 2
    )
    ref_met = _cand(2, "deterministic", "reference", 89.0, 550)
    stop, _ = paired_stop([llm1, ref_met], BASE, objective)
    assert stop.startswith("objective met by the deterministic sequence at iteration 2")
    plain = [_cand(1, "deterministic", None, 89.0, 700)]  # a deterministic run is not paired
    assert round_bound(objective, plain) == 2 and deterministic_sequence(plain) == plain


def test_a_paired_round_repeating_a_measured_plan_records_that_candidate():
    mlp = {"layer": "^vit\\.layers\\.0\\.mlp\\.fc1$", "type": "structured", "ratio": 0.5}
    copied = CompressionPlan.model_validate({"pruning": [{**mlp, "justification": "A"}], "rationale": "the LLM's"})
    own = CompressionPlan.model_validate({"pruning": [{**mlp, "justification": "cost share"}], "rationale": "det"})
    assert copied.effect() == own.effect() and copied != own  # the same plan in other words
    conv = {"layer": "^resnet\\.stages\\.0\\.conv$", "type": "structured", "ratio": 0.25}
    one_each = CompressionPlan.model_validate({"pruning": [mlp, conv]})
    assert one_each.effect() == CompressionPlan.model_validate({"pruning": [conv, mlp]}).effect()  # no overrides
    wide = {"layer": "^vit\\.layers\\.\\d+\\.mlp\\.fc1$", "type": "structured", "ratio": 0.3}
    overriding = CompressionPlan.model_validate({"pruning": [wide, mlp]})  # layer 0 at 0.5, the others at 0.3
    assert overriding.effect() != CompressionPlan.model_validate({"pruning": [mlp, wide]}).effect()
    llm1 = _cand(1, "llm", "llm", 89.5, 500).model_copy(update={"plan": copied})
    reference = PlannerMeta(goal=0.3, gamma=1.0, turn="reference")
    again = repeated_round([llm1], own, reference, 2)
    assert again is not None and again[0] == 1
    record = Candidate.model_validate(again[1])
    assert record.iteration == 2 and record.planner_meta.turn == "reference" and record.eval == llm1.eval
    assert after_analyze(State(current=record)) == "iterate"  # recorded, not pruned, recovered or evaluated again
    other = own.model_copy(update={"pruning": [own.pruning[0].model_copy(update={"ratio": 0.55})]})
    assert repeated_round([llm1], other, reference, 2) is None  # another ratio: another model
    assert repeated_round([llm1], own, PlannerMeta(goal=0.3, gamma=1.0), 2) is None  # a deterministic run: no pairs
    refused = llm1.model_copy(update={"status": "rejected", "eval": None, "error": "its trial lost 40 pp"})
    assert measured_before([refused], own) is refused  # a trial's refusal is a measurement too
    by_hand = refused.model_copy(update={"review": Review(decision="reject", proposed_by="llm")})
    assert measured_before([by_hand], own) is None  # a plan a person rejected was never measured


# ---------------------------------------------------------------- issue 21 item 8: an endpoint never reached


@pytest.mark.parametrize(
    ("fallback", "kind"),
    [
        ({"stage": "error", "reason": "APIConnectionError: Connection error."}, ValueError),
        ({"stage": "error", "reason": "OpenAIConnectionError: Connection error."}, ValueError),
        ({"stage": "error", "reason": "AuthenticationError: Error code: 401 - {'error': 'bad key'}"}, ValueError),
        ({"stage": "error", "reason": "NotFoundError: Error code: 404 - model nope"}, ValueError),
        ({"stage": "timeout", "reason": "no reply within 1.0 s"}, LLMUnreachable),
        ({"stage": "error", "reason": "AttributeError: 'str' object has no attribute 'model_dump'"}, LLMUnreachable),
    ],
)
def test_an_endpoint_never_reached_is_one_line_naming_the_endpoint(fallback, kind):
    ctx = Context(llm_base_url="http://127.0.0.1:9/v1", llm_model="m")
    error = never_reached(Fallback(**fallback), ctx)
    assert type(error) is kind and "\n" not in str(error)
    assert (
        "--planner llm" in str(error) and "m at http://127.0.0.1:9/v1" in str(error) and "--planner auto" in str(error)
    )


def test_the_console_names_a_structured_mode_only_when_it_was_used():
    none = LLMStep(usage={"calls": 0}, structured={"mode": "json_schema", "confirmed": False}, transcript="t")
    assert llm_console_note(none) == "[LLM: no reply; transcript t]"
    free = LLMStep(usage={"calls": 2, "total_tokens": 9}, structured={"mode": "json_schema"}, transcript="t")
    assert "free-text answers" in llm_console_note(free) and "json_schema" not in llm_console_note(free)
    used = free.model_copy(update={"structured": {"mode": "json_object", "confirmed": True}})
    assert "structured output json_object" in llm_console_note(used)


def test_a_quantization_entry_written_twice_is_no_change_to_the_proposal():
    entry = {"layer": "all", "type": "dynamic", "dtype": "qint8"}
    plan = CompressionPlan.model_validate({"pruning": [], "quantization": [entry, entry]})
    prop = Proposal(goal=0.4, emphasis="balanced", ratios={"layers.0.mlp": 0.5}, quantization=["all qint8"])
    diff = compare_to_proposals({"layers.0.mlp": 0.5}, plan, [prop])
    assert diff.verdict == "copied" and diff.changes == 0 and diff.quantization == ""
