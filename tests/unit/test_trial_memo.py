"""A round's trials by plan (tools/planning/trials.py): a plan tried once is not pruned and refitted again."""

from __future__ import annotations

import pytest

from profiling_agent.state import CompressionPlan, Objective, PlanningProblem, PruneEntry, Trial
from profiling_agent.tools.planning.round import RoundData
from profiling_agent.tools.planning.token_plan import TokenOption
from profiling_agent.tools.planning.trials import PlanEvaluator, trial_key

GROUPS = [
    {"name": f"layers.{i}.{kind}", "kind": k, "module": f"vit.layers.{i}.{m}", "units": u, "min_units": 1}
    for i in range(2)
    for kind, k, m, u in (("mlp", "structured", "mlp.fc1", 128), ("heads", "head", "attention", 4))
]
COSTS = {g["name"]: {"params_share": 0.2, "macs_share": 0.2, "latency_share": 0.2} for g in GROUPS}
SENS = {g["name"]: {"damage": 0.1 + i / 10} for i, g in enumerate(GROUPS)}


def _plan(ratio: float, why: str) -> CompressionPlan:
    entry = PruneEntry(layer=r"^vit\.layers\.0\.mlp\.fc1$", type="structured", ratio=ratio, justification=why)
    return CompressionPlan(pruning=[entry], rationale=why)


def _evaluator(memo: dict[str, Trial] | None, max_calls: int = 3) -> tuple[PlanEvaluator, list[CompressionPlan]]:
    tried: list[CompressionPlan] = []
    evaluator = PlanEvaluator(lambda: None, None, None, max_calls=max_calls, memo=memo)

    def tried_once(plan: CompressionPlan) -> Trial:
        tried.append(plan)
        return Trial(accuracy_drop_pp=plan.pruning[0].ratio, evaluations_left=evaluator.max_calls - evaluator.calls)

    evaluator.tried = tried_once  # type: ignore[method-assign]  # the prune, refit and judging of one trial
    return evaluator, tried


def test_a_plan_tried_by_one_evaluator_is_read_back_by_another_of_the_round():
    memo: dict[str, Trial] = {}
    first, tried_first = _evaluator(memo)
    second, tried_second = _evaluator(memo)
    assert first(_plan(0.25, "weighed with merging")).accuracy_drop_pp == 0.25
    again = second(_plan(0.25, "the back-off's first goal"))  # other words, the same entries
    assert again.accuracy_drop_pp == 0.25 and not tried_second and len(tried_first) == 1
    assert second.calls == 1 and again.evaluations_left == 2  # counted against its own budget
    assert second(_plan(0.5, "another ratio")).accuracy_drop_pp == 0.5 and len(tried_second) == 1


def test_without_a_memo_every_call_is_a_trial_and_the_budget_still_binds():
    evaluator, tried = _evaluator(None, max_calls=2)
    evaluator(_plan(0.25, "a"))
    evaluator(_plan(0.25, "a"))
    assert len(tried) == 2
    with pytest.raises(RuntimeError, match="evaluation budget used up"):
        evaluator(_plan(0.25, "a"))


def test_round_one_backs_off_from_the_plan_it_weighed_so_that_trial_is_read_back():
    """The back-off's first trial is the merged plan at its own estimate: the same entries as the one weighed."""
    objective = Objective(target="latency", target_reduction=0.5, max_acc_drop=2.0)
    option = TokenOption(rate=8, saved=0.25, drop_pp=0.5, form="ov_int8")
    data = RoundData(PlanningProblem.of(GROUPS, COSTS, SENS, objective, []), option)
    weighed = data.plan()
    assert weighed.plan.pruning and weighed.plan.tokens is not None
    assert trial_key(data.plan_at(weighed.target_estimate)) == trial_key(weighed.plan)
    assert trial_key(data.plan_at(weighed.target_estimate * 0.5)) != trial_key(weighed.plan)
