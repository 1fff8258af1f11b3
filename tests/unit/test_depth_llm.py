"""Depth pruning on the LLM side: the guard, the constrained schema, the tools and the prompt on block groups."""

from __future__ import annotations

import json
import re

import pytest
from helpers.fake_llm import guard_profile, kinds_of, probe_records, vit_profile, vit_sensitivity

from profiling_agent.prompts.analysis import render_analysis
from profiling_agent.prompts.iterative import Feedback, render_iterative
from profiling_agent.state import Objective, PlannerProfile, PlanningProblem
from profiling_agent.tools.planning.llm_tools import make_planning_tools
from profiling_agent.tools.planning.plan_guard import GuardConfig, check_plan
from profiling_agent.tools.planning.plan_parse import parse_plan_text
from profiling_agent.tools.planning.structured import plan_schema

CAPS = {"structured": 0.8, "head": 0.75, "block": 1.0}


def with_blocks(profile: dict) -> dict:
    """Add one block group per ViT layer, shaped as the adapters' `block_groups` (the layer's whole cost)."""
    total = {key: float(profile["totals"][key]) for key in ("params", "macs")}
    total_latency = sum(r["latency_ms"] for r in profile["layers"])
    groups, costs = list(profile["groups"]), dict(profile["group_costs"])
    for block in sorted({g["block"] for g in profile["groups"]}):
        name = f"layers.{block.rsplit('.', 1)[1]}.block"
        groups.append(
            {"name": name, "kind": "block", "module": block, "roots": [], "members": [block], "units": 1,
             "unit_size": 1, "min_units": 0, "block": block}
        )  # fmt: skip
        rows = [r for r in profile["layers"] if r["name"].startswith(block + ".")]
        params, macs = sum(r["params"] for r in rows), sum(r["macs"] for r in rows)
        latency = sum(r["latency_ms"] for r in rows)
        costs[name] = {
            "kind": "block", "block": block, "params": params, "macs": macs, "latency_ms": latency,
            "params_share": params / total["params"], "macs_share": macs / total["macs"],
            "latency_share": latency / total_latency, "missing": [],
        }  # fmt: skip
    return {**profile, "groups": groups, "group_costs": costs}


WIDTH = vit_profile(n_layers=4)
DEPTH = with_blocks(WIDTH)
DEPTH["block_limits"] = {"vit.layers": 2}  # what the planning round puts in the profile it hands the LLM


def check(raw: dict, profile: dict = DEPTH, config: GuardConfig | None = None):
    return check_plan(raw, PlannerProfile.of(profile), config)


def prune(layer: str, kind: str = "structured", ratio: float = 0.3) -> dict:
    return {"layer": layer, "type": kind, "ratio": ratio, "justification": "test"}


def plan(*entries: dict) -> dict:
    return {"pruning": list(entries), "quantization": [], "rationale": "r"}


def joined(verdict) -> str:
    return " | ".join(verdict.reasons)


# ---------------------------------------------------------------- the guard


def test_a_block_plan_passes_the_guard_and_counts_the_blocks_whole_cost():
    verdict = check(
        plan({"groups": ["layers.3.block"], "type": "block", "ratio": 1.0}, prune(r"^vit\.layers\.0\.mlp\.fc1$"))
    )
    assert verdict.ok, verdict.reasons
    assert verdict.ratios == {"layers.0.mlp": 0.3, "layers.3.block": 1.0}
    assert [(e.type, e.ratio) for e in verdict.plan.pruning] == [("block", 1.0), ("structured", 0.3)]
    block_share = DEPTH["group_costs"]["layers.3.block"]["latency_share"]
    assert verdict.estimate["latency"] >= block_share - 1e-3  # the whole block's cost, not a width share
    regex = check(plan(prune(r"^vit\.layers\.(1|2)$", "block", 1.0)))
    assert regex.ok, regex.reasons
    assert regex.ratios == {"layers.1.block": 1.0, "layers.2.block": 1.0}


@pytest.mark.parametrize("ratio", [0.5, 1.5])
def test_a_block_entry_with_another_ratio_is_refused_naming_the_entry(ratio):
    verdict = check(plan(prune(r"^vit\.layers\.3$", "block", ratio)))
    assert not verdict.ok and len(verdict.reasons) == 1
    reason = verdict.reasons[0]
    assert reason.startswith("pruning.0.ratio: a block entry (layer '^vit\\\\.layers\\\\.3$') removes the whole block")
    assert f"ratio must be 1.0, not {ratio:g}" in reason and "\n" not in reason


def test_a_width_ratio_of_one_is_refused_and_mentions_block_only_with_depth_on():
    raw = plan(prune(r"^vit\.layers\.0\.mlp\.fc1$", ratio=1.0))
    on, off = joined(check(raw)), joined(check(raw, WIDTH))
    assert on.startswith("pruning.0.ratio: a structured entry's ratio (layer '^vit") and "must be less than 1" in on
    assert "type 'block' removes a whole block" in on
    assert "must be less than 1, got 1 (the structured cap is 0.8)" in off and "block" not in off
    typo = plan(prune(r"^vit\.layers\.0\.mlp\.fc1$", "channel"))
    assert "pruning.0.type: Input should be 'structured', 'head' or 'block'" in joined(check(typo))
    assert "pruning.0.type: Input should be 'structured' or 'head' (got" in joined(check(typo, WIDTH))


def test_removing_more_than_half_or_every_block_of_a_stack_is_refused():
    three = check(plan(prune(r"^vit\.layers\.(0|1|2)$", "block", 1.0)))
    assert not three.ok
    assert "removes 3 of the 4 removable blocks of vit.layers; at most 2 may go" in joined(three)
    assert joined(three).startswith("pruning[0] layer ")
    every = check(plan(prune(r"^vit\.layers\.(0|1)$", "block", 1.0), prune(r"^vit\.layers\.(2|3)$", "block", 1.0)))
    assert not every.ok
    assert "removes every removable block of vit.layers (4)" in joined(every)
    assert "pruning[0]" in joined(every) and "pruning[1]" in joined(every)  # both entries are named
    looser = check(plan(prune(r"^vit\.layers\.(0|1|2)$", "block", 1.0)), config=GuardConfig(max_block_fraction=0.75))
    assert looser.ok, looser.reasons
    never_all = check(plan(prune(r"^vit\.layers\.\d+$", "block", 1.0)), config=GuardConfig(max_block_fraction=1.0))
    assert "at most 3 may go" in joined(never_all)  # one block always stays


def test_a_width_entry_inside_a_removed_block_is_dropped_as_moot():
    raw = plan(
        prune(r"^vit\.layers\.3$", "block", 1.0),
        prune(r"^vit\.layers\.3\.mlp\.fc1$", ratio=0.5),  # every group it targets is inside the removed block
        prune(r"^vit\.layers\.(2|3)\.attention$", "head", 0.5),  # partly inside
    )
    verdict = check(raw)
    assert verdict.ok, verdict.reasons
    assert [e.layer for e in verdict.plan.pruning] == [r"^vit\.layers\.3$", r"^vit\.layers\.(2|3)\.attention$"]
    assert verdict.ratios == {"layers.2.heads": 0.5, "layers.3.block": 1.0}  # moot groups are not counted
    dropped = [w for w in verdict.warnings if "dropped as moot" in w]
    assert dropped == [r"pruning[1] layer '^vit\\.layers\\.3\\.mlp\\.fc1$': dropped as moot: layers.3.mlp lie inside "
                       "removed blocks"]  # fmt: skip
    assert any(w.startswith("pruning[2]") and "layers.3.heads" in w and "moot" in w for w in verdict.warnings)
    alone = check(plan(prune(r"^vit\.layers\.3$", "block", 1.0), prune(r"^vit\.layers\.2\.attention$", "head", 0.5)))
    assert verdict.estimate == alone.estimate  # the block's cost counts once, the moot groups add nothing


def test_a_block_group_under_a_width_type_is_refused_with_the_right_type():
    named = check(plan({"groups": ["layers.1.block"], "type": "structured", "ratio": 0.5}))
    assert "group 'layers.1.block' is a block group: use type 'block' for it" in joined(named)
    regex = check(plan(prune(r"^vit\.layers\.1$", "structured", 0.5)))
    assert "matches no structured group, only layers.1.block (a block group): use type 'block'" in joined(regex)
    off = check(plan(prune(r"^vit\.layers\.1$", "block", 1.0)), WIDTH)
    assert "this model has no block groups" in joined(off)


def test_a_block_entry_without_a_ratio_gets_one_with_a_note():
    raw, notes = parse_plan_text('{"pruning": [{"groups": ["layers.2.block"], "type": "block"}], "quantization": []}')
    assert raw["pruning"][0]["ratio"] == 1.0 and any("ratio set to 1.0" in n for n in notes)
    assert check(raw).ok


# ---------------------------------------------------------------- schema and tools


def test_the_schema_offers_block_entries_only_with_block_groups_and_only_at_ratio_one():
    schema = plan_schema(kinds_of(DEPTH["groups"]), ("qint8",), CAPS, 0.01)
    shapes = {
        e["properties"]["type"]["enum"][0]: e["properties"] for e in schema["properties"]["pruning"]["items"]["anyOf"]
    }
    assert set(shapes) == {"block", "head", "structured"}
    assert shapes["block"]["ratio"]["enum"] == [1.0]
    assert shapes["block"]["groups"]["items"]["enum"] == [f"layers.{i}.block" for i in range(4)]
    assert max(shapes["structured"]["ratio"]["enum"]) == 0.8 and max(shapes["head"]["ratio"]["enum"]) == 0.75
    without = plan_schema(kinds_of(WIDTH["groups"]), ("qint8",), CAPS, 0.01)
    assert without == plan_schema(kinds_of(WIDTH["groups"]), ("qint8",), {"structured": 0.8, "head": 0.75}, 0.01)
    assert "block" not in json.dumps(without)


def test_match_layers_takes_block_only_when_the_profile_has_block_groups():
    sens = vit_sensitivity(DEPTH)
    tool = {t.name: t for t in make_planning_tools(PlannerProfile.of(DEPTH), probe_records(sens))}["match_layers"]
    answer = json.loads(tool.invoke({"pattern": r"^vit\.layers\.(0|1)$", "kind": "block"}))
    assert answer["matched"] == 2 and {g["kind"] for g in answer["groups"]} == {"block"}
    assert "block" in json.dumps(tool.args)
    miss = tool.invoke({"pattern": r"^vit\.layers\.0$", "kind": "structured"})
    assert miss.startswith("error: no structured group") and "other kind (block)" in miss
    plain = {t.name: t for t in make_planning_tools(PlannerProfile.of(WIDTH), probe_records(vit_sensitivity(WIDTH)))}[
        "match_layers"
    ]
    assert "block" not in json.dumps(plain.args) + plain.description


# ---------------------------------------------------------------- the prompt


def prompts(profile: dict) -> list[str]:
    sens = vit_sensitivity(profile)
    first = render_analysis(profile, sens, Objective(target="latency"))
    later = render_iterative(profile, sens, Objective(target="latency"), Feedback(iteration=2))
    return [m.content for m in [*first, *later]]


def test_the_prompt_explains_block_entries_only_when_block_groups_exist():
    off = prompts(WIDTH)
    assert not any(re.search("block|depth", text, re.IGNORECASE) for text in off)
    on = prompts(DEPTH)
    assert on[0] == off[0] and on[2] == off[2]  # the system prompts do not change
    for user in (on[1], on[3]):
        assert 'type "block" must have ratio 1.0' in user and "batch-1 latency most" in user
        assert "at most 2 blocks of vit.layers" in user and "moot" in user
        assert "layers.3.block | block | vit.layers.3 | 1 |" in user
        assert r"^vit\.layers\.(0|1|2|3)$  (block)" in user


def test_the_prompt_without_block_groups_is_the_width_prompt_plus_nothing():
    """Removing the depth lines and block rows from the depth prompt gives the width prompt back byte for byte."""
    off, on = prompts(WIDTH)[1], prompts(DEPTH)[1]
    n_width, n_all = len(WIDTH["groups"]), len(DEPTH["groups"])
    stripped = "\n".join(
        line
        for line in on.replace(f"Prunable groups ({n_all})", f"Prunable groups ({n_width})").split("\n")
        if "block" not in line.lower()
    )
    assert stripped == off


def test_each_stack_is_bounded_by_its_own_block_groups():
    """A ResNet lists the blocks after each stage's first: two in stage 0, one in stage 1 (which can never go)."""
    stages = [
        "resnet.encoder.stages.0.layers.1",
        "resnet.encoder.stages.0.layers.2",
        "resnet.encoder.stages.1.layers.1",
    ]
    groups = [
        {"name": f"{m[len('resnet.encoder.'):]}.block", "kind": "block", "module": m, "units": 1, "min_units": 0,
         "block": m}
        for m in stages
    ]  # fmt: skip

    def verdict(layer: str):
        return check_plan(plan(prune(layer, "block", 1.0)), guard_profile(groups))

    assert verdict(r"^resnet\.encoder\.stages\.0\.layers\.2$").ok
    assert verdict(r"^resnet\.encoder\.stages\.0\.layers\.1$").ok
    both = joined(verdict(r"^resnet\.encoder\.stages\.0\.layers\.(1|2)$"))
    assert "removes every removable block of resnet.encoder.stages.0.layers (2); at most 1 may go" in both
    alone = joined(verdict(r"^resnet\.encoder\.stages\.1\.layers\.1$"))
    assert "removes every removable block of resnet.encoder.stages.1.layers (1); at most 0 may go" in alone


def test_a_proposal_that_removes_blocks_passes_the_guard_as_it_is():
    from profiling_agent.tools.planning.proposal import propose

    sens = vit_sensitivity(DEPTH)
    for group in DEPTH["groups"]:
        if group["kind"] == "block":
            sens[group["name"]]["damage"] = 0.001  # cheap blocks: the proposal removes some
    objective = Objective(target="latency", target_reduction=0.4)
    raw, record = propose(PlanningProblem.of(DEPTH["groups"], DEPTH["group_costs"], sens, objective), 0.85, "cost", [])
    raw = raw.wire()  # as the LLM reads it
    blocks = [e for e in raw["pruning"] if e["type"] == "block"]
    assert blocks and all(e["ratio"] == 1.0 for e in blocks)
    verdict = check(raw)
    assert verdict.ok, verdict.reasons
    assert verdict.ratios == record.ratios


def test_the_prompt_says_a_stages_first_block_is_replaced_by_its_shortcut():
    from profiling_agent.prompts.analysis import depth_note

    first = "resnet.encoder.stages.1.layers.0"
    groups = [
        {"name": "stages.1.layers.0.block", "kind": "block", "module": first, "extra": {"replace": "shortcut"}},
        {"name": "stages.1.layers.1.block", "kind": "block", "module": "resnet.encoder.stages.1.layers.1"},
    ]
    note = depth_note(groups, {first: 1, "resnet.encoder.stages.1.layers": 1})
    assert "replaced by that shortcut" in note and "does not count toward the stack's limit" in note
    assert "at most 1 blocks of resnet.encoder.stages.1.layers)" in note and first + ";" not in note
    assert "replaced" not in depth_note(groups[1:], {"resnet.encoder.stages.1.layers": 1})
