"""One meaning, one place: the run layout, the settings' choices, `ratio` and `looks_like_path` each defined once."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from helpers.source_trees import parsed

from profiling_agent.tools import run_layout
from profiling_agent.tools.evaluation.variants import ratio
from profiling_agent.tools.hub import looks_like_path
from profiling_agent.tools.settings import BACKENDS, RUNTIMES, backend_or_default

ROOT = Path(__file__).resolve().parents[2]
CODE = [p for d in ("graph", "nodes", "tools", "bench") for p in sorted((ROOT / d).rglob("*.py"))]


def test_iteration_names_round_trip():
    assert run_layout.iteration_name(3) == "iter_03"
    assert run_layout.iteration_name(12) == "iter_12"
    assert run_layout.iteration_dir("/runs/t", 1) == Path("/runs/t/iter_01")
    assert run_layout.iteration_of("iter_07") == 7
    assert run_layout.iteration_of("iter_x") is None and run_layout.iteration_of("best") is None


def test_the_iteration_folder_rule_is_written_only_in_run_layout():
    """No f-string builds "iter_NN" outside tools/run_layout.py (docstrings may name the folder)."""
    pattern = re.compile(r"iter_\{")
    wrong = []
    for path in CODE:
        if path.name == "run_layout.py":
            continue
        for node in ast.walk(parsed(path)):
            if isinstance(node, ast.JoinedStr) and pattern.search(ast.unparse(node)):
                wrong.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not wrong, wrong


def test_run_file_names_are_not_spelled_out_in_code():
    """The run folder's file names appear as string constants only in tools/run_layout.py."""
    names = {run_layout.PROFILE, run_layout.SENSITIVITY, run_layout.SUBSETS, run_layout.PLAN, run_layout.REPORT_MD}
    names |= {run_layout.REPORT_HTML, run_layout.BASELINE_FORMS, run_layout.RECOVERY, run_layout.LLM_TRANSCRIPT}
    wrong = []
    for path in CODE:
        if path.name == "run_layout.py":
            continue
        for node in ast.walk(parsed(path)):
            if isinstance(node, ast.Constant) and node.value in names:
                wrong.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.value}")
    assert not wrong, wrong


def test_backend_choices_are_the_runtimes_and_auto():
    from profiling_agent.graph.cli.args import build_parser

    assert BACKENDS == (*RUNTIMES, "auto")
    import argparse

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    backend = next(a for a in sub.choices["run"]._actions if "--backend" in a.option_strings)
    assert tuple(backend.choices) == BACKENDS
    assert backend_or_default("openvino") == "openvino"
    assert backend_or_default("tensorrt") == "auto" and backend_or_default(None) == "auto"


def test_ratio_is_zero_without_a_positive_denominator():
    assert ratio(6.0, 3.0) == 2.0
    assert ratio(1.0, 0.0) == 0.0 and ratio(1.0, -2.0) == 0.0


@pytest.mark.parametrize("ref", ["./x", "/x", "~/x", "../x", ".hidden", "a/b/c", "C:\\models\\vit", "has space"])
def test_paths_look_like_paths(ref):
    assert looks_like_path(ref)


@pytest.mark.parametrize("ref", ["org/name", "google/vit-base-patch16-224", "name", "embedded:vit-digits"])
def test_hub_ids_and_embedded_names_do_not(ref):
    assert not looks_like_path(ref)


def test_an_existing_folder_is_a_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "digits").mkdir()
    assert looks_like_path("digits")
    assert not looks_like_path("nodigits")


def test_the_planner_and_the_guard_read_one_set_of_ratio_caps():
    import dataclasses

    from profiling_agent.tools.planning.plan_guard import GuardConfig
    from profiling_agent.tools.planning.ratio_solver import PlannerConfig, RatioCaps, ratio_cap

    caps = {f.name for f in dataclasses.fields(RatioCaps)}
    assert caps == {"max_ratio_structured", "max_ratio_head", "max_block_fraction"}
    for config in (PlannerConfig(), GuardConfig()):
        assert isinstance(config, RatioCaps)
        assert {k: v for k, v in dataclasses.asdict(config).items() if k in caps} == dataclasses.asdict(RatioCaps())
    assert ratio_cap("head", GuardConfig()) == RatioCaps().max_ratio_head
    assert ratio_cap("structured", PlannerConfig()) == RatioCaps().max_ratio_structured
    assert ratio_cap("block", RatioCaps()) == 1.0


def _folder(tmp_path, name, model_file, fmt, **recipe):
    import json

    folder = tmp_path / name
    folder.mkdir()
    (folder / model_file).write_bytes(b"not a model")
    (folder / "recipe.json").write_text(json.dumps({"format": fmt, "format_version": 1, **recipe}))
    return folder


def test_one_folder_loader_opens_and_refuses_both_kinds_alike(tmp_path):
    from profiling_agent.tools.runtimes.forms import form_source, load_form
    from profiling_agent.tools.runtimes.onnx_model import ONNX_FILE, ONNX_FORMAT, OnnxFolderError, load_onnx_folder
    from profiling_agent.tools.runtimes.openvino_model import OV_FILE, OV_FORMAT, OpenVinoFolderError

    onnx = _folder(tmp_path, "onnx", ONNX_FILE, ONNX_FORMAT)
    ov = _folder(tmp_path, "ov", OV_FILE, OV_FORMAT, runtime={"precision_hint": "int3"})
    assert form_source(onnx) == "onnx" and form_source(ov) == "openvino" and form_source(tmp_path) is None
    with pytest.raises(OnnxFolderError, match="ONNX Runtime cannot open"):
        load_form(onnx)
    with pytest.raises(OpenVinoFolderError, match="unknown precision hint 'int3'"):
        load_form(ov)
    with pytest.raises(OnnxFolderError, match=r"is not an ONNX folder \(model.onnx plus a profiling-agent-onnx"):
        load_onnx_folder(tmp_path)
    newer = _folder(tmp_path, "newer", ONNX_FILE, ONNX_FORMAT, format_version=9)
    with pytest.raises(OnnxFolderError, match="format version 9 is too new"):
        load_form(newer)
    with pytest.raises(ValueError, match="neither an OpenVINO nor an ONNX form"):
        load_form(tmp_path)


def test_the_plan_format_text_and_the_answer_schema_name_exactly_compression_plans_fields():
    from profiling_agent.prompts.analysis import PLAN_SCHEMA
    from profiling_agent.prompts.plan_format import GROUPS, TOKENS, entry_fields, format_text
    from profiling_agent.state import CompressionPlan, PruneEntry, QuantEntry, TokenEntry
    from profiling_agent.tools.planning.structured import plan_schema

    fields = entry_fields()
    assert fields == {
        "plan": tuple(CompressionPlan.model_fields),
        "pruning": tuple(PruneEntry.model_fields),
        "quantization": tuple(QuantEntry.model_fields),
        TOKENS: tuple(TokenEntry.model_fields),
    }
    assert PLAN_SCHEMA == format_text()  # a model without a token axis: the plan format has no tokens field
    keys = set(re.findall(r'"(\w+)":', PLAN_SCHEMA))
    assert keys == {f for name, names in fields.items() if name != TOKENS for f in names} - {TOKENS} | {GROUPS}
    with_tokens = set(re.findall(r'"(\w+)":', format_text(tokens=True)))
    assert with_tokens == {f for names in fields.values() for f in names} | {GROUPS}
    for value in ("structured", "head", "dynamic", "qint8", "float16"):  # the Literals' choices, from the model
        assert f'"{value}"' in PLAN_SCHEMA
    groups = [("layers.0.mlp", "structured"), ("layers.0.heads", "head")]
    schema = plan_schema(groups, ("qint8",), {"structured": 0.8, "head": 0.75}, 0.05)
    assert set(schema["properties"]) == set(fields["plan"]) - {TOKENS} == set(schema["required"])
    merging = plan_schema(groups, ("qint8",), {"structured": 0.8, "head": 0.75}, 0.05, token_rates=[2, 4])
    assert set(merging["properties"]) == set(fields["plan"]) == set(merging["required"])
    token = merging["properties"][TOKENS]["anyOf"][1]
    assert set(token["properties"]) <= set(fields[TOKENS]) and token["properties"]["rate"]["enum"] == [2, 4]
    quant = schema["properties"]["quantization"]["items"]
    assert set(quant["properties"]) == set(fields["quantization"]) == set(quant["required"])
    for shape in schema["properties"]["pruning"]["items"]["anyOf"]:  # the layer regex becomes exact group names
        expected = {GROUPS if f == "layer" else f for f in fields["pruning"]}
        assert set(shape["properties"]) == expected == set(shape["required"])
