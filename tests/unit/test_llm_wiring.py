"""Fast tests of the LLM wiring: CLI configuration, planner resolution, shape resolver, plan evaluator, reporting."""

from __future__ import annotations

import copy
import json
from types import SimpleNamespace

import pytest
import torch
from helpers.fake_llm import ScriptedChatModel, ai_tool_calls, probe_records, tool_call, vit_profile, vit_sensitivity
from langchain_core.messages import AIMessage

from profiling_agent.graph.cli.args import EXIT_BAD_INPUT, build_parser, context_from_args
from profiling_agent.graph.cli.main import main
from profiling_agent.nodes.analyze import round_inputs
from profiling_agent.state import CompressionPlan, Context, Objective, PlanningProblem, State
from profiling_agent.tools.models.input_shape import resolve_input_shape
from profiling_agent.tools.planning.deterministic import plan_round
from profiling_agent.tools.planning.llm_config import describe_endpoint, planner_mode
from profiling_agent.tools.planning.llm_planner import plan_with_llm
from profiling_agent.tools.planning.trials import PlanEvaluator
from profiling_agent.tools.reporting.markdown import fallback_lines, md_text, render_markdown
from profiling_agent.tools.reporting.result import planner_facts
from profiling_agent.tools.shape.llm_shape import settle_input_shape, shape_metadata

LLM_ENV = ("OPENAI_BASE_URL", "OPENAI_API_KEY", "OPENAI_MODEL", "PA_WIRING_KEY")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in LLM_ENV:
        monkeypatch.delenv(name, raising=False)


# ---------------------------------------------------------------- configuration


def _one_line_error(capsys, argv):
    code = main(argv)
    err = capsys.readouterr().err
    assert code == EXIT_BAD_INPUT
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    return err


def test_planner_llm_without_an_llm_is_a_one_line_error_naming_the_setting(tmp_path, capsys):
    err = _one_line_error(capsys, ["run", "--planner", "llm", "--run-dir", str(tmp_path)])
    assert "--planner llm needs an LLM endpoint" in err and "OPENAI_BASE_URL" in err and "OPENAI_API_KEY" in err
    err = _one_line_error(
        capsys, ["run", "--planner", "llm", "--llm-api-key-env", "PA_WIRING_KEY", "--run-dir", str(tmp_path)]
    )
    assert "PA_WIRING_KEY" in err
    assert not list(tmp_path.glob("*/run.json"))  # refused before any thread was created


@pytest.mark.parametrize(
    "flags, fragment",
    [
        (["--llm-timeout", "0"], "--llm-timeout"),
        (["--llm-first-token-timeout", "-5"], "--llm-first-token-timeout"),
        (["--llm-idle-timeout", "7200"], "--llm-idle-timeout"),
        (["--llm-retries", "-1"], "--llm-retries"),
        (["--llm-tool-rounds", "99"], "--llm-tool-rounds"),
        (["--temperature", "5"], "--temperature"),
        (["--llm-api-key-env", "sk-live key"], "--llm-api-key-env"),
        (["--llm-base-url", "file:///etc/passwd"], "--llm-base-url"),
    ],
)
def test_bad_llm_flags_are_one_line_errors(tmp_path, capsys, flags, fragment):
    assert fragment in _one_line_error(capsys, ["run", "--run-dir", str(tmp_path), *flags])


def test_llm_flags_and_environment_fill_the_context(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_MODEL", "env-model")
    args = build_parser().parse_args(
        [
            "run",
            "--run-dir",
            str(tmp_path),
            "--llm-retries",
            "0",
            "--llm-tool-rounds",
            "3",
            "--llm-timeout",
            "7.5",
            "--llm-first-token-timeout",
            "420",
            "--llm-idle-timeout",
            "30",
            "--temperature",
            "0.2",
            "--llm-api-key-env",
            "PA_WIRING_KEY",
            "--llm-base-url",
            "http://127.0.0.1:9/v1",
        ]
    )
    ctx = Context(**context_from_args(args))
    assert (ctx.llm_model, ctx.llm_retries, ctx.llm_tool_rounds, ctx.llm_timeout) == ("env-model", 0, 3, 7.5)
    assert (ctx.llm_first_token_timeout, ctx.llm_idle_timeout) == (420.0, 30.0)
    assert (ctx.llm_temperature, ctx.llm_api_key_env, ctx.llm_base_url) == (
        0.2,
        "PA_WIRING_KEY",
        "http://127.0.0.1:9/v1",
    )
    args = build_parser().parse_args(["run", "--run-dir", str(tmp_path), "--llm-model", "flag-model"])
    assert context_from_args(args)["llm_model"] == "flag-model"  # the flag wins over $OPENAI_MODEL


def test_planner_mode_resolves_auto_and_names_what_is_missing(monkeypatch):
    ctx = Context(llm_api_key_env="PA_WIRING_KEY")
    assert planner_mode("deterministic", ctx).mode == "deterministic"
    assert planner_mode("l2", ctx).mode == "l2"
    choice = planner_mode("auto", ctx)
    mode, note = choice.mode, choice.note
    assert mode == "deterministic" and "no LLM configured" in note and "PA_WIRING_KEY" in note
    with pytest.raises(ValueError, match="PA_WIRING_KEY"):
        planner_mode("llm", ctx)
    monkeypatch.setenv("PA_WIRING_KEY", "sk-secret-value")
    choice = planner_mode("auto", ctx)
    mode, note = choice.mode, choice.note
    assert mode == "llm" and "gpt-4o at the OpenAI API" in note and "sk-secret" not in note
    ctx = Context(llm_base_url="https://user:pw@llm.example:8443/v1?token=x")
    assert describe_endpoint(ctx) == "gpt-4o at https://llm.example:8443/v1"


# ---------------------------------------------------------------- input-shape resolver


def _ambiguous(tiny_vit):
    processor = SimpleNamespace(size={"height": 32, "width": 32}, image_mean=[0.5], do_resize=True)
    shape = resolve_input_shape(tiny_vit, processor)
    assert shape["ambiguous"] and shape["candidates"] == [[1, 16, 16], [1, 32, 32]]
    return processor, shape


def _shape_ctx():
    return Context(llm_timeout=2.0, llm_retries=1)


def test_an_ambiguous_shape_takes_the_llm_answer_when_a_forward_pass_proves_it(tiny_vit):
    processor, shape = _ambiguous(tiny_vit)
    model = ScriptedChatModel(script=['{"channels": 1, "height": 16, "width": 16, "reason": "config"}'])
    out = settle_input_shape(tiny_vit, processor, shape, _shape_ctx(), use_llm=True, chat_model=model)
    assert (out["channels"], out["height"], out["width"], out["source"]) == (1, 16, 16, "llm")
    assert out["llm"]["verified"] is True and out["verified"] == "forward pass"
    prompt = model.calls[0][1].content
    assert '"image_size": 16' in prompt and "processor gives 32x32" in prompt


def test_a_wrong_llm_shape_is_not_used(tiny_vit):
    processor, shape = _ambiguous(tiny_vit)
    model = ScriptedChatModel(script=['{"channels": 3, "height": 224, "width": 224}'])
    out = settle_input_shape(tiny_vit, processor, shape, _shape_ctx(), use_llm=True, chat_model=model)
    assert (out["channels"], out["height"], out["width"]) == (1, 16, 16) and out["source"] != "llm"
    assert out["llm"] == {"answer": {"channels": 3, "height": 224, "width": 224}, "verified": False, "model": "gpt-4o"}
    assert out["tried"][0]["from"] == "llm" and "failed" in out["tried"][0]["error"]


def test_an_implausibly_large_llm_shape_is_never_run(tiny_vit, monkeypatch):
    from profiling_agent.tools.shape import llm_shape

    ran, real = [], llm_shape._verified
    monkeypatch.setattr(llm_shape, "_verified", lambda model, chw: ran.append(chw) or real(model, chw))
    processor, shape = _ambiguous(tiny_vit)
    for answer in ('{"channels": 3, "height": 4096, "width": 4096}', '{"channels": 16, "height": 16, "width": 16}'):
        out = settle_input_shape(
            tiny_vit, processor, shape, _shape_ctx(), use_llm=True, chat_model=ScriptedChatModel(script=[answer])
        )
        assert (out["height"], out["width"]) == (16, 16) and out["tried"][0]["from"] == "llm"
        assert "not tried" in out["tried"][0]["error"]
    assert ran == [[1, 16, 16], [1, 16, 16]]  # only the static shape ran a forward pass


@pytest.mark.parametrize("script", [["no idea"] * 2, [RuntimeError("server down")], ['{"channels": 1e9}'] * 2])
def test_a_useless_llm_answer_leaves_the_verified_static_shape(tiny_vit, script):
    processor, shape = _ambiguous(tiny_vit)
    model = ScriptedChatModel(script=script)
    out = settle_input_shape(tiny_vit, processor, shape, _shape_ctx(), use_llm=True, chat_model=model)
    assert (out["channels"], out["height"], out["width"]) == (1, 16, 16) and out["llm"]["answer"] is None


def test_the_llm_is_not_asked_when_the_shape_is_clear_or_llm_use_is_off(tiny_vit):
    model = ScriptedChatModel(script=['{"channels": 1, "height": 16, "width": 16}'])
    clear = resolve_input_shape(tiny_vit, SimpleNamespace(size={"height": 16, "width": 16}, image_mean=[0.5]))
    assert not clear["ambiguous"]
    out = settle_input_shape(tiny_vit, None, clear, _shape_ctx(), use_llm=True, chat_model=model)
    assert out["verified"] == "forward pass" and "llm" not in out
    processor, shape = _ambiguous(tiny_vit)
    out = settle_input_shape(tiny_vit, processor, shape, _shape_ctx(), use_llm=False, chat_model=model)
    assert "llm" not in out and (out["height"], out["width"]) == (16, 16)
    assert model.calls == []


def test_no_working_shape_is_a_one_line_error(tiny_vit):
    shape = {
        "channels": 3,
        "height": 7,
        "width": 7,
        "source": "default",
        "ambiguous": True,
        "notes": [],
        "candidates": [[3, 7, 7]],
    }
    model = ScriptedChatModel(script=['{"channels": 2, "height": 9, "width": 9}'])
    with pytest.raises(ValueError, match="no input shape passed the forward pass") as err:
        settle_input_shape(tiny_vit, None, shape, _shape_ctx(), use_llm=True, chat_model=model)
    assert "\n" not in str(err.value)
    assert shape_metadata(tiny_vit, None, shape)["processor"] is None


# ---------------------------------------------------------------- evaluate_plan's real work


def test_plan_evaluator_prunes_a_fresh_copy_and_measures_it(tiny_vit):
    torch.manual_seed(0)
    pixels, labels = torch.randn(12, 1, 16, 16), torch.randint(0, 10, (12,))
    before = {k: v.clone() for k, v in tiny_vit.state_dict().items()}
    evaluate = PlanEvaluator(lambda: copy.deepcopy(tiny_vit), pixels, labels, max_calls=2)
    plan = CompressionPlan.model_validate(
        {
            "pruning": [{"layer": r"^vit\.layers\.0\.mlp\.fc1$", "type": "structured", "ratio": 0.5}],
            "quantization": [{"layer": "all", "type": "dynamic", "dtype": "qint8"}],
        }
    )
    out = evaluate(plan)
    assert out.images == 12 and out.groups_pruned == 1 and out.quantized_linear_layers
    assert out.params == sum(p.numel() for p in tiny_vit.parameters()) - 32 * (32 + 1 + 32)
    assert out.agreement is not None and 0 <= out.agreement <= 100
    assert out.baseline_calib_accuracy is not None and out.calib_accuracy is not None
    assert out.accuracy_drop_pp == pytest.approx(out.baseline_calib_accuracy - out.calib_accuracy)
    assert out.evaluations_left == 1 and out.recovery == "none" and out.seconds is not None and out.seconds >= 0
    assert all(torch.equal(before[k], v) for k, v in tiny_vit.state_dict().items())  # the baseline is untouched
    empty = evaluate(CompressionPlan())
    assert empty.agreement == 100.0 and empty.params_reduction == 0.0
    with pytest.raises(RuntimeError, match="evaluation budget"):
        evaluate(plan)


# ---------------------------------------------------------------- usage and refused tools


def test_usage_and_refused_tool_calls_are_recorded(tmp_path):
    profile = vit_profile(n_layers=2)
    sens = vit_sensitivity(profile)
    state = State(run_path=str(tmp_path), family="vit", objective=Objective())
    fallback = plan_round(PlanningProblem.of(profile["groups"], profile["group_costs"], sens, state.objective, []))
    usage = {"input_tokens": 100, "output_tokens": 20, "total_tokens": 120}
    script = [
        AIMessage(content="", tool_calls=[tool_call("rm_rf", {"path": "/"})], usage_metadata=usage),
        AIMessage(content="nothing useful", usage_metadata=usage),
    ]
    ctx = Context(llm_timeout=2.0, llm_retries=0, llm_api_key_env="PA_WIRING_KEY")
    outcome = plan_with_llm(
        round_inputs(state, state.iteration),
        ctx,
        profile,
        probe_records(sens),
        fallback,
        chat_model=ScriptedChatModel(script=script),
    )
    assert outcome.planner == "deterministic"
    assert outcome.usage == {"calls": 2, "input_tokens": 200, "output_tokens": 40, "total_tokens": 240}
    assert outcome.tool_errors == [{"name": "rm_rf", "error": "unknown tool: refused, nothing was run"}]
    assert outcome.fallbacks[0].tool_errors == outcome.tool_errors
    summary = outcome.summary("m")
    assert summary.transcript == "iter_01/llm_transcript.jsonl" and summary.usage["total_tokens"] == 240
    lines = (tmp_path / summary.transcript).read_text().splitlines()
    assert [json.loads(line)["event"] for line in lines[-4:]] == ["usage", "structured", "fallback", "final"]
    bad_args = ScriptedChatModel(script=[ai_tool_calls(tool_call("layer_profile", {"top": "many"})), "{}"])
    outcome = plan_with_llm(
        round_inputs(state, state.iteration), ctx, profile, probe_records(sens), fallback, chat_model=bad_args
    )
    assert outcome.tool_errors and outcome.tool_errors[0]["name"] == "layer_profile"


# ---------------------------------------------------------------- reporting


def _analyze_event(iteration, mode, llm=None):
    return {
        "node": "analyze",
        "iteration": iteration,
        "time": 0.0,
        "message": "",
        "llm": llm,
        "planner": {"requested": "auto", "mode": mode, "note": f"{mode} because"},
    }


def test_planner_facts_sum_usage_and_list_transcripts():
    step = {
        "model": "m",
        "transcript": "iter_01/llm_transcript.jsonl",
        "tool_errors": [{"name": "x", "error": "e"}],
        "usage": {"calls": 2, "input_tokens": 10, "output_tokens": 5, "total_tokens": 15},
    }
    later = {**step, "transcript": "iter_02/llm_transcript.jsonl", "tool_errors": []}
    history = [
        {"node": "profile", "iteration": 0, "time": 0.0, "message": ""},
        _analyze_event(1, "llm", step),
        _analyze_event(2, "llm", later),
    ]
    facts = planner_facts(history)
    assert facts["mode"] == "llm" and facts["mode_note"] == "llm because"
    assert facts["llm"]["usage"] == {"calls": 4, "input_tokens": 20, "output_tokens": 10, "total_tokens": 30}
    assert facts["llm"]["transcripts"] == ["iter_01/llm_transcript.jsonl", "iter_02/llm_transcript.jsonl"]
    assert facts["llm"]["tool_errors"] == [{"name": "x", "error": "e", "iteration": 1}]
    assert planner_facts([_analyze_event(1, "deterministic")]) == {
        "mode": "deterministic",
        "mode_note": "deterministic because",
        "llm": None,
    }
    assert planner_facts([])["mode"] is None


def test_the_fallback_section_lists_stage_reason_and_rejected_items_inertly():
    fallbacks = [
        {
            "iteration": 2,
            "stage": "guard",
            "reason": "4 invalid answers; last: ratio 0.99 exceeds the cap",
            "rejected": [
                {
                    "stage": "parse",
                    "reasons": ["no JSON object found"],
                    "answer": "<img src=x onerror=alert(1)> [click](http://evil) | `rm -rf /`",
                },
                {"stage": "guard", "reasons": [r"pruning[0] layer '^a\.b$': ratio 0.99 exceeds"], "answer": "{}"},
            ],
            "tool_errors": [{"name": "run_shell", "error": "unknown tool: refused, nothing was run"}],
        }
    ]
    text = "\n".join(fallback_lines(fallbacks))
    assert "## Planner fallbacks" in text and "### Iteration 2: guard" in text
    assert "1. rejected at parse: no JSON object found" in text and "ratio 0.99 exceeds" in text
    assert "<img" not in text and "&lt;img" in text and "\\[click\\]" in text and "`rm" not in text
    assert r"'^a\\.b$'" in text  # backslashes escaped, so the regex renders as written
    assert "tool call `run_shell` refused" in text
    assert fallback_lines([]) == []
    assert md_text("a\nb" + "x" * 500, limit=20).endswith("...") and "\n" not in md_text("a\nb")


def test_render_markdown_includes_the_planner_facts_and_fallbacks():
    result = {
        "thread_id": "t",
        "model": {"ref": "m"},
        "dataset": {"ref": "d", "split": "test"},
        "family": "vit",
        "labels": {"method": "identical"},
        "objective": {"target": "params", "target_reduction": 0.4},
        "planner": {
            "requested": "auto",
            "used": ["deterministic"],
            "mode": "llm",
            "mode_note": "LLM planner",
            "fallbacks": [
                {
                    "iteration": 1,
                    "stage": "timeout",
                    "reason": "no reply within 1.5 s",
                    "rejected": [],
                    "tool_errors": [],
                }
            ],
            "llm": {
                "model": "m",
                "transcripts": ["iter_01/llm_transcript.jsonl"],
                "tool_errors": [],
                "usage": {"calls": 1, "input_tokens": 0, "output_tokens": 0, "total_tokens": 0},
            },
        },
        "baseline": {},
        "best": None,
        "candidates": [],
        "versions": {"torch": "x"},
    }
    text = render_markdown(result)
    assert "fallbacks: 1 (LLM planner)" in text and "- LLM: m, 1 calls, 0 tokens" in text
    assert "`iter_01/llm_transcript.jsonl`" in text
    assert "### Iteration 1: timeout" in text and "Reason: no reply within 1.5 s" in text
