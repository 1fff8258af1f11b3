"""The baseline's reference on the trial slice: predicted once per baseline, slice and kind, then shared."""

from __future__ import annotations

import copy

import torch

from profiling_agent.state import CompressionPlan
from profiling_agent.tools.planning.trials import PlanEvaluator, reference_key

PLAN = CompressionPlan.model_validate(
    {"pruning": [{"layer": r"^vit\.layers\.0\.mlp\.fc1$", "type": "structured", "ratio": 0.5}]}
)


def _evaluator(model, pixels, labels, loads, *, with_kl=False, sha="a" * 64):
    def load():
        loads.append(1)
        return copy.deepcopy(model)

    key = reference_key(sha, pixels, None, with_kl)
    return PlanEvaluator(load, pixels, labels, with_kl=with_kl, reference_key=key)


def test_evaluators_of_one_baseline_and_slice_predict_the_baseline_once(tiny_vit):
    torch.manual_seed(0)
    pixels, labels = torch.randn(12, 1, 16, 16), torch.randint(0, 10, (12,))
    loads: list[int] = []
    first = _evaluator(tiny_vit, pixels, labels, loads, sha="b" * 64)
    second = _evaluator(tiny_vit, pixels, labels, loads, sha="b" * 64)
    one, two = first(PLAN), second(PLAN)
    assert len(loads) == 3  # the reference once, and one fresh copy per trial
    assert first.reference() is second.reference()
    assert one.model_dump() == two.model_dump() | {"seconds": one.seconds}  # the same trial, timing aside


def test_another_slice_baseline_or_kind_predicts_the_baseline_again(tiny_vit):
    torch.manual_seed(1)
    pixels, labels = torch.randn(8, 1, 16, 16), torch.randint(0, 10, (8,))
    loads: list[int] = []
    _evaluator(tiny_vit, pixels, labels, loads, sha="c" * 64).reference()
    _evaluator(tiny_vit, pixels[:6], labels[:6], loads, sha="c" * 64).reference()  # other images
    _evaluator(tiny_vit, pixels, labels, loads, sha="d" * 64).reference()  # another baseline
    _evaluator(tiny_vit, pixels, labels, loads, sha="c" * 64, with_kl=True).reference()  # logits kept too
    assert len(loads) == 4


def test_an_evaluator_without_a_key_keeps_its_own_reference(tiny_vit):
    torch.manual_seed(2)
    pixels, labels = torch.randn(8, 1, 16, 16), torch.randint(0, 10, (8,))
    loads: list[int] = []

    def load():
        loads.append(1)
        return copy.deepcopy(tiny_vit)

    for _ in range(2):
        PlanEvaluator(load, pixels, labels).reference()
    assert len(loads) == 2
