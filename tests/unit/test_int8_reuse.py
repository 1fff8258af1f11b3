"""The profile's INT8 build of the baseline is the one measure_baseline measures: NNCF quantizes it once per run."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch

from profiling_agent.tools.runtimes.openvino_model import OV_FILE, OV_WEIGHTS

pytest.importorskip("nncf")


def _counting_nncf(monkeypatch) -> list[int]:
    import nncf

    calls: list[int] = []
    real = nncf.quantize

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(nncf, "quantize", counted)
    return calls


def _measured_int8(model, calib: torch.Tensor, check: torch.Tensor, out: Path):
    """Build the baseline's forms as measure_baseline does; return its ov_int8 Variant."""
    from profiling_agent.tools.runtimes.forms import build_forms

    built = build_forms(model, calib, check, out, forms=["ort_fp32", "ov_int8"], threads=1)
    return next(v for v in built if v.name == "ov_int8")


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_profiles_int8_build_is_reused_by_the_baseline_measurement(one_layer_vit, monkeypatch, tmp_path):
    from profiling_agent.tools.profiling.backend_profile import profile_backends
    from profiling_agent.tools.profiling.openvino_profile import OV_PROFILE_FORMS
    from profiling_agent.tools.runtimes.int8_reuse import int8_reuse

    gen = torch.Generator().manual_seed(0)
    calib, check = torch.randn(12, 1, 16, 16, generator=gen), torch.randn(6, 1, 16, 16, generator=gen)
    fresh = _measured_int8(one_layer_vit, calib, check, tmp_path / "fresh")  # no block: as every build was before
    assert fresh.status == "ok", fresh.error

    calls = _counting_nncf(monkeypatch)
    reuse = tmp_path / "run" / "int8_reuse"
    with int8_reuse(reuse, calib):  # the profile step
        out = profile_backends(one_layer_vit, torch.randn(1, 1, 16, 16), [], OV_PROFILE_FORMS, repeats=1)
    assert "error" not in out["forms"]["ov_int8"] and len(calls) == 1
    assert len(list(reuse.iterdir())) == 1  # kept for measure_baseline
    with int8_reuse(reuse, calib, drop_after=True):  # measure_baseline
        measured = _measured_int8(one_layer_vit, calib, check, tmp_path / "run" / "baseline_forms")
    assert measured.status == "ok", measured.error
    assert len(calls) == 1  # read back, not quantized again
    assert not reuse.exists()  # the last reader removed it
    assert _digest(Path(measured.path) / OV_WEIGHTS) == _digest(Path(fresh.path) / OV_WEIGHTS)
    assert measured.recipe["quantization"] == fresh.recipe["quantization"]
    with torch.inference_mode():
        torch.testing.assert_close(measured.model(check).logits, fresh.model(check).logits, rtol=0, atol=0)
    assert (Path(measured.path) / OV_FILE).is_file()


def test_other_calibration_images_build_anew_and_a_plain_build_keeps_nothing(one_layer_vit, monkeypatch, tmp_path):
    from profiling_agent.tools.runtimes.int8_reuse import int8_reuse

    gen = torch.Generator().manual_seed(1)
    calib, check = torch.randn(8, 1, 16, 16, generator=gen), torch.randn(4, 1, 16, 16, generator=gen)
    calls = _counting_nncf(monkeypatch)
    reuse = tmp_path / "int8_reuse"
    with int8_reuse(reuse, calib):
        _measured_int8(one_layer_vit, calib, check, tmp_path / "a")
    with int8_reuse(reuse, calib + 0.5):  # other images: another key
        _measured_int8(one_layer_vit, calib + 0.5, check, tmp_path / "b")
    assert len(calls) == 2 and len(list(reuse.iterdir())) == 2
    _measured_int8(one_layer_vit, calib, check, tmp_path / "c")  # outside a block: quantized, nothing kept or read
    assert len(calls) == 3 and len(list(reuse.iterdir())) == 2


def test_only_the_baselines_int8_build_reads_the_runs_calibration(one_layer_vit, monkeypatch, tmp_path):
    """The latency table's and the token rates' INT8 builds are timed only: calibrated on copies of one example.

    On full-size ViT-B/16 each of those builds calibrated on the run's images made the profile step several times
    longer (2026-11-28); only the baseline's build is the one measure_baseline reuses.
    """
    import nncf

    import profiling_agent.tools.profiling.deliverable as deliverable
    from profiling_agent.tools.profiling import latency_model, token_latency
    from profiling_agent.tools.profiling.openvino_profile import CALIBRATION_COPIES

    sizes: list[int] = []
    real = nncf.quantize

    def sized(model, dataset, *args, **kwargs):
        sizes.append(sum(1 for _ in dataset.get_inference_data()))
        return real(model, dataset, *args, **kwargs)

    monkeypatch.setattr(nncf, "quantize", sized)
    monkeypatch.setattr(deliverable, "planned_form", lambda *a: "ov_int8")  # as on ViT-B/16 (the tiny one: ov_fp32)
    # the smallest table and token axis that still build both kinds of timed-only form: two ratios, one rate, one
    # front-loaded schedule (each build is an NNCF quantization, about a second on this tiny model)
    monkeypatch.setattr(latency_model.measure_table, "__kwdefaults__", {"ratios": (0.0, 0.5), "repeats": 5})
    monkeypatch.setattr(token_latency.token_rates, "__defaults__", (1,))
    monkeypatch.setattr(token_latency.front_schedules, "__defaults__", (1,))
    monkeypatch.setenv("PROFILING_AGENT_CACHE", str(tmp_path / "cache"))
    calib = torch.randn(12, 1, 16, 16, generator=torch.Generator().manual_seed(0))
    groups = [{"name": "mlp.0", "kind": "mlp", "module": "vit.encoder.layer.0.intermediate.dense", "members": []}]
    reuse = tmp_path / "run" / "int8_reuse"
    out, note = deliverable.profile_deliverable(
        one_layer_vit, (1, 16, 16), groups, "openvino", 1e6, True, int8=(reuse, calib)
    )
    assert "error" not in out["forms"]["ov_int8"], note
    assert len(list(reuse.iterdir())) == 1  # the baseline's build, kept for measure_baseline
    assert sizes.count(len(calib)) == 1 and sizes[0] == len(calib), sizes
    assert len(sizes) > 1 and all(n == CALIBRATION_COPIES for n in sizes[1:]), (
        sizes,
        out["planned_on"],
        note,
    )  # the other builds ran
