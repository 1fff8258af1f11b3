"""The report's headline speed (quantization-only form first, then torch FP32) and its legible Pareto labels."""

from __future__ import annotations

import re

import pytest

from profiling_agent.tools.reporting.html import render_html
from profiling_agent.tools.reporting.plots import pareto_figure
from profiling_agent.tools.reporting.speed import delivered_speed, speed_sentence

BASE = {"accuracy": 95.0, "latency_ms": 3.0, "latency_batch_ms": 4.5, "params": 206_026, "macs": 3_628_506}


def _result(delivery: dict | None, iteration: int = 1, n_candidates: int = 1, variants: int = 0) -> dict:
    """A finished run's result.json with `n_candidates` close candidates (the last one best) and its forms."""
    candidates = [
        {
            "iteration": i,
            "status": "ok",
            "accuracy": 94.4 + 0.02 * i,
            "agreement": 98.0,
            "latency_ms": 0.5 + 0.004 * i,
            "latency_batch_ms": 2.7,
            "speedup": 3.0 / (0.5 + 0.004 * i),
            "params": 119_322 + 500 * i,
            "macs": 2_134_121,
            "size_mb": 0.548,
            "plan": {"pruning": [], "quantization": []},
        }
        for i in range(1, n_candidates + 1)
    ]
    forms = [("torch_fp32", 1.09), ("ort_dynamic", 6.2), ("torch_qint8", 0.49), ("ov_fp32", 5.9), ("ov_int8", 6.0)]
    best = {
        **(candidates[-1] if iteration else BASE),
        "iteration": n_candidates if iteration else 0,
        "accuracy_drop": 0.6,
        "reduction": 0.42,
        "within_budget": True,
        "delivered": "ort_fp32",
        "variants": [
            {"name": name, "status": "ok", "accuracy": 94.4 + (k % 2) * 0.6, "speedup": speed}
            for k, (name, speed) in enumerate(forms[:variants])
        ],
    }
    return {
        "thread_id": "t1",
        "status": "done",
        "objective": {"target": "params", "target_reduction": 0.4, "max_acc_drop": 2.0},
        "baseline": {**BASE, "speedup": 1.0, "size_mb": 0.831},
        "best": best,
        "candidates": candidates,
        "delivery": delivery,
        **{key: {} for key in ("model", "dataset", "labels", "input_shape", "planner", "protocol")},
    }


DELIVERY = {
    "delivered": "ort_fp32 of iteration 1",
    "pruning_added": True,
    "verdict": "pruning made it 1.03x faster than quantizing the unpruned model alone",
    "vs_original_torch": 5.91,
    "vs_quantization_only": 1.03,
    "quantization_only": {"name": "ort_dynamic", "accuracy": 95.0, "latency_ms": 0.52},
    "timing": {},
    "timings_flagged": False,
}


def _cards(page: str) -> list[tuple[str, str]]:
    found = re.findall(r'<div class="label">([^<]*)</div><div class="value[^"]*">([^<]*)</div>', page)
    return [(label, value) for label, value in found]


def test_headline_states_speed_against_quantization_only_first_then_torch():
    page = render_html(_result(DELIVERY))
    cards = _cards(page)
    assert cards[:2] == [("Speed vs quantization only", "1.03x"), ("Speed vs torch FP32", "5.91x")]
    sentence = "1.03x the quantization-only form (ort_dynamic of the unpruned model) and 5.91x the original torch"
    assert sentence in page and "5.91x" not in page[: page.index("1.03x")]


def test_headline_when_quantization_alone_was_delivered_or_not_measured():
    alone = {**DELIVERY, "pruning_added": False, "vs_quantization_only": 1.0, "vs_original_torch": 6.63}
    cards = _cards(render_html(_result(alone, iteration=0)))
    assert cards[:2] == [("Speed vs quantization only", "1.00x"), ("Speed vs torch FP32", "6.63x")]
    speed = delivered_speed(_result(alone, iteration=0))
    assert speed is not None and speed_sentence(speed).startswith("the quantization-only form (ort_dynamic")
    # an older result.json without "delivery": the torch ratio of the best row, no quantization-only claim
    older = _result(None)
    cards = _cards(render_html(older))
    assert cards[0] == ("Speed vs torch FP32", f"{older['best']['speedup']:.2f}x")
    assert all(label != "Speed vs quantization only" for label, _ in cards)


@pytest.mark.parametrize("cost", ["latency_rel", "params"])
def test_pareto_labels_do_not_overlap_and_every_point_is_named(cost):
    result = _result(DELIVERY, n_candidates=5, variants=5)
    result["baselines"] = {"uniform 40%": {"accuracy": 94.5, "params": 120_000, "speedup": 6.1}}
    from matplotlib.text import Text

    fig = pareto_figure(result, cost)
    renderer = fig.canvas.get_renderer()
    fig.draw(renderer)
    texts = [t for t in fig.axes[0].texts if t.get_text()]
    boxes = [Text.get_window_extent(t, renderer) for t in texts]  # the text itself, without its leader line
    for i, a in enumerate(boxes):
        assert fig.bbox.x0 <= a.x0 and a.x1 <= fig.bbox.x1 and fig.bbox.y0 <= a.y0 and a.y1 <= fig.bbox.y1
        for j in range(i + 1, len(boxes)):
            assert not a.overlaps(boxes[j]), (texts[i].get_text(), texts[j].get_text())
    named = [line for t in texts for line in t.get_text().split("\n")]
    expected = ["baseline", *(f"iter {i}" for i in range(1, 6)), "uniform 40%"]
    expected += [f"iter 5 {name}" for name in ("torch_fp32", "ort_dynamic", "torch_qint8", "ov_fp32", "ov_int8")]
    assert sorted(named) == sorted(expected)


def test_a_candidate_rejected_on_its_trial_slice_is_listed_without_numbers():
    from profiling_agent.tools.reporting.markdown import comparison_rows
    from profiling_agent.tools.reporting.pareto import pareto_points
    from profiling_agent.tools.reporting.plots import render_plots
    from profiling_agent.tools.reporting.result import METRIC_KEYS

    result = _result(DELIVERY, n_candidates=1)
    rejected = {
        "iteration": 2,
        "status": "rejected",
        **dict.fromkeys(METRIC_KEYS),  # result.json keeps every key, null where nothing was measured
        "plan": {"pruning": [], "quantization": []},
        "error": "trial slice after recovery: 25.00 pp lost, wholly beyond the 2 pp budget",
        "recovery": {"trial_curve": [[300, 75.0, 25.0]]},
        "prediction": {"predicted_drop": 3.0, "predicted_interval": [1.0, 5.0]},
    }
    result["candidates"].append(rejected)
    rows = comparison_rows(result)
    assert rows[-1][0] == "iter 2" and set(rows[-1][1:9]) == {"-"} and rows[-1][-1] == "rejected"
    assert [p["label"] for p in pareto_points(result) if p["label"].startswith("iter 2")] == []
    page = render_html(result, images=render_plots(result, None))
    assert '<tr class="failed"><td>iter 2</td>' in page and "predicted_loss" in "".join(render_plots(result, None))
