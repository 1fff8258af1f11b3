"""The state's records are typed end to end: history events forbid unknown keys, and old checkpoints still load."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph

from profiling_agent.nodes.common import event
from profiling_agent.state import AppliedGroup, HistoryEvent, LLMStep, PlannerMode, State, StateSchemaError
from profiling_agent.tools.reporting.result import planner_facts

# an LLM step as the first LLM planner recorded it (before `structured` and `vs_proposal` existed)
OLD_LLM_STEP = {
    "model": "gpt-4o",
    "planner": "llm",
    "transcript": "iter_01/llm_transcript.jsonl",
    "usage": {"calls": 2, "input_tokens": 100, "output_tokens": 20, "total_tokens": 120},
    "tool_errors": [{"name": "rm_rf", "error": "unknown tool"}],
}
OLD_PLANNER = {"requested": "auto", "mode": "llm", "note": "LLM planner, gpt-4o at the OpenAI API"}


def _legacy_values() -> dict:
    """State values as an older version checkpointed them: the planner choice and LLM step as loose extras."""
    return {
        "iteration": 1,
        "history": [
            {"node": "acquire", "iteration": 0, "time": 1.0, "message": "loaded", "safe_adapter": True},
            {
                "node": "analyze",
                "iteration": 1,
                "time": 2.0,
                "message": "llm plan: 1 pruning and 1 quantization entries",
                "rationale": "prune the widest MLP",
                "planner": OLD_PLANNER,
                "llm": OLD_LLM_STEP,
            },
        ],
        "sensitivity": {"layers.0.mlp": {"kl": 0.01, "agreement": 99.0, "damage": 0.02, "ratio": 0.3}},
        "candidates": [
            {
                "iteration": 1,
                "status": "ok",
                "planner": "llm",
                "planner_meta": {"goal": 0.3, "gamma": 1.0, "converged": False, "llm": OLD_LLM_STEP, "turn": "llm"},
                "applied": [
                    {
                        "group": "layers.0.mlp",
                        "module": "vit.layers.0.mlp.fc1",
                        "kind": "structured",
                        "ratio": 0.3,
                        "units_before": 64,
                        "units_after": 45,
                    }
                ],
            }
        ],
    }


def test_a_legacy_state_dict_loads_into_the_typed_fields():
    state = State.model_validate(_legacy_values())
    acquire, analyze = state.history
    assert acquire.safe_adapter is True and acquire.planner_choice is None and acquire.llm is None
    assert analyze.planner_choice == PlannerMode(**OLD_PLANNER)  # the old key `planner` maps to planner_choice
    assert isinstance(analyze.llm, LLMStep) and analyze.llm.usage["total_tokens"] == 120
    assert analyze.llm.structured == {} and analyze.llm.vs_proposal is None  # fields the old step did not have
    assert analyze.rationale == "prune the widest MLP"
    cand = state.candidates[0]
    assert cand.applied == [AppliedGroup(**_legacy_values()["candidates"][0]["applied"][0])]
    assert cand.planner_meta.llm == analyze.llm
    assert state.sensitivity is not None and state.sensitivity["layers.0.mlp"].damage == 0.02
    facts = planner_facts(_legacy_values()["history"])  # result.json reads the old events as typed ones
    assert facts["mode"] == "llm" and facts["mode_note"] == OLD_PLANNER["note"]
    assert facts["llm"]["transcripts"] == ["iter_01/llm_transcript.jsonl"] and facts["llm"]["usage"]["calls"] == 2


def test_a_history_key_no_version_knows_is_refused_in_one_line_naming_it():
    values = _legacy_values()
    values["history"][1]["backend_note"] = "a field this version no longer has"
    with pytest.raises(StateSchemaError) as caught:
        State.model_validate(values)
    message = str(caught.value)
    assert "\n" not in message and "'backend_note'" in message and "'analyze'" in message, message
    with pytest.raises(StateSchemaError, match="'planer'"):
        event("analyze", "a misspelt fact", 1, planer=OLD_PLANNER)


def test_an_event_is_written_as_json_with_only_the_facts_it_carries():
    (plain,) = event("profile", "profiled")
    assert set(plain) == {"node", "iteration", "time", "message"}
    choice, step = PlannerMode(**OLD_PLANNER), LLMStep.model_validate(OLD_LLM_STEP)
    (written,) = event("analyze", "planned", 1, rationale="r", planner_choice=choice, llm=step)
    assert json.loads(json.dumps(written)) == written  # plain JSON, as checkpoints hold it
    assert written["planner_choice"] == OLD_PLANNER and written["llm"]["usage"] == OLD_LLM_STEP["usage"]
    assert HistoryEvent.model_validate(written).llm == step


def _graph(saver, first, second):
    builder = StateGraph(State)
    builder.add_node("first", first)
    builder.add_node("second", second)
    builder.add_edge(START, "first")
    builder.add_edge("first", "second")
    builder.add_edge("second", END)
    return builder.compile(checkpointer=saver, interrupt_before=["second"])


def test_a_checkpoint_holding_legacy_history_keys_resumes():
    saver, config = InMemorySaver(), {"configurable": {"thread_id": "old"}}
    legacy = _legacy_values()["history"]
    old = _graph(saver, lambda s: {"history": legacy}, lambda s: {})
    old.invoke({}, config)
    assert "planner" in old.get_state(config).values["history"][1]  # the checkpoint holds the legacy key
    seen = {}

    def read(state: State) -> dict:
        seen["mode"] = state.history[-1].planner_choice.mode
        return {"history": event("second", "resumed")}

    new = _graph(saver, lambda s: {}, read)
    new.invoke(None, config)
    assert seen == {"mode": "llm"} and new.get_state(config).values["history"][-1]["node"] == "second"
    config = {"configurable": {"thread_id": "unknown"}}
    new.invoke({}, config)
    new.update_state(config, {"history": [{**legacy[1], "backend_note": "x"}]})  # as another version saved it
    with pytest.raises(StateSchemaError, match="'backend_note'"):
        new.invoke(None, config)


CHECKPOINT_READ = """
import logging, sys
logging.basicConfig(level=logging.WARNING, stream=sys.stdout, format="%(message)s")
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from profiling_agent.graph.checkpoint import close_checkpointer, open_checkpointer
from profiling_agent.state import CompressionPlan, Objective, ProfileSummary

value = {"profile": ProfileSummary(), "plan": CompressionPlan(), "nested": {"objective": Objective()}}
saver = open_checkpointer(sys.argv[1])
back = saver.serde.loads_typed(saver.serde.dumps_typed(value))
close_checkpointer(saver)
print("ours", back == value and type(back["nested"]["objective"]).__name__, flush=True)
plain = JsonPlusSerializer()
print("plain", plain.loads_typed(plain.dumps_typed(value)) == value, flush=True)
"""


def test_checkpoints_rebuild_the_state_models_without_langgraphs_unregistered_type_warning(tmp_path):
    """Our checkpointers name the state's models: they read back as themselves, without the warning a plain
    serializer logs (once per type and process, hence a fresh process)."""
    import subprocess
    import sys

    from profiling_agent.graph.serde import state_types

    assert {("profiling_agent.state", "ProfileSummary"), ("profiling_agent.state", "PlannerMode")} <= set(state_types())
    proc = subprocess.run([sys.executable, "-c", CHECKPOINT_READ, str(tmp_path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    ours, plain = lines.index("ours Objective"), lines.index("plain True")
    warned = [line for line in lines if "unregistered type profiling_agent." in line]
    assert warned and all(lines.index(line) > ours for line in warned), lines  # only the plain serializer warned
    assert plain > ours


def _format0_writer():
    """tests/data/make_checkpoint_format0.py, the script that wrote the format-0 checkpoint (loaded by path)."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "data" / "make_checkpoint_format0.py"
    spec = importlib.util.spec_from_file_location("make_checkpoint_format0", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_checkpoint_written_before_the_state_package_split_resumes(tmp_path, caplog):
    """A checkpoint of the first `state.py` (before the `state/` package) names its models
    `profiling_agent.state.NAME`: they rebuild as today's classes (not left as dicts by LangGraph's allow-list), its
    legacy history key upgrades, and the thread runs on."""
    import shutil

    from profiling_agent.graph.checkpoint import close_checkpointer, migrate_checkpoint, open_checkpointer, saved_format
    from profiling_agent.state import Candidate, EvalRecord, GroupSensitivity, ProfileSummary

    writer = _format0_writer()
    shutil.copy(
        Path(__file__).resolve().parents[1] / "data" / "checkpoint_format0.sqlite", tmp_path / "checkpoints.sqlite"
    )
    saver = open_checkpointer(tmp_path)
    config = {"configurable": {"thread_id": writer.THREAD}}
    assert saved_format(saver, config) == 0
    seen = {}

    def second(state: State) -> dict:
        seen["speedup"] = state.current.eval.speedup
        seen["mode"] = state.history[-1].planner_choice.mode
        return {"history": event("second", "resumed")}

    graph = writer.graph(saver, second)
    with caplog.at_level("WARNING"):
        values = graph.get_state(config).values
        assert isinstance(values["profile"], ProfileSummary) and isinstance(values["baseline_eval"], EvalRecord)
        assert isinstance(values["current"], Candidate) and isinstance(values["candidates"][0], Candidate)
        assert isinstance(values["sensitivity"]["blocks.1.mlp"], GroupSensitivity)
        assert values["current"].planner_meta.llm.structured == {"mode": "json_schema"}
        # rebuilt by validation (a failed validation would leave LangGraph's unvalidated model_construct copy)
        assert ProfileSummary.model_validate(values["profile"].model_dump()) == values["profile"]
        assert values["profile"].operators == [{"op": "aten::linear", "self_ms": 1.5, "share": 0.3}]
        assert migrate_checkpoint(graph, saver, config) == []  # no renamed node pending in this one
        graph.invoke(None, config)
    assert seen == {"speedup": 1.33, "mode": "deterministic"}
    assert graph.get_state(config).values["history"][-1]["node"] == "second"
    assert not [r for r in caplog.records if "profiling_agent.state" in r.getMessage()], caplog.text
    close_checkpointer(saver)


def test_a_checkpoint_of_a_newer_state_format_is_refused_in_one_line(tmp_path):
    from profiling_agent.graph.checkpoint import CheckpointFormatError, migrate_checkpoint
    from profiling_agent.state import STATE_FORMAT

    saver, config = InMemorySaver(), {"configurable": {"thread_id": "future"}}
    graph = _graph(saver, lambda s: {"state_format": STATE_FORMAT + 1}, lambda s: {})
    graph.invoke({}, config)
    with pytest.raises(CheckpointFormatError, match=f"state format {STATE_FORMAT + 1}, newer"):
        migrate_checkpoint(graph, saver, config)


def test_each_choice_is_defined_once_and_the_cli_and_context_follow_it():
    """The CLI's choices are the state's Literals, and a Context refuses a value outside them."""
    from typing import get_args

    from profiling_agent.graph.cli.args import build_parser
    from profiling_agent.state import CONTEXT_CHOICES, BackendChoice, Context, RecoverChoice

    assert "openvino" in get_args(BackendChoice)
    sub = next(a for a in build_parser()._actions if isinstance(a.choices, dict))
    run = sub.choices["run"]
    flags = {a.dest: a.choices for a in run._actions if a.choices}
    assert flags["backend"] == list(get_args(BackendChoice)) and flags["recover"] == list(get_args(RecoverChoice))
    for name, kind in CONTEXT_CHOICES.items():
        if name in flags:
            assert flags[name] == list(get_args(kind)), name
        with pytest.raises(ValueError, match=f"Context.{name} must be one of"):
            Context(**{name: "bogus"})
    assert Context.of({"backend": "openvino", "recover": "distill", "importance": "l1"}).backend == "openvino"


PROFILE_SUMMARY = {  # as tools/profiling/summary.py writes it into the state and result.json
    "path": "profile.json",
    "totals": {"params": 3, "macs": None, "latency_ms": 1.2, "act_bytes": 10},
    "env": {"device": "cpu", "threads": 2, "input_shape": [1, 16, 16], "batch": 1},
    "groups": {"columns": ["params_share", "macs_share", "latency_share"], "rows": {"a": [0.1, 0.2, 0.3]}},
    "operators": [{"op": "aten::linear", "self_ms": 1.5, "share": 0.3}],
    "top_latency": [{"name": "x", "type": "Linear", "latency_ms": 0.5, "latency_share": 0.1, "macs_share": 0.0}],
    "top_macs": [{"name": "x", "macs": 100, "macs_share": 0.2}],
    "error": None,
    "backend": None,
}


def test_the_typed_rows_load_and_dump_todays_json_unchanged_and_refuse_an_unknown_key():
    from profiling_agent.state import Fallback, ProfileSummary

    profile = ProfileSummary.model_validate(PROFILE_SUMMARY)
    assert json.loads(profile.model_dump_json()) == PROFILE_SUMMARY and profile.model_dump() == PROFILE_SUMMARY
    assert ProfileSummary().model_dump()["env"] == {} and LLMStep().model_dump()["structured"] == {}
    step = {**OLD_LLM_STEP, "structured": {"choice": "auto", "mode": "json_schema", "confirmed": True, "given_up": []}}
    assert LLMStep.model_validate(step).model_dump(exclude_defaults=True) == step
    rejected = [{"stage": "guard", "reasons": ["too deep"], "answer": "{}", "structured": "json_object"}]
    fallback = {"iteration": 1, "stage": "parse", "reason": "r", "rejected": rejected, "tool_errors": [], "model": "m"}
    assert Fallback.model_validate(fallback).model_dump() == fallback
    with pytest.raises(ValueError, match="bogus"):
        ProfileSummary.model_validate({**PROFILE_SUMMARY, "env": {**PROFILE_SUMMARY["env"], "bogus": 1}})
    with pytest.raises(ValueError, match="bogus"):
        Fallback.model_validate({**fallback, "rejected": [{**rejected[0], "bogus": 1}]})
