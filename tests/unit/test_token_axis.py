"""Token merging as a plan entry: the typed entry, installing it after pruning, and the refit of a merging student."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from helpers.tiny import resnet_config, seeded, swin_config, vit_config
from pydantic import ValidationError

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


def test_a_schedule_written_for_the_unpruned_layers_keeps_its_first_rs_when_the_plan_removes_blocks():
    from profiling_agent.tools.compression.token_merge import layer_count

    model, x = _vit(num_hidden_layers=4, image_size=32), _pixels(2, 32)  # 64 patches + CLS
    layers = layer_count(model)
    prune_model(model, [{"layer": "layers\\.1$", "type": "block", "ratio": 1.0}], x[:1])
    assert layers == 4 and layer_count(model) == 3
    assert merge_planned(model, TokenEntry(schedule=[40, 12, 0, 0]), layers) == [32, 12, 0] == token_schedule(model)
    with torch.inference_mode():
        assert model(pixel_values=x).logits.shape == (2, 10)
    with pytest.raises(TokenScheduleError, match="one r per layer"):  # not the unpruned model's length: refused
        merge_planned(model, TokenEntry(schedule=[1, 1, 1, 1, 1]), layers)
    with pytest.raises(TokenScheduleError, match="one r per layer"):  # no count before pruning: nothing to fit
        merge_planned(model, TokenEntry(schedule=[1, 1, 1, 1]))


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


def _timed_form(ms_by_tokens, monkeypatch):
    """A BackendForm that 'builds' a merged model, timed by the tokens its last layer sees (steady timings)."""
    from profiling_agent.tools.compression.token_merge import tokens_per_layer
    from profiling_agent.tools.profiling import token_latency
    from profiling_agent.tools.profiling.backend_profile import BackendForm

    built = {}

    def build(model, example, folder):
        schedule = token_schedule(model) or [0] * len(model.vit.layers)
        built[str(folder)] = tokens_per_layer(model, schedule)[-1]
        return folder

    def never(path, pixels, warmup, repeats):
        raise AssertionError("the token axis times whole runs, not the node profile")

    monkeypatch.setattr(token_latency, "time_built_form", lambda f, path, x, r: ms_by_tokens(built[str(path)]) + 0.1)
    return BackendForm("ov_int8", "openvino", build, never)


def test_front_loaded_schedules_merge_in_the_first_layers_only_up_to_each_layers_cap():
    from profiling_agent.tools.profiling.token_latency import front_schedules

    # 64 patches + CLS over 2 layers: both layers are front layers; [32, 16] is uniform rate 32's, so not repeated
    assert front_schedules(_vit(image_size=32)) == [[16, 12]]
    # ViT-B/16's 196 patches over 12 layers: the first three merge half or all they may, the rest none
    wide = _vit(image_size=224, patch_size=16, num_hidden_layers=12)
    assert front_schedules(wide) == [[49, 36, 27] + [0] * 9, [98, 49, 24] + [0] * 9]


def test_the_token_latency_table_drops_a_rate_that_does_not_pay_and_says_why(tmp_path, monkeypatch):
    from profiling_agent.tools.profiling.token_latency import max_rate, measure_token_latency, token_rates

    model = _vit(image_size=32)  # 64 patches + CLS over 2 layers
    assert max_rate(model) == 32 and token_rates(model) == [11, 21, 32]
    # faster with fewer tokens, except that merging 11 costs more in small ops than it saves
    form = _timed_form(lambda left: 1.0 if left == 65 else (1.05 if left > 40 else 0.2 + left / 50), monkeypatch)
    table = measure_token_latency(model, _pixels(1, 32), form, tmp_path)
    assert table["form"] == "ov_int8" and table["batch"] == 1 and table["base_ms"] == pytest.approx(1.1)
    rows = {r["rate"]: r for r in table["rates"]}
    assert list(rows) == [0, 11, 21, 32, None] and rows[0]["dropped"] is None and rows[0]["saved_share"] == 0
    # the front-loaded schedule is timed beside the rates: 65 - 16 - 12 = 37 tokens left, so it pays here
    assert rows[None]["schedule"] == [16, 12] and rows[None]["tokens_left"] == 37 and rows[None]["dropped"] is None
    assert "does not pay on ov_int8 at batch 1" in rows[11]["dropped"] and rows[11]["saved_share"] < 0
    assert rows[21]["dropped"] is None and rows[21]["saved_share"] > 0.3 and rows[21]["schedule"] == [21, 21]
    assert rows[32]["tokens_left"] == 65 - 32 - 16
    resnet = measure_token_latency(
        seeded(__import__("transformers").ResNetForImageClassification, resnet_config()), _pixels(1), None, tmp_path
    )
    assert "no token axis" in resnet["error"]


def test_the_token_axis_adds_each_paying_rates_trial_slice_damage_and_the_planning_record_keeps_the_table(tmp_path):
    from profiling_agent.tools.profiling.planning_latency import record_from_profile, record_key
    from profiling_agent.tools.profiling.token_latency import measure_token_latency, token_axis

    model = _vit(image_size=32)
    table = measure_token_latency(model, _pixels(1, 32), None, tmp_path, rates=[8, 32])  # eager torch, timed
    table["rates"][1]["dropped"], table["rates"][2]["dropped"] = "rate 8 does not pay", None  # whatever was timed
    labels = torch.arange(12) % 10
    axis = token_axis(model, table, _pixels(12, 32), labels, None)
    assert axis is not None and axis.form == "torch" and axis.images == 12
    assert (
        axis.at(8).drop_pp is None
        and axis.at(32).drop_pp is not None
        and axis.at(32).kl >= 0
        and axis.at(32).agreement < 100
    )
    assert [r.rate for r in axis.paying()] == [32]
    assert token_axis(model, None, _pixels(2, 32), labels[:2]) is None
    profile = {"group_costs": {"g": {"latency_share": 0.5}}, "totals": {"latency_ms": 1.0}, "token_latency": table}
    assert record_from_profile(profile)["tokens"] == table
    assert "tokens" not in record_from_profile({**profile, "token_latency": None})
    assert record_key("d", "torch", 1, [3, 16, 16], True) != record_key("d", "torch", 1, [3, 16, 16], True, tokens=True)


def test_a_built_form_is_timed_as_a_whole_run(tmp_path):
    """The token axis times the built file's whole run through its runtime (not the node profile's sum)."""
    from profiling_agent.tools.profiling.backend_profile import ORT_FORMS
    from profiling_agent.tools.profiling.token_latency import time_built_form

    model = _vit(image_size=32)
    form = next(f for f in ORT_FORMS if f.name == "ort_dynamic")
    path = form.build(model, _pixels(1, 32), tmp_path / "form")
    ms = time_built_form(form, path, _pixels(1, 32), 3)
    assert ms > 0 and math.isfinite(ms)  # a timing, not a bound on it (speed targets live in bench/)
