"""The deterministic planner's token axis: which measured rate it weighs, how merging composes with pruning."""

from __future__ import annotations

import pytest
from helpers.fake_llm import guard_profile, kinds_of
from helpers.search_trials import rounds

from profiling_agent.state import (
    Candidate,
    CompressionPlan,
    Objective,
    PlannerMeta,
    PlannerProfile,
    PlanningProblem,
    TokenAxis,
    TokenChoice,
    TokenEntry,
    Trial,
)
from profiling_agent.tools.planning.round import RoundData, weighed_tokens
from profiling_agent.tools.planning.token_plan import (
    TokenOption,
    run_option,
    to_pruning,
    to_total,
    token_option,
)

GROUPS = [
    {"name": "layers.0.mlp", "kind": "structured", "module": "vit.layers.0.mlp.fc1", "units": 128, "min_units": 1},
    {"name": "layers.0.heads", "kind": "head", "module": "vit.layers.0.attention", "units": 4, "min_units": 1},
    {"name": "layers.1.mlp", "kind": "structured", "module": "vit.layers.1.mlp.fc1", "units": 128, "min_units": 1},
    {"name": "layers.1.heads", "kind": "head", "module": "vit.layers.1.attention", "units": 4, "min_units": 1},
]
COSTS = {g["name"]: {"params_share": 0.2, "macs_share": 0.2, "latency_share": 0.2} for g in GROUPS}
SENS = {g["name"]: {"damage": 0.1 + i / 10} for i, g in enumerate(GROUPS)}
LATENCY = Objective(target="latency", target_reduction=0.5, max_acc_drop=2.0)


def _axis(*rows) -> TokenAxis:
    """rows: (rate, saved share, trial-slice loss pp, dropped)."""
    base = {"rate": 0, "schedule": [0, 0], "tokens_left": 65, "latency_ms": 1.0, "saved_share": 0.0}
    rates = [base] + [
        {
            "rate": r,
            "schedule": [r, r],
            "tokens_left": 65 - 2 * r,
            "latency_ms": 1 - s,
            "saved_share": s,
            "dropped": d,
            "drop_pp": None if d else pp,
        }
        for r, s, pp, d in rows
    ]
    return TokenAxis(form="ov_int8", batch=1, base_ms=1.0, rates=rates, images=100)


def test_the_rate_weighed_saves_the_most_latency_per_point_lost_and_only_under_a_latency_target():
    axis = _axis(
        (4, 0.10, 0.0, None), (8, 0.25, 0.5, None), (12, 0.3, 0.5, "rate 12 does not pay"), (16, 0.4, 1.5, None)
    )
    option = token_option(axis, LATENCY)
    assert option == TokenOption(rate=8, saved=0.25, drop_pp=0.5, form="ov_int8")  # 0.25/0.5 beats 0.1/1 (the floor)
    assert token_option(axis, LATENCY.model_copy(update={"target": "params"})) is None
    assert token_option(None, LATENCY) is None  # no token axis (ResNet, Swin) or no latency target measured
    assert token_option(_axis((8, 0.02, 0.0, "rate 8 does not pay")), LATENCY) is None  # nothing pays
    assert token_option(_axis((8, 0.3, 1.5, None)), LATENCY) is None  # loses over half the budget on its own
    # under a 1 pp budget, one image of 100 (1 pp) is the slice's resolution: weighed; two images are not
    tight = LATENCY.model_copy(update={"max_acc_drop": 1.0})
    assert token_option(_axis((8, 0.3, 1.0, None)), tight) is not None
    assert token_option(_axis((8, 0.3, 2.0, None)), tight) is None
    assert token_option(_axis((8, 0.6, 0.0, None)), LATENCY) is None  # would meet the target alone


def test_merging_and_pruning_compose_multiplicatively_and_the_plan_states_the_total():
    assert to_total(to_pruning(0.5, 0.25), 0.25) == pytest.approx(0.5)
    assert to_pruning(0.5, 0.25) == pytest.approx(1 / 3)
    option = TokenOption(rate=8, saved=0.25, drop_pp=0.5, form="ov_int8")
    alone = RoundData(PlanningProblem.of(GROUPS, COSTS, SENS, LATENCY, [])).plan()
    merged = RoundData(PlanningProblem.of(GROUPS, COSTS, SENS, LATENCY, []), option).plan()
    assert alone.plan.tokens is None and merged.plan.tokens == TokenEntry(rate=8, justification=option.justification())
    assert "rate 8" in merged.plan.rationale and "in all" in merged.plan.rationale
    pruned_alone = sum(e.ratio for e in alone.plan.pruning)
    pruned_merged = sum(e.ratio for e in merged.plan.pruning)
    assert pruned_merged < pruned_alone  # merging takes a share of the goal, pruning the rest
    assert merged.target_estimate == pytest.approx(alone.target_estimate, abs=0.06)  # both aim at the same total
    # a later round's goal (total terms) maps through to the pruning
    later = RoundData(
        PlanningProblem.of(GROUPS, COSTS, SENS, LATENCY, rounds({"goal": 0.55, "gamma": 1.0, "passed": True})), option
    ).plan()
    assert later.plan.tokens is not None and later.target_estimate > merged.target_estimate


def test_round_one_keeps_merging_only_when_its_trial_loses_no_more_than_pruning_alone():
    option = TokenOption(rate=8, saved=0.25, drop_pp=0.5, form="ov_int8")
    data = RoundData(PlanningProblem.of(GROUPS, COSTS, SENS, LATENCY, []), option)

    def evaluator(losses):
        def build(calls):
            assert calls == 2
            return lambda plan: Trial(accuracy_drop_pp=losses[plan.tokens is not None])

        return build

    kept, choice = weighed_tokens(data, evaluator({True: 0.5, False: 1.0}))
    assert kept is data and choice.chosen and choice.with_pp == 0.5 and choice.without_pp == 1.0
    kept, choice = weighed_tokens(data, evaluator({True: 1.5, False: 1.0}))
    assert kept.tokens is None and not choice.chosen and "pruning alone kept" in choice.why


def test_later_rounds_keep_the_rate_round_one_chose():
    axis = _axis((8, 0.25, 0.5, None))
    merged = Candidate(iteration=1, plan=CompressionPlan(tokens=TokenEntry(rate=8)))
    assert run_option(axis, [merged]) == TokenOption(rate=8, saved=0.25, drop_pp=0.5, form="ov_int8")
    assert run_option(axis, [Candidate(iteration=1)]) is None
    assert run_option(None, [merged]) is None


def test_result_json_and_the_report_show_the_schedule_and_the_latency_it_bought():
    from profiling_agent.tools.reporting.markdown import token_axis_lines, token_lines
    from profiling_agent.tools.reporting.result import token_facts

    axis = _axis((8, 0.25, 0.5, None), (2, 0.01, 0.0, "rate 2 does not pay on ov_int8 at batch 1"))
    weighed = TokenChoice(rate=8, saved_share=0.25, drop_pp=0.5, chosen=True, why="merging kept")
    merged = Candidate(
        iteration=1,
        plan=CompressionPlan(tokens=TokenEntry(rate=8, justification="measured")),
        token_schedule=[8, 8],
        planner_meta=PlannerMeta(tokens=weighed),
    )
    facts = token_facts(merged, axis)
    assert facts is not None and facts["schedule"] == [8, 8] and facts["weighed"] == weighed.model_dump()
    assert facts["bought"] == {"form": "ov_int8", "batch": 1, "base_ms": 1.0, "latency_ms": 0.75, "saved_share": 0.25}
    assert token_facts(Candidate(iteration=1), axis) is None  # nothing to say: the row keeps its keys
    lines = token_lines(facts)
    assert "schedule [8, 8]" in lines[0] and "bought 25.0% of ov_int8's latency at batch 1" in lines[0]
    assert lines[1] == "- token merging weighed: merging kept"
    (line,) = token_axis_lines(axis.model_dump())
    assert "r=8 0.750 ms (+25.0%, 0.50 pp lost)" in line and "Dropped: rate 2 does not pay" in line
    assert token_axis_lines(None) == []


def test_the_guard_checks_a_token_entry_against_the_measured_axis_and_composes_its_saving():
    from helpers.fake_llm import vit_profile

    from profiling_agent.tools.planning.plan_guard import GuardConfig, check_plan
    from profiling_agent.tools.planning.plan_parse import normalize_plan
    from profiling_agent.tools.planning.token_guard import predicted_saving

    profile = vit_profile(n_layers=2)
    axis = _axis((8, 0.25, 0.5, None), (2, 0.01, 0.0, "rate 2 does not pay"))
    raw = {
        "pruning": [{"layer": r"^vit\.layers\.0\.mlp\.fc1$", "type": "structured", "ratio": 0.5}],
        "quantization": [],
        "rationale": "r",
    }

    def check(tokens, config_axis=axis):
        plan, _ = normalize_plan({**raw, "tokens": tokens})
        config = GuardConfig(target="latency", target_reduction=0.5, tokens=config_axis)
        return check_plan(plan, guard_profile(profile["groups"], profile["protected"], profile["group_costs"]), config)

    alone = check(None)
    assert alone.ok and alone.plan is not None and alone.plan.tokens is None and "tokens" not in alone.estimate
    merged = check({"type": "tokens", "rate": 8})
    assert merged.ok and merged.plan is not None and merged.plan.tokens == TokenEntry(rate=8)
    assert merged.estimate["tokens"] == pytest.approx(0.25)
    assert merged.estimate["latency"] == pytest.approx(to_total(alone.estimate["latency"], 0.25))
    refused = check({"type": "tokens", "rate": 2})
    assert not refused.ok and "predicted to save +1.0% of ov_int8's latency" in refused.reasons[0]
    assert "one r per layer (2 layers), got 3" in check({"type": "tokens", "schedule": [1, 1, 1]}).reasons[0]
    assert "can merge at most 32, not 40" in check({"type": "tokens", "schedule": [40, 0]}).reasons[0]
    assert "no token axis" in check({"type": "tokens", "rate": 8}, config_axis=None).reasons[0]
    assert predicted_saving(_axis((8, 0.25, 0.5, None)), [4, 4]) == pytest.approx(0.125)  # between rates 0 and 8
    assert predicted_saving(axis, [4, 4]) == pytest.approx(0.01 + 0.24 / 3)  # between rates 2 and 8, measured


def test_the_llm_sees_the_token_axis_only_when_the_run_has_one():
    from helpers.fake_llm import vit_profile

    from profiling_agent.prompts.analysis import profile_block, system_prompt
    from profiling_agent.tools.planning.llm_tools import make_planning_tools
    from profiling_agent.tools.planning.plan_guard import GuardConfig

    axis = _axis((8, 0.25, 0.5, None))
    profile = vit_profile(n_layers=2)
    assert '"tokens"' not in system_prompt(None, 4) and "Tokens:" not in profile_block(profile, {}, {})
    assert '"tokens": null OR' in system_prompt({"tokens": axis.model_dump()}, 4)
    losing = _axis((8, 0.02, 0.0, "rate 8 does not pay")).model_dump()
    assert '"tokens"' not in system_prompt({"tokens": losing}, 4)  # no rate pays: no field to fill
    note = profile_block({**profile, "token_axis": axis.model_dump()}, {}, {})
    assert 'Tokens: a "tokens" entry' in note and "r=8: +25.0% latency, 0.50 pp lost alone" in note
    names = [t.name for t in make_planning_tools(PlannerProfile.of(profile), {}, guard=GuardConfig())]
    assert "token_table" not in names
    tools = {t.name: t for t in make_planning_tools(PlannerProfile.of(profile), {}, guard=GuardConfig(tokens=axis))}
    table = tools["token_table"].invoke({})
    assert '"form":"ov_int8"' in table and '"saved_share":0.25' in table and '"drop_pp":0.5' in table


def test_a_reviewer_sees_and_may_edit_a_token_entry_checked_against_the_runs_axis():
    from helpers.fake_llm import vit_profile

    from profiling_agent.tools.planning.review import parse_answer, review_plan

    profile = vit_profile(n_layers=2)
    plan = {"pruning": [], "quantization": [], "rationale": "", "tokens": {"type": "tokens", "rate": 8}}
    assert "no token axis" in review_plan(plan, profile, time_budget=0.0).reasons[0]
    with_axis = {**profile, "token_axis": _axis((8, 0.25, 0.5, None)).model_dump()}
    verdict = review_plan(plan, with_axis, time_budget=0.0)
    assert verdict.ok and verdict.estimate["tokens"] == pytest.approx(0.25)
    decision, edited, _, error = parse_answer({"decision": "edit", "plan": plan}, with_axis)
    assert (decision, error) == ("edit", "") and edited is not None and edited["tokens"]["rate"] == 8


def _front_axis() -> TokenAxis:
    """Uniform rate 8 pays little per point; the front-loaded [16, 0] saves more for less (fewer merge sites)."""
    axis = _axis((8, 0.10, 0.5, None)).model_dump()
    front = {"rate": None, "schedule": [16, 0], "tokens_left": 49, "latency_ms": 0.7, "saved_share": 0.3}
    return TokenAxis.model_validate({**axis, "rates": [*axis["rates"], {**front, "drop_pp": 0.25}]})


def test_a_front_loaded_schedule_is_weighed_planned_kept_and_checked_like_a_rate():
    from helpers.fake_llm import vit_profile

    from profiling_agent.tools.planning.plan_guard import GuardConfig, check_plan
    from profiling_agent.tools.planning.plan_parse import normalize_plan
    from profiling_agent.tools.planning.structured import plan_schema
    from profiling_agent.tools.planning.token_guard import predicted_saving
    from profiling_agent.tools.reporting.markdown import token_axis_lines
    from profiling_agent.tools.reporting.result import token_facts

    axis = _front_axis()
    option = token_option(axis, LATENCY)
    assert option == TokenOption(rate=None, saved=0.3, drop_pp=0.25, form="ov_int8", schedule=(16, 0))
    merged = RoundData(PlanningProblem.of(GROUPS, COSTS, SENS, LATENCY, []), option).plan()
    assert merged.plan.tokens == TokenEntry(schedule=[16, 0], justification=option.justification())
    assert "schedule [16, 0]" in merged.plan.rationale
    assert run_option(axis, [Candidate(iteration=1, plan=merged.plan)]) == option  # later rounds keep it
    # the guard takes the measured schedule's own saving, not the uniform rates' interpolation
    assert predicted_saving(axis, [16, 0]) == pytest.approx(0.3)
    assert predicted_saving(axis, [4, 4]) == pytest.approx(0.05)  # between rates 0 and 8 only
    profile = vit_profile(n_layers=2)
    plan, _ = normalize_plan(
        {"pruning": [], "quantization": [], "rationale": "r", "tokens": {"type": "tokens", "schedule": [16, 0]}}
    )
    verdict = check_plan(
        plan,
        guard_profile(profile["groups"], profile["protected"], profile["group_costs"]),
        GuardConfig(target="latency", target_reduction=0.5, tokens=axis),
    )
    assert verdict.ok and verdict.estimate["tokens"] == pytest.approx(0.3)
    # a constrained answer may name the rate or the schedule measured, nothing else
    schema = plan_schema(
        kinds_of(profile["groups"]),
        ("qint8",),
        {"structured": 0.8, "head": 0.75},
        0.05,
        token_rates=[8],
        token_schedules=[[16, 0]],
    )
    shapes = schema["properties"]["tokens"]["anyOf"]
    assert shapes[1]["properties"]["rate"]["enum"] == [8] and shapes[2]["properties"]["schedule"]["enum"] == [[16, 0]]
    facts = token_facts(Candidate(iteration=1, plan=merged.plan, token_schedule=[16, 0]), axis)
    assert facts is not None and facts["bought"]["saved_share"] == 0.3
    assert "schedule [16, 0] 0.700 ms (+30.0%, 0.25 pp lost)" in token_axis_lines(axis.model_dump())[0]


def test_a_proposal_merges_as_the_deterministic_round_chose_and_prunes_the_rest_of_the_goal():
    from helpers.fake_llm import vit_profile, vit_sensitivity

    from profiling_agent.tools.planning.plan_guard import GuardConfig, check_plan
    from profiling_agent.tools.planning.proposal import propose
    from profiling_agent.tools.planning.token_plan import fallback_option

    profile = vit_profile(n_layers=2)
    groups, costs, sens = profile["groups"], profile["group_costs"], vit_sensitivity(profile)
    axis = _front_axis()
    option = fallback_option(axis, TokenEntry(schedule=[16, 0]))
    assert option is not None and option.schedule == (16, 0) and fallback_option(axis, None) is None
    assert fallback_option(axis, TokenEntry(schedule=[8, 8])) is None  # not a measured row
    alone, _ = propose(PlanningProblem.of(groups, costs, sens, LATENCY), 0.5, "balanced", [])
    merged, record = propose(PlanningProblem.of(groups, costs, sens, LATENCY), 0.5, "balanced", [], option)
    alone, merged = alone.wire(), merged.wire()  # as the LLM reads them
    assert "tokens" not in alone and merged["tokens"]["schedule"] == [16, 0]
    assert sum(e["ratio"] for e in merged["pruning"]) < sum(e["ratio"] for e in alone["pruning"])
    guard = GuardConfig(target="latency", target_reduction=0.5, tokens=axis)
    verdict = check_plan(merged, guard_profile(groups, profile["protected"], costs), guard)
    assert verdict.ok, verdict.reasons
    assert verdict.plan is not None and verdict.plan.tokens is not None and verdict.plan.tokens.schedule == [16, 0]
    assert record.estimate["latency"] == pytest.approx(verdict.estimate["latency"], abs=0.01)
