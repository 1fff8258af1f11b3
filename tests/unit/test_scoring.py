"""Accuracy passes a round leaves out: slow forms that can no longer be delivered, and the known baseline ones."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from profiling_agent.state import Objective
from profiling_agent.tools.evaluation import latency
from profiling_agent.tools.evaluation.records import EvalImages, FormsPlan, MeasureOptions, MeasureSettings
from profiling_agent.tools.evaluation.scoring import Scores, ScoringRule, passes_needed
from profiling_agent.tools.evaluation.variants import measure_forms

N = 100  # images: with the fake latencies below, a pass of a form slower than 50 ms is estimated over 5 s


class Oracle(nn.Module):
    """Reads each image's label from its pixels and answers it, except on the first `wrong` fraction of images."""

    def __init__(self, wrong: float = 0.0):
        super().__init__()
        self.wrong, self.calls = wrong, 0

    def forward(self, pixel_values):
        self.calls += 1
        label = pixel_values[:, 0, 0, 0].long()
        answer = torch.where(pixel_values[:, 1, 0, 0] < self.wrong, (label + 1) % 10, label)
        return nn.functional.one_hot(answer, 10).float()


def _images() -> tuple[torch.Tensor, torch.Tensor]:
    labels = torch.arange(N) % 10
    pixels = torch.zeros(N, 3, 4, 4)
    pixels[:, 0, 0, 0] = labels.float()
    pixels[:, 1, 0, 0] = torch.arange(N) / N
    return pixels, labels


def _fake_timing(monkeypatch, ms: dict[str, float]) -> None:
    def timed(models, sample, **kwargs):
        batch = kwargs["batch_size"]
        rows = {n: {"latency_ms": ms[n], "latency_batch_ms": ms[n] * batch, "batch_size": batch} for n in models}
        return rows, {"busy": False}

    monkeypatch.setattr(latency, "measure_latency_checked", timed)


MS = {"baseline": 1000.0, "ov_int8": 50.0, "ov_bf16": 90.0, "ort_dynamic": 115.0, "ov_fp32": 180.0, "ort_fp32": 350.0}
FORMS = ("ov_int8", "ov_bf16", "ort_dynamic", "ov_fp32", "ort_fp32")
SETTINGS = MeasureSettings(latency_batch=4, eval_batch=10, warmup=0, repeats=1)
STAND_INS = MeasureOptions(stand_ins={"baseline": ["ort_fp32", "ov_fp32"]})


def _measure(models, *, budget=1.0, known=None, eligible=None):
    pixels, labels = _images()
    rule = ScoringRule(optional=frozenset(FORMS), budget=budget, eligible=eligible)
    return measure_forms(models, EvalImages(pixels, labels), SETTINGS, MeasureOptions(known=known, scoring=rule))


def test_slow_forms_that_cannot_be_delivered_are_timed_but_not_scored(monkeypatch):
    _fake_timing(monkeypatch, MS)
    models = {"baseline": Oracle(), "ov_int8": Oracle(0.01), **{n: Oracle() for n in FORMS[1:]}}
    measured, timing = _measure(models)
    # ov_int8 (99%) and ov_bf16 (100%) are within 1 pp; ort_dynamic is over 1.5x ov_int8's latency: left out
    assert measured["ov_int8"]["accuracy"] == 99.0 and measured["ov_bf16"]["accuracy"] == 100.0
    assert set(timing["unscored"]) == {"ort_dynamic", "ov_fp32", "ort_fp32"}
    for name in timing["unscored"]:
        assert models[name].calls == 0 and "accuracy" not in measured[name]
        assert measured[name]["latency_ms"] == MS[name]  # still timed
    assert "ov_int8 and ov_bf16 are within the budget" in timing["unscored"]["ort_fp32"]
    assert "over 1.5x slower than ov_int8" in timing["unscored"]["ort_fp32"]


def test_a_fast_form_outside_the_budget_makes_the_next_ones_scored(monkeypatch):
    _fake_timing(monkeypatch, MS)
    models = {"baseline": Oracle(), "ov_int8": Oracle(0.05), **{n: Oracle() for n in FORMS[1:]}}
    measured, timing = _measure(models)
    # ov_int8 lost 5 pp: ov_bf16 (90 ms) and ort_dynamic (115 ms) are the two within; ov_fp32 > 1.5 x 90 ms
    assert measured["ov_int8"]["accuracy"] == 95.0 and measured["ort_dynamic"]["accuracy"] == 100.0
    assert set(timing["unscored"]) == {"ov_fp32", "ort_fp32"}
    assert "over 1.5x slower than ov_bf16" in timing["unscored"]["ov_fp32"]


def test_every_form_is_scored_while_fewer_than_two_deliverable_ones_are_within_the_budget(monkeypatch):
    _fake_timing(monkeypatch, MS)
    models = {"baseline": Oracle(), **{n: Oracle(0.05) for n in FORMS}}
    measured, timing = _measure(models)
    assert timing["unscored"] == {} and all(measured[n]["accuracy"] == 95.0 for n in FORMS)
    # forms the run may not deliver do not count: under --backend onnxruntime the OpenVINO ones rule nothing out
    models = {"baseline": Oracle(), **{n: Oracle() for n in FORMS}}
    measured, timing = _measure(models, eligible=frozenset({"ort_dynamic", "ort_fp32"}))
    assert timing["unscored"] == {}


def test_cheap_passes_are_always_run(monkeypatch):
    fast = {n: ms / 100 for n, ms in MS.items()}  # every pass well under 5 s: nothing to save
    _fake_timing(monkeypatch, fast)
    models = {"baseline": Oracle(), **{n: Oracle() for n in FORMS}}
    measured, timing = _measure(models)
    assert timing["unscored"] == {} and all(measured[n]["accuracy"] == 100.0 for n in FORMS)


def test_known_baseline_predictions_are_not_made_again(monkeypatch):
    _fake_timing(monkeypatch, MS)
    pixels, labels = _images()
    known = labels.clone()
    known[:3] = (known[:3] + 1) % 10  # the saved predictions, not the model's, are what counts
    models = {"baseline": Oracle(), **{n: Oracle() for n in FORMS}}
    measured, _ = _measure(models, known={"baseline": known})
    assert models["baseline"].calls == 0 and measured["baseline"]["accuracy"] == 97.0
    assert measured["ov_int8"]["agreement"] == 97.0


def test_the_fastest_fp32_form_predicts_for_its_slower_torch_model_and_a_slower_one_does_not(monkeypatch):
    _fake_timing(monkeypatch, MS)
    pixels, labels = _images()
    # ov_fp32 stands for the baseline: its predictions (97%, marked) are the baseline's, and torch is not run
    models = {"baseline": Oracle(), "ov_fp32": Oracle(0.03), "ort_fp32": Oracle(0.5), "ov_int8": Oracle()}
    measured, timing = measure_forms(models, EvalImages(pixels, labels), SETTINGS, STAND_INS)
    assert models["baseline"].calls == 0 and timing["predicted_by"] == {"baseline": "ov_fp32"}
    assert measured["baseline"]["accuracy"] == measured["ov_fp32"]["accuracy"] == 97.0
    assert measured["ov_fp32"]["agreement"] == 100.0 and measured["ort_fp32"]["accuracy"] == 50.0
    assert measured["baseline"]["latency_ms"] == MS["baseline"]  # the torch model is still what is timed
    # a torch model faster than its FP32 forms (a GPU, a tiny model) predicts for itself
    _fake_timing(monkeypatch, {**MS, "baseline": 100.0})
    models = {"baseline": Oracle(), "ov_fp32": Oracle(0.03), "ort_fp32": Oracle(0.5)}
    measured, timing = measure_forms(models, EvalImages(pixels, labels), SETTINGS, STAND_INS)
    assert models["baseline"].calls > 0 and "predicted_by" not in timing and measured["baseline"]["accuracy"] == 100


def test_passes_needed_orders_by_latency_and_stops_at_the_tie():
    rule = ScoringRule(optional=frozenset(FORMS), budget=1.0)
    lat = {n: {"latency_ms": ms, "latency_batch_ms": ms * 4, "batch_size": 4} for n, ms in MS.items()}
    assert passes_needed(rule, Scores({}, 100.0, lat, N), list(MS)) == list(FORMS)
    assert passes_needed(rule, Scores({"ov_int8": 100.0, "ov_bf16": 99.5}, 100.0, lat, N), list(MS)) == []
    loose = ScoringRule(optional=frozenset(FORMS), budget=1.0, tie=2.5)  # 115 and 180 ms are within 2.5 x 50 ms
    assert passes_needed(loose, Scores({"ov_int8": 100.0, "ov_bf16": 99.5}, 100.0, lat, N), list(MS)) == ["ort_dynamic"]


def test_an_int8_form_within_the_budget_does_not_score_its_slow_fp32_form_for_a_retry():
    from profiling_agent.tools.evaluation.form_eval import int8_retry
    from profiling_agent.tools.runtimes.onnx_forms import Variant

    built = [Variant("ov_fp32", "fp32", status="ok", path="x"), Variant("ov_int8", "int8", status="ok", model=1)]
    pixels, labels = _images()
    asked: list[list[str]] = []

    def score(names):
        asked.append(names)
        return {"baseline": 100.0, "ov_int8": 98.0, "ov_fp32": 98.5}

    retry = int8_retry(built, pixels, pixels, labels, Objective(max_acc_drop=1.0), None, 1, "vit")
    assert retry({"baseline": 100.0, "ov_int8": 99.5}, score) == {} and asked == []
    # outside the run's budget: its own FP32 form is scored to judge the loss (98.5 - 98.0 is within: no rebuild)
    assert retry({"baseline": 100.0, "ov_int8": 98.0}, score) == {} and asked == [["ov_fp32"]]


@pytest.mark.parametrize("target", ["size"])
def test_under_a_size_target_every_form_is_scored(target, tmp_path):
    """The smallest form within the budget ships under a size target, so no pass may be left out."""
    from profiling_agent.state import Context
    from profiling_agent.tools.evaluation.form_eval import evaluate_forms

    pixels, labels = _images()
    models = {"baseline": Oracle()}
    plan = FormsPlan(
        fp32=Oracle(),
        forms=[],
        images=EvalImages(pixels, labels, pixels),
        out_dir=tmp_path,
        rel=str,
        objective=Objective(target=target),
        torch_forms={"torch_fp32": ("baseline", 0, None)},
    )
    out = evaluate_forms(models, plan, MeasureSettings.of(Context(), "cpu", 1))
    assert "unscored" not in out.timing


def test_the_baselines_predictions_are_reused_only_on_the_same_images_and_device(tmp_path):
    from profiling_agent.tools.evaluation.baseline_eval import baseline_predictions, save_baseline_predictions

    _, labels = _images()
    preds = (labels + 1) % 10
    assert baseline_predictions(tmp_path, labels, "cpu") is None  # an older run: predicted again
    save_baseline_predictions(tmp_path, preds, labels, "cpu")
    assert torch.equal(baseline_predictions(tmp_path, labels, "cpu"), preds)
    assert baseline_predictions(tmp_path, labels, "cuda") is None
    assert baseline_predictions(tmp_path, labels.flip(0), "cpu") is None
    assert baseline_predictions(tmp_path, labels[:50], "cpu") is None


def test_a_rounds_ort_fp32_built_only_as_a_source_is_neither_timed_nor_scored(monkeypatch, tmp_path):
    from profiling_agent.state import Context
    from profiling_agent.tools.evaluation import form_eval
    from profiling_agent.tools.runtimes.forms import round_contenders, round_forms
    from profiling_agent.tools.runtimes.onnx_forms import Variant

    base = [
        {"name": n, "status": "ok", "accuracy": 90.0, "latency_ms": MS[n]} for n in ("ort_fp32", "ov_int8", "ov_bf16")
    ]
    assert round_contenders(base, 90.0, 1.0) == ["ov_bf16", "ov_int8"]
    assert round_forms(base, 90.0, 1.0) == ["ort_fp32", "ov_bf16", "ov_int8"]
    source, int8 = Oracle(), Oracle()
    built = [
        Variant("ort_fp32", "fp32", status="ok", path=str(tmp_path / "a"), model=source),
        Variant("ov_int8", "int8", status="ok", path=str(tmp_path / "b"), model=int8),
    ]
    monkeypatch.setattr(form_eval, "build_forms", lambda *a, **k: built)
    timed: list[str] = []

    def timing(models, sample, **kwargs):
        timed.extend(models)
        rows = {n: {"latency_ms": 1.0, "latency_batch_ms": 4.0, "batch_size": 4} for n in models}
        return rows, {"busy": False}

    monkeypatch.setattr(latency, "measure_latency_checked", timing)
    pixels, labels = _images()
    plan = FormsPlan(
        fp32=Oracle(),
        forms=["ort_fp32", "ov_int8"],
        images=EvalImages(pixels, labels, pixels),
        out_dir=tmp_path,
        rel=str,
        objective=Objective(),
        torch_forms={"torch_fp32": ("baseline", 0, None)},
        sources=["ort_fp32"],
    )
    out = form_eval.evaluate_forms({"baseline": Oracle()}, plan, MeasureSettings.of(Context(), "cpu", 1))
    record = next(v for v in out.variants if v.name == "ort_fp32")
    assert record.status == "unscored" and record.latency_ms is None and record.accuracy is None
    assert "source of the other forms" in (record.error or "") and source.calls == 0 and "ort_fp32" not in timed
    assert next(v for v in out.variants if v.name == "ov_int8").accuracy == 100.0
