import json
import re
import socket
import threading
from pathlib import Path

import httpx
import pytest
from helpers.fake_llm import (
    ScriptedChatModel,
    ScriptedOpenAIServer,
    ai_tool_calls,
    chat_completion,
    probe_records,
    quick_request_retry,
    tool_call,
    vit_profile,
    vit_sensitivity,
)
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

from profiling_agent.nodes.analyze import round_inputs
from profiling_agent.prompts.analysis import PLAN_SCHEMA, regex_families, render_analysis
from profiling_agent.prompts.input_shape import render_input_shape
from profiling_agent.prompts.iterative import Feedback, render_iterative
from profiling_agent.state import (
    CompressionPlan,
    Context,
    Objective,
    PlannerProfile,
    PlanningProblem,
    PruneEntry,
    QuantEntry,
    State,
    Trial,
    group_rows,
)
from profiling_agent.tools.planning.deterministic import estimate_reduction, plan_round
from profiling_agent.tools.planning.llm_client import message_text
from profiling_agent.tools.planning.llm_planner import llm_round, plan_with_llm
from profiling_agent.tools.planning.llm_tools import make_planning_tools
from profiling_agent.tools.shape.llm_shape_agent import resolve_shape_with_llm

PROFILE = vit_profile(n_layers=2)
SENS = vit_sensitivity(PROFILE)
MLP_01 = r"^vit\.layers\.(0|1)\.mlp\.fc1$"
PLAN = {
    "pruning": [
        {"layer": MLP_01, "type": "structured", "ratio": 0.4, "justification": "MLPs dominate MACs, low damage"},
        {"layer": r"^vit\.layers\.0\.attention$", "type": "head", "ratio": 0.25, "justification": "cheap heads"},
    ],
    "quantization": [{"layer": "all", "type": "dynamic", "dtype": "qint8", "justification": "Linear-heavy"}],
    "rationale": "Prune the MLPs, one head in layer 0, quantize every Linear.",
}
PLAN_TEXT = "Here is the plan.\n```json\n" + json.dumps(PLAN, indent=1) + "\n```\nLet me know."


def make_state(tmp_path, **objective):
    return State(run_path=str(tmp_path), family="vit", objective=Objective(**objective))


def make_ctx(**kwargs):
    base = {"llm_timeout": 0.3, "llm_retries": 2, "llm_tool_rounds": 3, "llm_api_key_env": "PA_TEST_UNSET_KEY"}
    return Context(**{**base, **kwargs})


def fallback_for(state):
    return plan_round(PlanningProblem.of(PROFILE["groups"], PROFILE["group_costs"], SENS, state.objective, []))


def run(tmp_path, script, *, repeat_last=False, ctx=None, state=None):
    state = state or make_state(tmp_path)
    model = ScriptedChatModel(script=script, repeat_last=repeat_last)
    fallback = fallback_for(state)
    outcome = plan_with_llm(
        round_inputs(state, state.iteration),
        ctx or make_ctx(),
        PROFILE,
        probe_records(SENS),
        fallback,
        chat_model=model,
    )
    return outcome, model, fallback


def events(tmp_path, outcome):
    assert outcome.transcript is not None
    lines = (Path(tmp_path) / outcome.transcript).read_text().splitlines()
    return [json.loads(line) for line in lines]


def plan_json(*entries, quant=None):
    return json.dumps({"pruning": list(entries), "quantization": quant or [], "rationale": "r"})


def assert_fallback(outcome, fallback, stage):
    assert outcome.planner == "deterministic"
    assert outcome.plan == fallback.plan and outcome.estimate == {}
    assert len(outcome.fallbacks) == 1
    record = outcome.fallbacks[0]
    assert record.stage == stage and record.reason
    json.dumps(record.model_dump())  # must be JSON for the state
    return record


# ---------------------------------------------------------------- the planning loop with a scripted model


def test_happy_path_tool_call_then_valid_plan(tmp_path):
    call = tool_call("match_layers", {"pattern": MLP_01, "kind": "structured"})
    outcome, model, _ = run(tmp_path, [ai_tool_calls(call), PLAN_TEXT])
    assert outcome.planner == "llm" and outcome.fallbacks == []
    assert outcome.plan == CompressionPlan.model_validate(PLAN)
    assert outcome.transcript == "iter_01/llm_transcript.jsonl"
    ratios = {"layers.0.mlp": 0.4, "layers.1.mlp": 0.4, "layers.0.heads": 0.25}
    for key in ("params", "macs"):
        expected = estimate_reduction(ratios, group_rows(PROFILE["groups"], PROFILE["group_costs"], {}), key)
        assert outcome.estimate[key] == pytest.approx(expected, abs=1e-4)
    assert {"match_layers", "layer_profile", "estimate_plan", "group_sensitivity"} <= set(model.bound_tools)
    assert len(model.calls) == 2
    tool_msgs = [m for m in model.calls[1] if isinstance(m, ToolMessage)]
    assert len(tool_msgs) == 1 and tool_msgs[0].tool_call_id == call["id"]
    answer = json.loads(tool_msgs[0].content)
    assert answer["matched"] == 2 and {g["module"] for g in answer["groups"]} == {
        "vit.layers.0.mlp.fc1",
        "vit.layers.1.mlp.fc1",
    }
    log = events(tmp_path, outcome)
    kinds = [e["event"] for e in log]
    assert kinds[:2] == ["prompt", "prompt"] and "tool_call" in kinds and "tool_result" in kinds
    assert next(e for e in log if e["event"] == "tool_call")["args"]["pattern"] == MLP_01
    assert next(e for e in log if e["event"] == "guard")["ok"] is True
    assert log[-1] == {**log[-1], "event": "final", "planner": "llm"}


def test_first_prompt_is_the_analysis_prompt_with_exact_module_names(tmp_path):
    _, model, _ = run(tmp_path, [PLAN_TEXT])
    system, user = model.calls[0][0].content, model.calls[0][1].content
    assert "Analysis Agent" in system and '"pruning"' in system and "0.8" in system
    for name in ("vit.layers.0.mlp.fc1", "vit.layers.1.attention", "layers.1.heads", "classifier"):
        assert name in user
    assert "reduce params by at least 40%" in user and "2 percentage points" in user


def test_malformed_json_retries_then_falls_back(tmp_path):
    script = ["{pruning: [", "I would prune the MLPs a lot.", '```json\n{"pruning": [}\n```']
    outcome, model, fallback = run(tmp_path, script)
    record = assert_fallback(outcome, fallback, "parse")
    assert len(model.calls) == 3  # first answer + llm_retries (2)
    assert len(record.rejected) == 3 and all(r["stage"] == "parse" for r in record.rejected)
    retry = model.calls[1][-1]
    assert isinstance(retry, HumanMessage) and "could not be used" in retry.content


def test_a_rejected_answer_can_be_fixed_on_retry(tmp_path):
    outcome, model, _ = run(tmp_path, ["not json", PLAN_TEXT])
    assert outcome.planner == "llm"
    assert outcome.plan == CompressionPlan.model_validate(PLAN)


@pytest.mark.parametrize(
    ("entry", "fragment"),
    [
        ({"layer": "vit\\.layers\\.(0", "type": "structured", "ratio": 0.3}, "does not compile"),
        ({"layer": r"^vit\.blocks\.\d+\.ffn$", "type": "structured", "ratio": 0.3}, "matches no structured group"),
        ({"layer": "classifier", "type": "structured", "ratio": 0.5}, "protected"),
        ({"layer": r"(\w+\.)+fc1", "type": "structured", "ratio": 0.3}, "catastrophically"),
    ],
)
def test_guard_rejections_go_back_to_the_llm_then_fall_back(tmp_path, entry, fragment):
    outcome, model, fallback = run(tmp_path, [plan_json(entry)], repeat_last=True)
    record = assert_fallback(outcome, fallback, "guard")
    assert len(model.calls) == 2  # the same plan again after its repair turn: not sent back a third time
    assert all(fragment in " ".join(r["reasons"]) for r in record.rejected)
    assert fragment in model.calls[1][-1].content  # the reasons were sent back
    assert record.reason.startswith("the answer repeated a plan already refused")
    verdicts = [e for e in events(tmp_path, outcome) if e["event"] == "guard"]
    assert len(verdicts) == 2 and not any(v["ok"] for v in verdicts)


def test_ninety_five_percent_everywhere_is_refused(tmp_path):
    """The paper's GPT-4-Turbo failure mode."""
    greedy = plan_json(
        {"layer": r"mlp\.fc1$", "type": "structured", "ratio": 0.95},
        {"layer": r"attention$", "type": "head", "ratio": 0.95},
    )
    outcome, _, fallback = run(tmp_path, [greedy], repeat_last=True)
    record = assert_fallback(outcome, fallback, "guard")
    reasons = " ".join(record.rejected[0]["reasons"])
    assert "exceeds the structured cap 0.8" in reasons and "exceeds the head cap 0.75" in reasons


def test_endless_tool_calls_are_cut_off(tmp_path):
    loop = ai_tool_calls(tool_call("layer_profile", {"top": 3}))
    ctx = make_ctx(llm_tool_rounds=3, llm_structured="off")
    outcome, model, fallback = run(tmp_path, [loop], repeat_last=True, ctx=ctx)
    assert_fallback(outcome, fallback, "tool_loop")
    assert len(model.calls) == 5  # 3 tool rounds, the call that exhausts the budget, one forced final call
    assert model.call_kwargs[-1].get("tool_choice") == "none"
    assert "tool_choice" not in model.call_kwargs[0]
    history = model.calls[-1]
    asked = {c["id"] for m in history if isinstance(m, AIMessage) for c in m.tool_calls}
    answered = {m.tool_call_id for m in history if isinstance(m, ToolMessage)}
    assert asked == answered  # every tool call got an answer, as OpenAI requires
    assert sum(isinstance(m, ToolMessage) and m.content.startswith("error: tool budget") for m in history) == 1


def test_the_forced_final_answer_is_schema_constrained_without_tools(tmp_path):
    loop = ai_tool_calls(tool_call("layer_profile", {"top": 3}))
    outcome, model, fallback = run(tmp_path, [loop], repeat_last=True, ctx=make_ctx(llm_tool_rounds=3))
    assert_fallback(outcome, fallback, "tool_loop")
    assert len(model.calls) == 5
    final = model.call_kwargs[-1]
    assert final["response_format"]["type"] == "json_schema" and "tools" not in final
    schema = final["response_format"]["json_schema"]["schema"]
    shapes = schema["properties"]["pruning"]["items"]["anyOf"]
    names = sorted(n for e in shapes for n in e["properties"]["groups"]["items"]["enum"])
    assert names == sorted(g["name"] for g in PROFILE["groups"])  # the model can only name groups that exist
    history = model.calls[-1]  # tool turns rewritten as plain turns: the request carries no tool definitions
    assert not any(isinstance(m, ToolMessage) or getattr(m, "tool_calls", None) for m in history)
    assert sum("error: tool budget" in m.content for m in history) == 1


def test_unknown_tool_and_bad_arguments_return_errors_to_the_llm(tmp_path):
    calls = ai_tool_calls(
        tool_call("delete_everything", {}),
        tool_call("match_layers", {"pattern": "fc1", "kind": "bogus"}),
        tool_call("match_layers", {"pattern": "(a+)+", "kind": "structured"}),
        tool_call("group_sensitivity", {"group": "layers.9.mlp"}),
    )
    outcome, model, _ = run(tmp_path, [calls, PLAN_TEXT])
    assert outcome.planner == "llm"
    answers = [m.content for m in model.calls[1] if isinstance(m, ToolMessage)]
    assert answers[0].startswith("error: unknown tool 'delete_everything'")
    assert answers[1].startswith("error:") and "kind" in answers[1]
    assert answers[2].startswith("error: nested quantifiers")
    assert answers[3].startswith("error: unknown group 'layers.9.mlp'")


@pytest.mark.parametrize("exc", [TimeoutError("read timed out"), httpx.ReadTimeout("slow server")])
def test_timeout_errors_fall_back(tmp_path, exc):
    outcome, model, fallback = run(tmp_path, [exc, exc])
    assert_fallback(outcome, fallback, "timeout")
    assert len(model.calls) == 2  # the model node's retry policy tries a timed-out request once more


def test_a_model_sleeping_past_the_deadline_falls_back_quickly(tmp_path):
    release = threading.Event()
    slept_out: list[bool] = []

    def sleeping(messages):
        slept_out.append(not release.wait(10))  # True only if the 10 s sleep ran to its end
        return PLAN_TEXT

    try:
        outcome, _, fallback = run(tmp_path, [sleeping, sleeping], ctx=make_ctx(llm_timeout=0.2))
        assert slept_out == []  # the planner returned while the model was still sleeping
        record = assert_fallback(outcome, fallback, "timeout")
        assert "no reply within" in record.reason
    finally:
        release.set()


def test_any_other_exception_falls_back(tmp_path):
    outcome, _, fallback = run(tmp_path, [ConnectionError("connection refused")])
    record = assert_fallback(outcome, fallback, "error")
    assert "ConnectionError" in record.reason
    log = events(tmp_path, outcome)
    assert log[-2]["event"] == "fallback" and log[-1]["planner"] == "deterministic"


def test_text_that_looks_like_code_is_never_executed(tmp_path):
    marker = tmp_path / "pwned"
    code = f"```python\nimport os\nopen({str(marker)!r}, 'w').write('x')\n```"
    dunder = f"__import__('os').system('touch {marker}')"
    outcome, _, fallback = run(tmp_path, [code, dunder], repeat_last=True)
    assert_fallback(outcome, fallback, "parse")
    assert not marker.exists()
    # code inside a valid plan's text fields is carried as data
    payload = f"__import__('os').system('touch {marker}')"
    poisoned = dict(PLAN, rationale=payload)
    outcome, _, _ = run(tmp_path, [json.dumps(poisoned)])
    assert outcome.planner == "llm" and outcome.plan.rationale == payload
    assert not marker.exists()


def test_missing_quantization_is_added_from_the_objective(tmp_path):
    no_quant = dict(PLAN, quantization=[])
    outcome, _, fallback = run(tmp_path, [json.dumps(no_quant)])
    assert outcome.planner == "llm"
    assert outcome.plan.pruning == CompressionPlan.model_validate(PLAN).pruning
    assert outcome.plan.quantization == fallback.plan.quantization
    assert [(q.layer, q.dtype) for q in outcome.plan.quantization] == [("all", "qint8")]


def test_quantization_is_dropped_when_the_objective_disables_it(tmp_path):
    state = make_state(tmp_path, quantize="none")
    outcome, _, _ = run(tmp_path, [json.dumps(PLAN)], state=state)
    assert outcome.planner == "llm" and outcome.plan.quantization == []


def eval_record(**values):
    """A complete EvalRecord dict (the state's schema) with the given measurements and neutral defaults."""
    defaults = {
        "name": "iter_01",
        "agreement": 100.0,
        "n_samples": 100,
        "latency_batch_ms": 10.0,
        "batch_size": 16,
        "baseline_latency_ms": 2.0,
        "memory_bytes": 1000,
        "threads": 1,
    }
    return {**defaults, **values}


def test_later_rounds_use_the_iterative_prompt_with_measurements(tmp_path):
    base = eval_record(accuracy=90.0, params=100_000, macs=1_000_000, latency_ms=2.0, speedup=1.0, size_mb=0.4)
    cand = {
        "iteration": 1,
        "status": "ok",
        "planner": "llm",
        "plan": PLAN,
        "error": None,
        "applied": [
            {
                "group": "layers.0.mlp",
                "module": "vit.layers.0.mlp.fc1",
                "kind": "structured",
                "ratio": 0.4,
                "units_before": 64,
                "units_after": 38,
            }
        ],
        "eval": eval_record(accuracy=87.0, params=70_000, macs=690_000, latency_ms=1.5, speedup=1.33, size_mb=0.1),
    }
    failed = {
        "iteration": 2,
        "status": "failed",
        "planner": "llm",
        "plan": PLAN,
        "error": "self-check failed",
        "applied": [],
        "eval": None,
    }
    # the analyze node passes the state before its own iteration update: iteration 2, two finished candidates
    state = State(
        run_path=str(tmp_path),
        family="vit",
        iteration=2,
        candidates=[cand, failed],
        baseline_eval=base,
        fallbacks=[
            {"stage": "guard", "reason": "x", "iteration": 2, "rejected": [{"reasons": ["ratio 0.95 exceeds the cap"]}]}
        ],
    )
    assert llm_round(round_inputs(state, state.iteration)) == 3
    outcome, model, _ = run(tmp_path, [PLAN_TEXT], state=state)
    assert outcome.transcript == "iter_03/llm_transcript.jsonl"
    system, user = model.calls[0][0].content, model.calls[0][1].content
    assert "Iterative Pruning Agent" in system
    assert "Round 3 of at most 5" in user
    assert "drop 3.00 pp, OVER budget" in user and "params -30.0%" in user and "speedup 1.33x" in user
    assert "failed: self-check failed" in user and "ratio 0.95 exceeds the cap" in user
    assert "layers.0.mlp 64->38" in user


def test_transcript_is_rewritten_when_a_step_reruns(tmp_path):
    first, _, _ = run(tmp_path, [PLAN_TEXT])
    n = len(events(tmp_path, first))
    second, _, _ = run(tmp_path, [PLAN_TEXT])
    assert len(events(tmp_path, second)) == n


def test_without_a_run_folder_there_is_no_transcript(tmp_path):
    state = State(objective=Objective())
    outcome, _, _ = run(tmp_path, [PLAN_TEXT], state=state)
    assert outcome.planner == "llm" and outcome.transcript is None


# ---------------------------------------------------------------- prompts


def test_plan_schema_shows_exactly_the_plan_fields():
    keys = set(re.findall(r'"(\w+)":', PLAN_SCHEMA))
    fields = set(CompressionPlan.model_fields) | set(PruneEntry.model_fields) | set(QuantEntry.model_fields)
    fields -= {"tokens"}  # token merging is shown only for a model with a token axis (test_planner_tokens)
    assert keys == fields | {"groups"}  # exact group names: the guard's alternative to a "layer" regex


def test_prompts_for_a_12_layer_vit_b_stay_compact():
    profile = vit_profile(n_layers=12, hidden=768, inter=3072, heads=12, tokens=197, labels=1000)
    sens = vit_sensitivity(profile)
    messages = render_analysis(profile, sens, Objective(), model_info={"model": "google/vit-base-patch16-224"})
    size = sum(len(m.content) for m in messages)
    assert size < 12_000, size
    assert r"^vit\.layers\.\d+\.mlp\.fc1$" in messages[1].content
    cands = [
        {
            "iteration": i,
            "status": "ok",
            "planner": "llm",
            "plan": PLAN,
            "applied": [],
            "eval": {"accuracy": 80.0, "params": 8e7, "macs": 1.5e10, "speedup": 1.2, "size_mb": 300},
        }
        for i in range(1, 6)
    ]
    base = {"accuracy": 81.0, "params": 8.6e7, "macs": 1.7e10, "latency_ms": 20.0, "size_mb": 330}
    messages = render_iterative(profile, sens, Objective(), Feedback(iteration=6, candidates=cands, baseline_eval=base))
    assert sum(len(m.content) for m in messages) < 15_000


def test_regex_families_are_exact_and_avoid_protected_modules():
    groups = []
    for s in range(2):
        for b in range(3):
            for j in range(2):
                groups.append(
                    {
                        "name": f"stages.{s}.layers.{b}.conv{j + 1}",
                        "kind": "structured",
                        "module": f"resnet.encoder.stages.{s}.layers.{b}.layer.{j}.convolution",
                    }
                )
    protected = [f"resnet.encoder.stages.{s}.layers.{b}.layer.2" for s in range(2) for b in range(3)]
    protected += [p + ".convolution" for p in protected]
    fams = regex_families(groups, protected)
    assert len(fams) == 1 and fams[0]["count"] == 12
    pattern = re.compile(fams[0]["regex"])
    assert all(pattern.search(g["module"]) for g in groups)
    assert not any(pattern.search(p) for p in protected)
    vit = regex_families(PROFILE["groups"], PROFILE["protected"])
    assert {f["regex"] for f in vit} == {r"^vit\.layers\.(0|1)\.attention$", MLP_01}


def test_input_shape_prompt_carries_the_metadata():
    messages = render_input_shape({"config": {"image_size": 384, "num_channels": 3}, "processor": None})
    assert '"image_size": 384' in messages[1].content and "channels" in messages[0].content


# ---------------------------------------------------------------- tools


def tools_by_name(evaluate_fn=None):
    return {
        t.name: t
        for t in make_planning_tools(PlannerProfile.of(PROFILE), probe_records(SENS), {"model": "tiny"}, evaluate_fn)
    }


def test_match_layers_tool_lists_matches_and_explains_misses():
    tools = tools_by_name()
    answer = json.loads(tools["match_layers"].invoke({"pattern": r"attention$", "kind": "head"}))
    assert answer["matched"] == 2 and answer["groups"][0]["units"] == 4
    assert answer["total_shares"]["params_share"] == pytest.approx(
        sum(PROFILE["group_costs"][f"layers.{i}.heads"]["params_share"] for i in range(2)), rel=1e-3
    )
    miss = tools["match_layers"].invoke({"pattern": r"attention$", "kind": "structured"})
    assert miss.startswith("error: no structured group") and "other kind" in miss
    assert tools["match_layers"].invoke({"pattern": "(fc", "kind": "head"}).startswith("error: the regex")
    hit = json.loads(tools["match_layers"].invoke({"pattern": r"layers\.0\.", "kind": "structured"}))
    assert "vit.layers.0.layernorm_before" in hit["protected_matches"]


def test_layer_profile_tool_sorts_and_marks_groups():
    tools = tools_by_name()
    answer = json.loads(tools["layer_profile"].invoke({"top": 3, "sort_by": "params"}))
    params = [row["params"] for row in answer["layers"]]
    assert len(params) == 3 and params == sorted(params, reverse=True)
    rows = json.loads(tools["layer_profile"].invoke({"top": 100}))["layers"]
    assert len(rows) == min(40, len(PROFILE["layers"]))
    by_name = {r["name"]: r for r in rows}
    assert by_name["vit.layers.0.mlp.fc2"]["group"] == "layers.0.mlp"
    assert by_name["classifier"]["protected"] is True


def test_estimate_plan_tool_matches_the_planner_estimate():
    tools = tools_by_name()
    answer = json.loads(tools["estimate_plan"].invoke({"plan_json": json.dumps(PLAN)}))
    ratios = {"layers.0.mlp": 0.4, "layers.1.mlp": 0.4, "layers.0.heads": 0.25}
    expected = estimate_reduction(ratios, group_rows(PROFILE["groups"], PROFILE["group_costs"], {}), "params")
    assert answer["valid"] is True
    assert answer["predicted_reduction_from_pruning"]["params"] == pytest.approx(expected, abs=1e-3)
    assert answer["quantized_linear_layers"] == 13
    bad = json.loads(
        tools["estimate_plan"].invoke(
            {"plan_json": plan_json({"layer": r"mlp\.fc1$", "type": "structured", "ratio": 0.95})}
        )
    )
    assert bad["valid"] is False and "cap" in bad["reasons"][0]
    assert tools["estimate_plan"].invoke({"plan_json": "no json"}).startswith("error:")


def test_group_sensitivity_tool():
    tools = tools_by_name()
    one = json.loads(tools["group_sensitivity"].invoke({"group": "layers.1.heads"}))
    assert one["damage"] == pytest.approx(SENS["layers.1.heads"]["damage"]) and one["probe"]["kl"] > 0
    by_module = json.loads(tools["group_sensitivity"].invoke({"group": "vit.layers.0.mlp.fc1"}))
    assert by_module["group"] == "layers.0.mlp"
    every = json.loads(tools["group_sensitivity"].invoke({"group": "all"}))["groups"]
    assert [g["damage"] for g in every] == sorted(g["damage"] for g in every)


def test_evaluate_plan_tool_only_with_an_evaluator():
    assert "evaluate_plan" not in tools_by_name()
    seen = []

    def evaluate(plan):
        seen.append(plan)
        return Trial(accuracy_drop_pp=1.5, params=60_000, recovery="refit", seconds=2.0)

    tools = tools_by_name(evaluate)
    answer = json.loads(tools["evaluate_plan"].invoke({"plan_json": json.dumps(PLAN)}))
    # what the LLM reads: the measured facts, not how long the trial took
    assert answer == {
        "valid": True,
        "measured": {"images": 0, "judged_on": "", "accuracy_drop_pp": 1.5, "params": 60_000},
    }
    assert seen == [CompressionPlan.model_validate(PLAN)]
    rejected = json.loads(
        tools["evaluate_plan"].invoke(
            {"plan_json": plan_json({"layer": "classifier", "type": "structured", "ratio": 0.5})}
        )
    )
    assert rejected["valid"] is False and len(seen) == 1

    def broken(plan):
        raise RuntimeError("out of memory")

    failing = tools_by_name(broken)["evaluate_plan"].invoke({"plan_json": json.dumps(PLAN)})
    assert failing.startswith("error: evaluation failed: RuntimeError")


# ---------------------------------------------------------------- input shape resolver


@pytest.mark.parametrize(
    ("script", "expected"),
    [
        (
            ['{"channels": 3, "height": 224, "width": 224, "reason": "crop_size"}'],
            {"channels": 3, "height": 224, "width": 224},
        ),
        (
            ['The shape is ```json\n{"channels": 1, "height": 28.0, "width": 28}\n```'],
            {"channels": 1, "height": 28, "width": 28},
        ),
        (
            ['{"channels": 0, "height": 224, "width": 224}', '{"channels": 3, "height": 384, "width": 384}'],
            {"channels": 3, "height": 384, "width": 384},
        ),
        (['{"channels": true, "height": 224, "width": 224}'] * 3, None),
        (['{"channels": 3, "height": 5000, "width": 224}'] * 3, None),
        (["three by two-twenty-four"] * 3, None),
        ([RuntimeError("HTTP 500")], None),
    ],
)
def test_resolve_shape_with_llm(script, expected):
    model = ScriptedChatModel(script=script)
    assert resolve_shape_with_llm({"config": {"image_size": 224}}, make_ctx(), chat_model=model) == expected


# ---------------------------------------------------------------- the real ChatOpenAI client, local server


def test_chat_openai_against_a_local_server(tmp_path):
    call = {"name": "match_layers", "args": {"pattern": MLP_01, "kind": "structured"}, "id": "call_abc"}
    script = [chat_completion(tool_calls=[call]), chat_completion(content=PLAN_TEXT)]
    with ScriptedOpenAIServer(script) as server:
        ctx = make_ctx(llm_base_url=server.base_url, llm_model="fake-model", llm_timeout=10)
        state = make_state(tmp_path)
        outcome = plan_with_llm(
            round_inputs(state, state.iteration), ctx, PROFILE, probe_records(SENS), fallback_for(state)
        )
        requests = list(server.requests)
    assert outcome.planner == "llm" and outcome.fallbacks == []
    assert outcome.plan == CompressionPlan.model_validate(PLAN)
    assert len(requests) == 2 and requests[0]["path"].endswith("/chat/completions")
    first, second = requests[0]["body"], requests[1]["body"]
    assert first["model"] == "fake-model"
    tools = {t["function"]["name"]: t["function"] for t in first["tools"]}
    assert tools["match_layers"]["parameters"]["properties"]["kind"]["enum"] == ["structured", "head"]
    tool_msgs = [m for m in second["messages"] if m["role"] == "tool"]
    assert tool_msgs[0]["tool_call_id"] == "call_abc" and "vit.layers.1.mlp.fc1" in tool_msgs[0]["content"]
    log = events(tmp_path, outcome)
    calls = [e for e in log if e["event"] == "tool_call"]
    assert calls == [{**calls[0], "name": "match_layers", "id": "call_abc", "args": call["args"]}]
    replies = [e for e in log if e["event"] == "reply"]
    assert replies[0]["usage"]["input_tokens"] == 120 and replies[0]["tool_calls"][0]["name"] == "match_layers"


def test_chat_openai_http_500_falls_back(tmp_path, monkeypatch):
    quick_request_retry(monkeypatch)
    error = (500, {"error": {"message": "boom", "type": "server_error"}})
    with ScriptedOpenAIServer([error, error]) as server:
        ctx = make_ctx(llm_base_url=server.base_url, llm_timeout=5)
        state = make_state(tmp_path)
        fallback = fallback_for(state)
        outcome = plan_with_llm(round_inputs(state, state.iteration), ctx, PROFILE, probe_records(SENS), fallback)
        n = len(server.requests)
    record = assert_fallback(outcome, fallback, "error")
    assert "500" in record.reason and n == 2  # max_retries=1: one retry


def test_chat_openai_timeout_falls_back(tmp_path, monkeypatch):
    quick_request_retry(monkeypatch)
    slow = ("sleep", 10, chat_completion(content=PLAN_TEXT))
    with ScriptedOpenAIServer([slow, slow]) as server:
        ctx = make_ctx(llm_base_url=server.base_url, llm_timeout=0.3)
        state = make_state(tmp_path)
        fallback = fallback_for(state)
        outcome = plan_with_llm(round_inputs(state, state.iteration), ctx, PROFILE, probe_records(SENS), fallback)
        assert server.requests and server.slept_out == 0  # the client gave up before any scripted sleep ended
    assert_fallback(outcome, fallback, "timeout")


def test_chat_openai_connection_refused_falls_back(tmp_path):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    ctx = make_ctx(llm_base_url=f"http://127.0.0.1:{port}/v1", llm_timeout=2)
    state = make_state(tmp_path)
    fallback = fallback_for(state)
    outcome = plan_with_llm(round_inputs(state, state.iteration), ctx, PROFILE, probe_records(SENS), fallback)
    record = assert_fallback(outcome, fallback, "error")
    assert "Connection" in record.reason


# ---------------------------------------------------------------- the real profiler's output


def real_profile(model):
    import dataclasses

    from profiling_agent.tools.compression.families import adapter_for
    from profiling_agent.tools.profiling.dynamic import profile_model
    from profiling_agent.tools.profiling.summary import group_costs

    profile = profile_model(model, (model.config.num_channels, 16, 16), warmup=1, repeats=2)
    adapter = adapter_for(model)
    profile["groups"] = [dataclasses.asdict(g) for g in adapter.prunable_groups(model)]
    profile["group_costs"] = group_costs(profile, profile["groups"])
    profile["protected"] = adapter.protected_modules(model)
    profile = json.loads(json.dumps(profile))  # as read back from profile.json
    groups = profile["groups"]
    sens = {g["name"]: {"damage": 0.1 * (i + 1), "acc_drop": 1.0, "ratio": 0.3} for i, g in enumerate(groups)}
    return profile, sens


@pytest.mark.parametrize("fixture", ["tiny_vit", "tiny_resnet"])
def test_guard_accepts_what_the_deterministic_planner_proposes_on_real_profiles(fixture, request):
    from profiling_agent.tools.planning.plan_guard import check_plan

    profile, sens = real_profile(request.getfixturevalue(fixture))
    assert profile["groups"]
    for objective in (Objective(), Objective(target="macs", target_reduction=0.6, quantize="float16")):
        deterministic = plan_round(
            PlanningProblem.of(profile["groups"], profile["group_costs"], sens, objective, [])
        ).plan
        verdict = check_plan(deterministic, PlannerProfile.of(profile))
        assert verdict.ok, verdict.reasons
    prompt = render_analysis(profile, sens, Objective())[1].content
    assert all(g["module"] in prompt for g in profile["groups"])
    assert "(structured) selects" in prompt


def test_llm_plan_on_a_real_tiny_vit_profile(tiny_vit, tmp_path):
    profile, sens = real_profile(tiny_vit)
    assert r"^vit\.layers\.(0|1)\.attention$" in render_analysis(profile, sens, Objective())[1].content
    state = make_state(tmp_path)
    fallback = plan_round(PlanningProblem.of(profile["groups"], profile["group_costs"], sens, state.objective, []))
    estimate = tool_call("estimate_plan", {"plan_json": json.dumps(PLAN)})
    model = ScriptedChatModel(script=[ai_tool_calls(estimate), PLAN_TEXT])
    outcome = plan_with_llm(
        round_inputs(state, state.iteration), make_ctx(), profile, probe_records(sens), fallback, chat_model=model
    )
    assert outcome.planner == "llm"
    answer = json.loads(next(m for m in model.calls[1] if isinstance(m, ToolMessage)).content)
    assert answer["valid"] is True and answer["predicted_reduction_from_pruning"]["params"] > 0.1


class NoToolsModel(ScriptedChatModel):
    def bind_tools(self, tools, *, tool_choice=None, **kwargs):
        raise NotImplementedError


def test_a_model_without_tool_support_still_plans(tmp_path):
    state = make_state(tmp_path)
    model = NoToolsModel(script=[PLAN_TEXT])
    outcome = plan_with_llm(
        round_inputs(state, state.iteration),
        make_ctx(),
        PROFILE,
        probe_records(SENS),
        fallback_for(state),
        chat_model=model,
    )
    assert outcome.planner == "llm" and "tools" not in model.call_kwargs[0]
    assert any(e["event"] == "note" for e in events(tmp_path, outcome))


def test_evaluate_fn_adds_the_evaluate_plan_tool(tmp_path):
    state = make_state(tmp_path)
    evaluated = []
    call = tool_call("evaluate_plan", {"plan_json": json.dumps(PLAN)})
    model = ScriptedChatModel(script=[ai_tool_calls(call), PLAN_TEXT])
    outcome = plan_with_llm(
        round_inputs(state, state.iteration),
        make_ctx(),
        PROFILE,
        probe_records(SENS),
        fallback_for(state),
        chat_model=model,
        evaluate_fn=lambda plan: evaluated.append(plan) or Trial(accuracy_drop_pp=0.5, judged_on="trial slice"),
    )
    assert outcome.planner == "llm" and "evaluate_plan" in model.bound_tools
    prompt = "".join(message_text(m) for m in model.calls[0])
    trials = prompt.count("(trial)") + prompt.count("(trial failed")  # the offered alternatives' trials, first
    assert trials and len(evaluated) == 1 + trials
    assert '"accuracy_drop_pp":0.5' in next(m for m in model.calls[1] if isinstance(m, ToolMessage)).content
