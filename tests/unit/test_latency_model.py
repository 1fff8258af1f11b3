"""The latency lookup table: measured per group at a few ratios in an ONNX Runtime form, cached, interpolated."""

from __future__ import annotations

import pytest
import torch

from profiling_agent.tools.profiling.backend_profile import ORT_FORMS
from profiling_agent.tools.profiling.latency_model import cached_table, predict_latency


def test_predictions_interpolate_each_groups_measured_time():
    table = {
        "ratios": [0.0, 0.5],
        "groups": {"a": [4.0, 2.0], "b": [2.0, 1.0]},
        "other_ms": [4.0, 4.0],
        "total_ms": [10.0, 7.0],
    }
    assert predict_latency(table, {})["predicted_ms"] == pytest.approx(10.0)
    out = predict_latency(table, {"a": 0.25, "b": 0.5})
    assert out["predicted_ms"] == pytest.approx(4.0 + 3.0 + 1.0)
    assert out["reduction"] == pytest.approx(0.2)


def test_table_of_a_tiny_vit_is_measured_once_and_cached(tiny_vit, tmp_path):
    example = torch.randn(1, 1, 16, 16)
    form = ORT_FORMS[0]
    table = cached_table(tiny_vit, example, form, tmp_path, ratios=(0.0, 0.5), repeats=3)
    assert set(table["groups"]) == {"layers.0.heads", "layers.0.mlp", "layers.1.heads", "layers.1.mlp"}
    assert all(len(t) == 2 and t[0] > 0 for t in table["groups"].values())
    assert predict_latency(table, {})["predicted_ms"] == pytest.approx(table["total_ms"][0], abs=1e-4)  # 5-decimal rows
    files = list(tmp_path.glob("latency-*-ort_fp32.json"))
    assert len(files) == 1
    files[0].write_text(files[0].read_text().replace('"form": "ort_fp32"', '"form": "cached"'))
    assert cached_table(tiny_vit, example, form, tmp_path)["form"] == "cached"  # no second measurement
