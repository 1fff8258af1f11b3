"""The delivery rule as docs/backends.md states it: a params/MACs/size target keeps any reduction within the budget.

A pruned candidate that is no faster than the quantization-only form is still delivered for a params, MACs or size
target when it reduces that quantity at all (reduction > 0) and keeps the accuracy budget, even short of the target
reduction: the quantization-only form reduces none of them, and result.json's `outcome` says by how much the target
was missed. For a latency target only speed counts.
"""

from __future__ import annotations

import pytest
from helpers.eval_records import BASE_REF
from helpers.eval_records import delivery_baseline as _baseline
from helpers.eval_records import delivery_best as _best

from profiling_agent.state import Objective
from profiling_agent.tools.evaluation.delivery import choose_delivery


@pytest.mark.parametrize("target", ["params", "macs", "size"])
def test_a_slower_candidate_short_of_the_target_reduction_is_delivered_for_what_it_reduces(target):
    objective = Objective(max_acc_drop=2.0, target=target, target_reduction=0.4)
    best = _best(objective, accuracy=89.0, latency=4.5, peer_latency=4.0, reduction=0.05)  # 5% of the 40% asked
    picked, why = choose_delivery(best, _baseline(objective), BASE_REF, objective)
    assert picked is not None and picked.iteration == 1
    assert f"is what the {target} target asks for (5.0% smaller within the budget)" in why


@pytest.mark.parametrize(("target", "reduction"), [("params", 0.0), ("latency", 0.3)])
def test_a_slower_candidate_that_reduces_nothing_asked_for_leaves_the_quantization_only_form(target, reduction):
    objective = Objective(max_acc_drop=2.0, target=target, target_reduction=0.4)
    best = _best(objective, accuracy=89.0, latency=4.5, peer_latency=4.0, reduction=reduction)
    picked, why = choose_delivery(best, _baseline(objective), BASE_REF, objective)
    assert picked is not None and picked.iteration == 0 and "the quantization-only form is delivered" in why


def test_a_candidate_past_the_budget_is_never_delivered_whatever_it_reduces():
    objective = Objective(max_acc_drop=2.0, target="params", target_reduction=0.4)
    best = _best(objective, accuracy=85.0, latency=1.0, peer_latency=4.0, reduction=0.6)
    picked, _ = choose_delivery(best, _baseline(objective), BASE_REF, objective)
    assert picked is not None and picked.iteration == 0
