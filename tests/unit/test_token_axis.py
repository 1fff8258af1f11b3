"""Token merging as a plan entry: the typed entry, installing it after pruning, and the refit of a merging student."""

from __future__ import annotations

import copy

import pytest
import torch
from pydantic import ValidationError
from tiny import resnet_config, seeded, swin_config, vit_config

from profiling_agent.state import Candidate, CompressionPlan, TokenEntry
from profiling_agent.tools.compression.pruning import prune_model
from profiling_agent.tools.compression.token_merge import (
    TokenScheduleError,
    has_token_axis,
    merge_planned,
    token_schedule,
    tokens_unmerged,
)

OLD_PLAN = {
    "pruning": [{"layer": "^vit\\.layers\\.0\\.mlp\\.fc1$", "type": "structured", "ratio": 0.25, "justification": ""}],
    "quantization": [],
    "rationale": "an old plan",
}


def _vit(**overrides):
    from transformers import ViTForImageClassification

    return seeded(ViTForImageClassification, vit_config(num_channels=3, **overrides))


def _pixels(n: int, size: int = 16, seed: int = 1) -> torch.Tensor:
    return torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(seed))


def test_a_token_entry_holds_one_rate_or_one_schedule_and_old_plans_read_and_write_as_before():
    assert CompressionPlan.model_validate(OLD_PLAN).model_dump() == OLD_PLAN  # no "tokens" key appears
    plan = CompressionPlan.model_validate({**OLD_PLAN, "tokens": {"type": "tokens", "rate": 3}})
    assert plan.tokens is not None and plan.tokens.rate == 3 and plan.tokens.label() == "rate 3"
    assert plan.model_dump()["tokens"] == {"type": "tokens", "rate": 3, "justification": ""}
    assert CompressionPlan.model_validate(plan.model_dump()) == plan
    assert TokenEntry(schedule=[2, 0]).model_dump() == {"type": "tokens", "schedule": [2, 0], "justification": ""}
    with pytest.raises(ValidationError, match="exactly one of"):
        TokenEntry(rate=2, schedule=[2, 2])
    with pytest.raises(ValidationError, match="exactly one of"):
        TokenEntry()
    with pytest.raises(ValidationError):
        TokenEntry(rate=-1)
    with pytest.raises(ValidationError, match=">= 0"):
        TokenEntry(schedule=[1, -1])
    with pytest.raises(ValidationError):
        TokenEntry.model_validate({"type": "merge", "rate": 2})
    assert Candidate(iteration=1).token_schedule is None


def test_a_plan_merges_after_pruning_and_the_schedule_is_checked_against_the_pruned_model():
    model, x = _vit(), _pixels(2)
    entries = [{"layer": r"^vit\.layers\.0\.mlp\.fc1$", "type": "structured", "ratio": 0.5}]
    prune_model(model, entries, x[:1])
    assert merge_planned(model, None) is None and token_schedule(model) is None
    assert merge_planned(model, TokenEntry(rate=3)) == [3, 3] == token_schedule(model)
    with torch.inference_mode():
        assert model(pixel_values=x).logits.shape == (2, 10)
    assert merge_planned(model, {"type": "tokens", "schedule": [4, 0]}) == [4, 0]
    with pytest.raises(TokenScheduleError, match="one r per layer"):
        merge_planned(model, TokenEntry(schedule=[1, 1, 1]))


@pytest.mark.parametrize("kind", ["resnet", "swin"])
def test_a_model_without_a_token_axis_refuses_a_token_entry_in_one_line(kind):
    import transformers as tf

    model = (
        seeded(tf.ResNetForImageClassification, resnet_config())
        if kind == "resnet"
        else seeded(tf.SwinForImageClassification, swin_config())
    )
    reason = has_token_axis(model)
    assert reason is not None and "\n" not in reason
    with pytest.raises(TokenScheduleError) as err:
        merge_planned(model, TokenEntry(rate=2))
    assert str(err.value) == reason
    assert has_token_axis(_vit()) is None


def test_a_merging_pruned_student_is_refitted_unmerged_and_merges_again_after():
    from profiling_agent.tools.recovery.reconstruct import reconstruct

    baseline, calib = _vit(), _pixels(24)
    student = copy.deepcopy(baseline)
    report = prune_model(student, [{"layer": r"mlp\.fc1$", "type": "structured", "ratio": 0.5}], calib[:1])
    merge_planned(student, TokenEntry(rate=3))
    with tokens_unmerged(student) as schedule:
        assert schedule == [3, 3] and token_schedule(student) is None
    assert token_schedule(student) == [3, 3]
    info = reconstruct(baseline, student, calib, report.applied)
    assert info["consumers"] and all(f["error_after"] <= f["error_before"] for f in info["consumers"])
    assert token_schedule(student) == [3, 3]  # merging again after the refit
    with torch.inference_mode():
        assert torch.isfinite(student(pixel_values=calib[:2]).logits).all()
