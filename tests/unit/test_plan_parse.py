"""Tests of reading a plan out of an LLM reply (tools/planning/json_extract.py, plan_parse.py)."""

import json

import pytest
from helpers.fake_llm import FIRST_ROUND_REPLY, REAL_REPLY

from profiling_agent.tools.planning.json_extract import (
    brace_spans,
    brackets_balanced,
    close_left_open,
    escape_stray_backslashes,
)
from profiling_agent.tools.planning.plan_parse import parse_plan_text


def test_the_real_reply_parses_to_the_plan_the_model_wrote():
    plan, notes = parse_plan_text(REAL_REPLY)
    assert [e["layer"] for e in plan["pruning"]] == [
        "^vit\\.layers\\.(0|1|2|3)\\.attention$",
        "^vit\\.layers\\.(0|1|2|3)\\.mlp\\.fc1$",
    ]
    assert [(e["type"], e["ratio"]) for e in plan["pruning"]] == [("head", 0.4), ("structured", 0.5)]
    assert plan["quantization"] == [
        {"layer": "all", "type": "dynamic", "dtype": "qint8", "justification": "Linear-heavy"}
    ]
    assert plan["rationale"] == "prune the cheap-to-lose blocks"
    assert notes == ["repaired the reply's JSON: escaped stray backslashes"]


def test_the_first_round_variant_keeps_its_structured_attention_entry():
    plan, _ = parse_plan_text(FIRST_ROUND_REPLY)
    assert [e["type"] for e in plan["pruning"]] == ["structured", "structured"]
    assert len(plan["quantization"]) == 1


def test_valid_escapes_are_left_alone_and_stray_ones_doubled():
    assert escape_stray_backslashes(r'{"a": "x\\.y\n\"q\""}') == r'{"a": "x\\.y\n\"q\""}'
    assert escape_stray_backslashes(r'{"a": "\d+\.fc1"}') == r'{"a": "\\d+\\.fc1"}'
    assert json.loads(escape_stray_backslashes(r'{"a": "^vit\.layers\.\d+$"}'))["a"] == r"^vit\.layers\.\d+$"
    assert escape_stray_backslashes(r"outside \. strings") == r"outside \. strings"


def test_a_reply_whose_only_parseable_objects_are_fragments_is_refused():
    cut = REAL_REPLY.replace("```json\n", "").split('"rationale"')[0]  # ends after the quantization list
    assert cut.count("{") > cut.count("}")
    with pytest.raises(ValueError, match="cut off"):
        parse_plan_text(cut)
    with pytest.raises(ValueError, match="not a plan"):  # an entry alone never passes for a plan
        parse_plan_text('Use this: {"layer": "all", "type": "dynamic", "dtype": "qint8"}')


def test_prose_and_broken_json_are_refused_with_the_reason():
    with pytest.raises(ValueError, match="no JSON object"):
        parse_plan_text("I would prune the MLP layers by about 30% and quantize everything.")
    with pytest.raises(ValueError, match="could not be parsed"):
        parse_plan_text('```json\n{"pruning": [}\n```')  # not "repaired" into an empty pruning list
    with pytest.raises(ValueError, match="empty"):
        parse_plan_text("   ")


def test_unknown_keys_holding_content_refuse_the_plan():
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['prune'\]"):
        parse_plan_text('{"prune": [{"layer": "fc1", "type": "structured", "ratio": 0.3}], "quantization": []}')
    with pytest.raises(ValueError, match=r"pruning\[0\]: unknown key\(s\) \['layers'\]"):
        parse_plan_text('{"pruning": [{"layers": ["a", "b"], "type": "head", "ratio": 0.3}]}')
    plan, notes = parse_plan_text('{"pruning": [], "quantization": [], "confidence": 0.8}')  # a scalar: noted
    assert plan["pruning"] == [] and any("confidence" in n for n in notes)


def test_common_model_faults_are_repaired():
    plan, notes = parse_plan_text("{'pruning': [{'groups': ['layers.0.mlp'], 'type': 'structured', 'ratio': 0.3}],"
                                  " 'quantization': [], 'rationale': None}")  # fmt: skip
    assert plan["pruning"] == [{"groups": ["layers.0.mlp"], "type": "structured", "ratio": 0.3}]
    assert any("json-repair" in n for n in notes)
    plan, notes = parse_plan_text('Plan:\n{"pruning": [], "quantization": [{"layer": "all"},],}\nThanks')
    assert plan["quantization"] == [{"layer": "all"}] and any("trailing commas" in n for n in notes)
    plan, _ = parse_plan_text('{"plan": {"pruning": [], "quantization": [{"layer": "all"}]}}')
    assert plan["quantization"] == [{"layer": "all"}]


def test_spans_are_string_aware_and_balance_is_checked():
    assert [s for s, _ in brace_spans('a {"x": "}"} b {"y": 1}')] == ['{"x": "}"}', '{"y": 1}']
    assert brace_spans('{"x": [1, {"y": 2}')[-1][1] is True  # inside an object that never closes
    assert brackets_balanced("{'a': ['}']}") and not brackets_balanced('{"a": [}')


def test_a_quantization_entry_written_into_pruning_moves_to_quantization():
    # Qwen2.5-Coder-1.5B's answer on the embedded ResNet (docs/llm-planner.md): a "dynamic" entry among the prunes
    plan, notes = parse_plan_text(
        '{"pruning": [{"groups": ["layer1.0"], "type": "structured", "ratio": 0.3},'
        ' {"layer": "all", "type": "dynamic", "dtype": "qint8", "ratio": 0.5, "justification": "smaller"}],'
        ' "quantization": []}'
    )
    assert plan["pruning"] == [{"groups": ["layer1.0"], "type": "structured", "ratio": 0.3}]
    assert plan["quantization"] == [{"layer": "all", "type": "dynamic", "dtype": "qint8", "justification": "smaller"}]
    assert any("moved to quantization" in n for n in notes)
    bare, _ = parse_plan_text('{"pruning": [{"type": "dynamic"}]}')  # no layer: every Linear layer
    assert bare["pruning"] == [] and bare["quantization"] == [{"type": "dynamic", "layer": "all"}]
    twice, notes = parse_plan_text(  # Qwen's copy of A on the zoo ViT: the same entry in both lists
        '{"pruning": [{"layer": "all", "type": "dynamic", "dtype": "qint8"}],'
        ' "quantization": [{"layer": "all", "type": "dynamic", "dtype": "qint8"}]}'
    )
    assert twice["quantization"] == [{"layer": "all", "type": "dynamic", "dtype": "qint8"}]
    assert any("dropped where the quantization list already had it" in n for n in notes)
    named, _ = parse_plan_text('{"pruning": [{"groups": ["layer1.0"], "type": "dynamic", "ratio": 0.3}]}')
    assert named["quantization"] == [] and named["pruning"][0]["type"] == "dynamic"  # groups: left to the schema


def test_an_entry_left_open_when_its_list_closes_is_closed_there():
    # Qwen2.5-Coder-1.5B's answer on the embedded ViT (docs/llm-planner.md): each list's last entry lacks its "}"
    reply = (
        '```json\n{\n  "pruning": [\n    {"groups": ["layers.0.mlp"], "type": "structured", "ratio": 0.5},\n'
        '    {"groups": ["layers.3.heads"], "type": "head", "ratio": 0.25, "justification": "cheap ]"\n  ],\n'
        '  "quantization": [\n    {"layer": "all", "type": "dynamic", "dtype": "qint8"\n  ],\n'
        '  "rationale": "r"\n}\n```'
    )
    plan, notes = parse_plan_text(reply)
    assert [e["groups"] for e in plan["pruning"]] == [["layers.0.mlp"], ["layers.3.heads"]]
    assert plan["pruning"][1]["justification"] == "cheap ]"  # a bracket inside a string closes nothing
    assert plan["quantization"] == [{"layer": "all", "type": "dynamic", "dtype": "qint8"}]
    assert any("left open" in n for n in notes)
    assert close_left_open('{"pruning": [}') == '{"pruning": [}'  # a stray brace is not read as an empty list
    assert close_left_open('{"a": [{"b": 1') == '{"a": [{"b": 1'  # a truncated reply stays truncated
