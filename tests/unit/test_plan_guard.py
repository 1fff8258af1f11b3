import pytest
from helpers.fake_llm import vit_profile

from profiling_agent.state import CompressionPlan, PlannerProfile, group_rows
from profiling_agent.tools.planning.deterministic import estimate_reduction
from profiling_agent.tools.planning.plan_guard import GuardConfig, check_plan
from profiling_agent.tools.planning.plan_parse import extract_json_object, normalize_plan, parse_plan_text
from profiling_agent.tools.planning.regex_safety import regex_problem, slow_patterns

PROFILE = vit_profile(n_layers=2)
MLP_ALL = r"^vit\.layers\.\d+\.mlp\.fc1$"
HEADS_ALL = r"^vit\.layers\.\d+\.attention$"


def check(plan, config=None):
    return check_plan(plan, PlannerProfile.of(PROFILE), config)


def prune(layer, kind="structured", ratio=0.3):
    return {"layer": layer, "type": kind, "ratio": ratio, "justification": "test"}


def plan(*entries, quant=None):
    return {"pruning": list(entries), "quantization": quant if quant is not None else [], "rationale": "r"}


def joined(verdict):
    return " | ".join(verdict.reasons)


def test_valid_plan_passes_with_estimate_and_group_ratios():
    raw = plan(
        prune(r"^vit\.layers\.(0|1)\.mlp\.fc1$", ratio=0.5),
        prune(r"^vit\.layers\.1\.attention$", "head", 0.5),
        quant=[{"layer": "all", "type": "dynamic", "dtype": "qint8", "justification": ""}],
    )
    verdict = check(raw)
    assert verdict.ok, verdict.reasons
    assert verdict.plan == CompressionPlan.model_validate(raw)
    assert verdict.ratios == {"layers.0.mlp": 0.5, "layers.1.heads": 0.5, "layers.1.mlp": 0.5}
    expected = estimate_reduction(verdict.ratios, group_rows(PROFILE["groups"], PROFILE["group_costs"], {}), "params")
    assert verdict.estimate["params"] == pytest.approx(expected, abs=1e-4)
    assert 0 < verdict.estimate["params"] < 0.5


def test_later_entries_override_earlier_ones():
    verdict = check(plan(prune(MLP_ALL, ratio=0.5), prune(r"^vit\.layers\.0\.mlp\.fc1$", ratio=0.2)))
    assert verdict.ok
    assert verdict.ratios == {"layers.0.mlp": 0.2, "layers.1.mlp": 0.5}


@pytest.mark.parametrize(
    ("pattern", "fragment"),
    [
        ("(a+)+$", "nested quantifiers"),
        ("(.*)*", "nested quantifiers"),
        (r"(\w+\s?)+$", "nested quantifiers"),
        (r"(\d+)*x", "nested quantifiers"),
        ("(a|aa)+", "alternation"),
        (r"(a)\1", "backreferences"),
        ("layers\\.(", "does not compile"),
        (".*" * 7 + "x", "unbounded quantifiers"),
        ("x" * 201, "characters"),
    ],
)
def test_regex_problem_rejects_unsafe_or_invalid_patterns(pattern, fragment):
    assert fragment in (regex_problem(pattern) or "")


@pytest.mark.parametrize(
    "pattern",
    [MLP_ALL, HEADS_ALL, r"^vit\.layers\.(0|1|2)\.mlp\.fc1$", "fc1", r".*fc1$", "(0|1|2)+", "(a{2})+", "x{1,100}"],
)
def test_regex_problem_accepts_ordinary_module_patterns(pattern):
    assert regex_problem(pattern) is None


def test_slow_patterns_kills_a_backtracking_search_within_the_budget():
    slow = slow_patterns(["fc1", "(a+)+$", "b"], ["a" * 40 + "!"], budget=0.5)
    assert slow == ["(a+)+$"]  # (a+)+$ on 40 a's would backtrack for hours: returning at all proves the kill
    assert slow_patterns(["fc1", "b"], ["a" * 40 + "!"], budget=2.0) == []


def test_invalid_regex_is_rejected_with_its_position():
    verdict = check(plan(prune("vit\\.layers\\.(0")))
    assert not verdict.ok and verdict.plan is None
    assert "pruning[0]" in joined(verdict) and "does not compile" in joined(verdict)


def test_catastrophic_pattern_is_rejected_before_running():
    verdict = check(plan(prune(r"(vit\.\w+)+\.fc1")))
    assert not verdict.ok
    assert "catastrophically" in joined(verdict)


def test_regex_matching_nothing_is_rejected_with_examples():
    verdict = check(plan(prune(r"^vit\.blocks\.\d+\.ffn$")))
    assert not verdict.ok
    assert "matches no structured group" in joined(verdict)
    assert "vit.layers.0.mlp.fc1" in joined(verdict)


def test_wrong_type_is_explained():
    verdict = check(plan(prune(HEADS_ALL, "structured", 0.3)))
    assert not verdict.ok
    assert "(a head group): use type 'head'" in joined(verdict)


def test_over_aggressive_ratios_are_rejected():
    """The paper's GPT-4-Turbo failure: 0.95 everywhere."""
    verdict = check(plan(prune(MLP_ALL, ratio=0.95), prune(HEADS_ALL, "head", 0.95)))
    assert not verdict.ok
    text = joined(verdict)
    assert "exceeds the structured cap 0.8" in text and "exceeds the head cap 0.75" in text


def test_tiny_ratio_is_rejected_and_no_op_ratio_warned():
    assert "below the minimum" in joined(check(plan(prune(MLP_ALL, ratio=0.001))))
    verdict = check(plan(prune(HEADS_ALL, "head", 0.2)))  # 0.2 of 4 heads removes none
    assert verdict.ok
    assert any("removes no unit" in w for w in verdict.warnings)


def test_predicted_param_reduction_is_bounded():
    config = GuardConfig(max_predicted_param_reduction=0.2)
    verdict = check(plan(prune(MLP_ALL, ratio=0.8), prune(HEADS_ALL, "head", 0.75)), config)
    assert not verdict.ok
    assert "of the parameters" in joined(verdict)
    assert verdict.estimate["params"] > 0.2


@pytest.mark.parametrize("layer", ["classifier", r"vit\.embeddings", r"layers\.0\."])
def test_pruning_regex_matching_a_protected_module_is_rejected(layer):
    verdict = check(plan(prune(layer, ratio=0.5)))
    assert not verdict.ok
    assert "protected" in joined(verdict)


def test_schema_errors_are_reported_with_locations():
    raw = plan(prune(MLP_ALL, ratio=1.5), quant=[{"layer": "all", "type": "dynamic", "dtype": "int4"}])
    raw["pruning"].append({"layer": MLP_ALL, "type": "channel", "ratio": 0.2})
    verdict = check(raw)
    assert not verdict.ok
    text = joined(verdict)
    assert "pruning.0.ratio" in text and "pruning.1.type" in text and "quantization.0.dtype" in text


def test_disallowed_dtype_by_config():
    raw = plan(quant=[{"layer": "all", "type": "dynamic", "dtype": "float16"}])
    assert check(raw).ok
    verdict = check(raw, GuardConfig(allowed_dtypes=("qint8",)))
    assert not verdict.ok and "float16" in joined(verdict)


def test_quantization_regex_must_select_a_linear_layer():
    assert check(plan(quant=[{"layer": r"mlp\.fc\d$", "dtype": "qint8"}])).ok
    verdict = check(plan(quant=[{"layer": r"patch_embeddings\.projection", "dtype": "qint8"}]))
    assert not verdict.ok and "no nn.Linear" in joined(verdict)
    verdict = check(plan(quant=[{"layer": "(fc", "dtype": "qint8"}]))
    assert not verdict.ok and "does not compile" in joined(verdict)


def test_empty_and_oversized_plans_are_rejected():
    assert "empty" in joined(check(plan()))
    many = plan(*[prune(MLP_ALL)] * 300)
    verdict = check(many)
    assert not verdict.ok and "300 entries" in joined(verdict)


def test_compression_plan_objects_are_accepted():
    obj = CompressionPlan.model_validate(plan(prune(MLP_ALL)))
    assert check(obj).ok


def test_extract_json_object_from_fences_prose_and_trailing_commas():
    body = '{"pruning": [], "quantization": [{"layer": "all"},], "rationale": "x"}'
    assert extract_json_object(f"Sure!\n```json\n{body}\n```\nDone.")["rationale"] == "x"
    assert extract_json_object(f"My plan is {body} as requested")["quantization"] == [{"layer": "all"}]
    assert extract_json_object('{"note": 1} then {"pruning": []}') == {"pruning": []}
    with pytest.raises(ValueError):
        extract_json_object("import os; os.system('rm -rf /')")
    with pytest.raises(ValueError):
        extract_json_object('{"pruning": [{"ratio": NaN}]}')
    with pytest.raises(ValueError):
        extract_json_object("")


def test_normalize_unwraps_and_drops_unknown_keys():
    raw = {
        "plan": {
            "pruning": [{"layer": "x", "type": "head", "ratio": 0.5, "expected_gain": 3}],
            "quantization": None,
            "notes": "hi",
        }
    }
    plan_dict, notes = normalize_plan(raw)
    assert plan_dict == {"pruning": [{"layer": "x", "type": "head", "ratio": 0.5}], "quantization": [], "rationale": ""}
    assert any("expected_gain" in n for n in notes) and any("notes" in n for n in notes)
    with pytest.raises(ValueError):
        parse_plan_text("[1, 2, 3]")


def test_exact_group_names_are_an_alternative_to_regexes():
    raw = plan({"groups": ["layers.0.mlp", "layers.1.mlp"], "type": "structured", "ratio": 0.4, "justification": ""})
    verdict = check(raw)
    assert verdict.ok, verdict.reasons
    assert verdict.ratios == {"layers.0.mlp": 0.4, "layers.1.mlp": 0.4}
    assert [e.layer for e in verdict.plan.pruning] == [r"^vit\.layers\.0\.mlp\.fc1$", r"^vit\.layers\.1\.mlp\.fc1$"]
    by_module = check(plan({"groups": ["vit.layers.1.attention"], "type": "head", "ratio": 0.5}))
    assert by_module.ratios == {"layers.1.heads": 0.5}


def test_group_entries_with_unknown_names_are_refused_and_a_width_entry_takes_each_groups_own_type():
    verdict = check(plan({"groups": ["layers.0.heads", "layers.7.mlp"], "type": "structured", "ratio": 0.4}))
    assert not verdict.ok
    text = joined(verdict)
    assert "unknown group 'layers.7.mlp'" in text and "is a head group" not in text
    assert "did you mean 'layers.1.mlp'" in text  # the closest names (a 1.5B model wrote module-path hybrids)
    hybrid = joined(check(plan({"groups": ["vit.encoder.layer.1.mlp"], "type": "structured", "ratio": 0.4})))
    assert "unknown group 'vit.encoder.layer.1.mlp'; did you mean 'layers.1.mlp'?" in hybrid, hybrid
    both = check(plan({"groups": ["layers.0.mlp"], "layer": MLP_ALL, "type": "structured", "ratio": 0.4}))
    assert "either 'layer'" in joined(both)
    # a group named exactly has one kind: channels named with a head group prune that group's heads, said once
    mixed = check(plan({"groups": ["layers.0.heads", "layers.1.mlp"], "type": "structured", "ratio": 0.4}))
    assert mixed.ok, mixed.reasons
    assert mixed.ratios == {"layers.0.heads": 0.4, "layers.1.mlp": 0.4}
    assert [e.type for e in mixed.plan.pruning] == ["head", "structured"]
    assert [w for w in mixed.warnings if "each takes its group's own type" in w and "layers.0.heads" in w]


def test_structured_on_attention_is_refused_with_the_right_type_named():
    from helpers.fake_llm import FIRST_ROUND_REPLY

    from profiling_agent.tools.planning.plan_parse import parse_plan_text

    raw, _ = parse_plan_text(FIRST_ROUND_REPLY)
    verdict = check(raw)
    assert not verdict.ok
    assert "matches no structured group, only layers.0.heads, layers.1.heads (a head group): use type 'head'" in (
        joined(verdict)
    )


def test_a_plan_without_pruning_is_refused_when_the_target_needs_pruning():
    quant_only = plan(quant=[{"layer": "all", "type": "dynamic", "dtype": "qint8"}])
    verdict = check(quant_only, GuardConfig(target="params", target_reduction=0.4))
    assert not verdict.ok and "prunes nothing" in joined(verdict) and "40% fewer parameters" in joined(verdict)
    assert check(quant_only, GuardConfig(target="size", target_reduction=0.4)).ok  # quantization shrinks size
    assert check(quant_only).ok  # no objective given (a human's edit): quantization alone is allowed
