"""Tests of accuracy, memory and side-by-side latency measurement."""

from __future__ import annotations

import copy
import time
import warnings

import pytest
import torch
from torch import nn

from profiling_agent.tools.evaluation.latency import latency_inputs, measure_latency
from profiling_agent.tools.evaluation.metrics import EvalConfig, agreement, file_size_mb, predict, top1
from profiling_agent.tools.models.sizes import count_params, state_bytes


def _quantized(model: nn.Module, dtype: torch.dtype = torch.qint8) -> nn.Module:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.ao.quantization.quantize_dynamic(copy.deepcopy(model), {nn.Linear}, dtype=dtype)


def _pixels(n: int, channels: int = 1, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, channels, 16, 16, generator=torch.Generator().manual_seed(seed))


def _linear_weight_elements(model: nn.Module) -> int:
    return sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))


# ---------------------------------------------------------------- accuracy


def test_predict_matches_argmax_and_respects_allowed_ids(tiny_vit):
    pixels = _pixels(40)
    with torch.inference_mode():
        logits = tiny_vit(pixel_values=pixels).logits
    assert torch.equal(predict(tiny_vit, pixels, batch_size=64), logits.argmax(1))
    assert torch.equal(predict(tiny_vit, pixels, batch_size=7), logits.argmax(1))  # batching does not matter
    allowed = [7, 2, 5]
    preds = predict(tiny_vit, pixels, batch_size=16, allowed_ids=allowed)
    assert preds.dtype == torch.long and preds.shape == (40,)
    assert set(preds.tolist()) <= set(allowed)
    expected = torch.tensor(allowed)[logits[:, allowed].argmax(1)]
    assert torch.equal(preds, expected)
    with pytest.raises(ValueError):
        predict(tiny_vit, pixels, allowed_ids=[3, 10])  # the model has 10 labels


def test_predict_on_empty_input(tiny_vit):
    assert predict(tiny_vit, _pixels(0)).numel() == 0


def test_top1_and_agreement():
    preds = torch.tensor([1, 2, 3, 4])
    assert top1(preds, torch.tensor([1, 2, 0, 4])) == pytest.approx(75.0)
    assert agreement(preds, torch.tensor([0, 0, 0, 4])) == pytest.approx(25.0)
    assert top1(preds, preds.clone()) == 100.0
    with pytest.raises(ValueError):
        top1(preds, torch.tensor([1, 2]))
    with pytest.raises(ValueError):
        agreement(torch.tensor([]), torch.tensor([]))


# ---------------------------------------------------------------- memory


@pytest.mark.parametrize("fixture", ["tiny_vit", "tiny_resnet"])
def test_state_bytes_equals_state_dict_bytes(fixture, request):
    model = request.getfixturevalue(fixture)
    expected = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    assert state_bytes(model) == expected


def test_state_bytes_counts_packed_quantized_weights(tiny_vit):
    fp32 = state_bytes(tiny_vit)
    weights = _linear_weight_elements(tiny_vit)
    qint8 = _quantized(tiny_vit, torch.qint8)
    fp16 = _quantized(tiny_vit, torch.float16)
    assert not any(isinstance(m, nn.Linear) for m in qint8.modules())
    # Each Linear weight goes from 4 bytes to 1 (qint8) or 2 (float16) per element; biases stay fp32; a
    # per-tensor qint8 Linear also stores its float64 scale and int64 zero point (16 bytes).
    linears = sum(isinstance(m, nn.Linear) for m in tiny_vit.modules())
    assert state_bytes(qint8) == fp32 - 3 * weights + 16 * linears
    assert state_bytes(fp16) == fp32 - 2 * weights
    assert state_bytes(qint8) < state_bytes(fp16) < fp32
    assert count_params(qint8) == count_params(tiny_vit) == sum(p.numel() for p in tiny_vit.parameters())


def test_file_size_mb(tmp_path):
    (tmp_path / "a.bin").write_bytes(b"\0" * 2_500_000)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.bin").write_bytes(b"\0" * 500_000)
    assert file_size_mb(tmp_path / "a.bin") == pytest.approx(2.5)
    assert file_size_mb(tmp_path) == pytest.approx(3.0)


# ---------------------------------------------------------------- latency


def test_latency_inputs_repeat_a_sample_or_slice_a_batch():
    image = torch.randn(1, 16, 16)
    single, batch = latency_inputs(image, 4)
    assert single.shape == (1, 1, 16, 16) and batch.shape == (4, 1, 16, 16)
    assert all(torch.equal(b, image) for b in batch)
    given = torch.arange(3.0).view(3, 1, 1, 1).expand(3, 1, 2, 2)
    single, batch = latency_inputs(given, 5)
    assert batch[:, 0, 0, 0].tolist() == [0.0, 1.0, 2.0, 0.0, 1.0] and single[0, 0, 0, 0] == 0.0
    assert latency_inputs(given, 2)[1].shape[0] == 2
    with pytest.raises(ValueError):
        latency_inputs(torch.randn(16, 16), 2)


def test_measure_latency_side_by_side(tiny_vit):
    from helpers.tiny import seeded, vit_config
    from transformers import ViTForImageClassification

    config = vit_config(hidden_size=384, num_hidden_layers=4, num_attention_heads=6, intermediate_size=1536)
    big = seeded(ViTForImageClassification, config)
    models = {"tiny": tiny_vit, "big": big, "tiny_q": _quantized(tiny_vit)}
    result = measure_latency(models, _pixels(1)[0], batch_size=8, warmup=1, repeats=5)
    assert set(result) == set(models)
    for row in result.values():
        assert row["latency_ms"] > 0 and row["latency_batch_ms"] > 0
        assert row["batch_size"] == 8 and row["threads"] == torch.get_num_threads() and row["repeats"] == 5
    # ~360x the MACs of the tiny model: far slower at batch 8 even on a noisy machine.
    assert result["big"]["latency_batch_ms"] > 2 * result["tiny"]["latency_batch_ms"]


class _Sleeper(nn.Module):
    """A classifier whose every call takes `seconds` of wall time (and almost no CPU)."""

    def __init__(self, seconds: float):
        super().__init__()
        self.seconds = seconds

    def forward(self, pixel_values):
        time.sleep(self.seconds)
        return torch.zeros(len(pixel_values), 10)


def test_a_sample_of_a_fast_model_is_the_mean_of_a_run_of_calls(monkeypatch):
    from profiling_agent.tools.evaluation import latency

    assert latency.calls_per_sample(0.02) == 1 and latency.calls_per_sample(0.001) == 5
    assert latency.calls_per_sample(1e-6) == latency.MAX_CALLS
    # a clock that says every call of "quick" takes 1 ms and of "slow" 20 ms: no wall-clock bound in the test
    calls = {"quick": 0, "slow": 0}

    def fake_ms(call, n, device):
        name = call.args[0].name  # a torch model's bound call: functools.partial(forward_logits, model, inputs)
        calls[name] += n
        return n * (1.0 if name == "quick" else 20.0)

    class Named(_Sleeper):
        def __init__(self, name):
            super().__init__(0.0)
            self.name = name

    monkeypatch.setattr(latency, "timed_calls_ms", fake_ms)
    result = latency.measure_latency({n: Named(n) for n in calls}, _pixels(1)[0], batch_size=2, warmup=1, repeats=3)
    assert result["slow"]["calls"] == 1 and result["quick"]["calls"] == 5
    assert result["quick"]["latency_ms"] == 1.0 and result["slow"]["latency_ms"] == 20.0  # per call, not per run
    assert calls == {"quick": 2 + 3 * 2 * 5, "slow": 2 + 3 * 2 * 1}  # one warm-up pass, then 3 repeats of 2 sizes


def test_a_model_past_the_timing_budget_sits_out_the_remaining_repeats_and_says_how_many_it_got(monkeypatch):
    from profiling_agent.tools.evaluation import latency
    from profiling_agent.tools.evaluation.latency import MIN_REPEATS

    monkeypatch.setattr(latency, "MIN_SAMPLE_S", 0.0)  # one call a sample: the tiny budget is the slow model's
    models = {"slow": _Sleeper(0.02), "fast": _Sleeper(0.0)}
    # the slow model spends 0.04 s per repeat (batch 1 and batch 2): past 0.1 s after 3 repeats, so it stops at
    # MIN_REPEATS; the fast one never reaches the budget and gets all 12
    result = measure_latency(models, _pixels(1)[0], batch_size=2, warmup=0, repeats=12, budget_s=0.1)
    assert result["slow"]["repeats"] == MIN_REPEATS and result["fast"]["repeats"] == 12
    assert result["slow"]["latency_ms"] >= 20 and result["slow"]["wall_s"] >= MIN_REPEATS * 0.04  # it slept each time
    unbounded = measure_latency(models, _pixels(1)[0], batch_size=2, warmup=0, repeats=7)
    assert unbounded["slow"]["repeats"] == unbounded["fast"]["repeats"] == 7


def test_a_slow_model_past_the_budget_sits_out_after_three_repeats(monkeypatch):
    from profiling_agent.tools.evaluation import latency

    # 0.04 s per repeat counts as slow when SLOW_REPEAT_S is 0.03: past the 0.1 s budget after 3 repeats, it stops
    # there instead of at MIN_REPEATS
    monkeypatch.setattr(latency, "SLOW_REPEAT_S", 0.03)
    monkeypatch.setattr(latency, "MIN_SAMPLE_S", 0.0)  # one call a sample: the tiny budget is the slow model's
    models = {"slow": _Sleeper(0.02), "fast": _Sleeper(0.0)}
    result = latency.measure_latency(models, _pixels(1)[0], batch_size=2, warmup=0, repeats=12, budget_s=0.1)
    assert result["slow"]["repeats"] == latency.MIN_SLOW_REPEATS < latency.MIN_REPEATS
    assert result["fast"]["repeats"] == 12


def test_under_the_budget_a_model_out_of_the_race_sits_out_and_the_close_contenders_keep_every_repeat(monkeypatch):
    from profiling_agent.tools.evaluation import latency

    monkeypatch.setattr(latency, "OUT_OF_RACE_S", 0.05)
    # per repeat (batch 1 and 2): 0.02, 0.024 and 0.08 s; the last is 4x the fastest at both sizes and past 0.05 s
    # after MIN_REPEATS; the second is within 1.5x of the fastest and keeps all 12, like the fastest
    models = {"fast": _Sleeper(0.01), "close": _Sleeper(0.012), "far": _Sleeper(0.04)}
    result = latency.measure_latency(models, _pixels(1)[0], batch_size=2, warmup=0, repeats=12, budget_s=10.0)
    assert [result[n]["repeats"] for n in models] == [12, 12, latency.MIN_REPEATS]
    assert result["far"]["latency_ms"] >= 40  # its median is still its own
    unbounded = latency.measure_latency(models, _pixels(1)[0], batch_size=2, warmup=0, repeats=7)
    assert {r["repeats"] for r in unbounded.values()} == {7}  # the benchmarks' protocol times every repeat


def test_under_the_budget_a_model_whose_first_warm_up_was_long_gets_no_more_warm_ups(monkeypatch):
    from profiling_agent.tools.evaluation import latency

    class Counting(_Sleeper):
        calls = 0

        def forward(self, pixel_values):
            self.calls += 1
            return super().forward(pixel_values)

    # one warm-up pass (batch 1 and 2) of the slow model sleeps 0.04 s, past the 0.03 s that makes a model warm
    monkeypatch.setattr(latency, "WARM_AFTER_S", 0.03)
    monkeypatch.setattr(latency, "MIN_SAMPLE_S", 0.0)  # one call a sample, so calls count passes
    slow, fast = Counting(0.02), Counting(0.0)
    latency.measure_latency({"slow": slow, "fast": fast}, _pixels(1)[0], batch_size=2, warmup=3, repeats=1,
                            budget_s=10.0)  # fmt: skip
    assert (slow.calls, fast.calls) == (2 + 2, 6 + 2)  # one warm-up pass against three, then one timed repeat
    slow.calls = fast.calls = 0
    latency.measure_latency({"slow": slow, "fast": fast}, _pixels(1)[0], batch_size=2, warmup=3, repeats=1)
    assert (slow.calls, fast.calls) == (8, 8)  # without a budget (the benchmarks' protocol) every warm-up runs


def test_eval_config_defaults():
    config = EvalConfig()
    assert (config.batch_size, config.warmup, config.repeats, config.eval_batch_size, config.device) == (
        32,
        3,
        10,
        64,
        "cpu",
    )
    assert EvalConfig(repeats=3).repeats == 3


def test_model_macs_falls_back_to_the_macs_an_artifact_recorded(tiny_vit, monkeypatch):
    import profiling_agent.tools.profiling.static as static
    from profiling_agent.tools.evaluation.evaluate_model import model_macs
    from profiling_agent.tools.models.loading import LoadedModel

    loaded = LoadedModel(tiny_vit, None, "artifact", "x", {"recipe": {"extra": {"macs": 12345}}})
    counted = model_macs(loaded, (1, 16, 16))
    assert counted and counted != 12345  # ptflops counts when it can

    def unsupported(*_args, **_kwargs):
        raise RuntimeError("ptflops cannot count this module")

    monkeypatch.setattr(static, "static_profile", unsupported)
    assert model_macs(loaded, (1, 16, 16)) == 12345  # the artifact's recipe, kept in LoadedModel.info
    assert model_macs(LoadedModel(tiny_vit, None, "local", "x"), (1, 16, 16)) is None
