"""Backend variants per family: ONNX export, ORT dynamic QInt8 and static int8 (QDQ), checked against torch logits.

Tolerances: the FP32 export matches torch within 1e-4 x the largest |logit|; a quantized variant's logits correlate
with torch's above 0.9 and differ by at most half the largest |logit| (random tiny models have small, nearly tied
logits, so top-1 agreement is not a fair bar for them).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers.tiny import family_model as _model
from helpers.tiny import random_pixels as _pixels

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

from profiling_agent.tools.io import read_json  # noqa: E402
from profiling_agent.tools.runtimes import onnx_forms  # noqa: E402
from profiling_agent.tools.runtimes.forms import form_source  # noqa: E402
from profiling_agent.tools.runtimes.onnx_forms import BackendSettings, FormFiles, build_ort_variants  # noqa: E402
from profiling_agent.tools.runtimes.onnx_model import load_onnx_folder  # noqa: E402


@pytest.mark.parametrize("family", ["vit", "deit", "swin", "resnet"])
def test_round_trip_per_family(tmp_path, family, monkeypatch):
    cwd = tmp_path / "cwd"  # ONNX Runtime's shape inference dumps files into the cwd when it fails: none may stay
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    model, size = _model(family, layers=1)
    x = _pixels(48, size)
    settings = BackendSettings(static_on_transformers=True)  # static QDQ is skipped for transformers by default
    variants = build_ort_variants(
        model, x[:24], x[24:], tmp_path / "out", threads=1, files=FormFiles(extra={"params": 123}), settings=settings
    )
    assert [v.name for v in variants] == ["ort_fp32", "ort_dynamic", "ort_static"]
    assert all(v.status == "ok" for v in variants), [v.error for v in variants]
    fresh = _pixels(5, size, seed=7)  # other images and another batch size than the check and the trace
    with torch.inference_mode():
        ref = model(pixel_values=fresh).logits
    scale = ref.abs().max().item()
    for v in variants:
        assert form_source(v.path) == "onnx"
        loaded = load_onnx_folder(v.path, threads=1)
        got = loaded(pixel_values=fresh).logits
        assert got.shape == ref.shape
        if v.method == "fp32":
            assert (got - ref).abs().max().item() <= 1e-4 * scale
            assert v.logit_agreement == 100.0
        else:
            assert (got - ref).abs().max().item() <= 0.5 * scale
            assert torch.corrcoef(torch.stack([got.flatten(), ref.flatten()]))[0, 1] > 0.9
        recipe = read_json(f"{v.path}/recipe.json")
        assert recipe["method"] == v.method and recipe["extra"] == {"params": 123}
        assert recipe["export"]["exporter"] == "torchscript" and recipe["export"]["opset"] == 17
        assert recipe["check"]["max_abs_diff"] == v.max_abs_diff
        assert loaded.config.num_labels == 10
    static = read_json(f"{variants[2].path}/recipe.json")["quantization"]
    assert static["format"] == "QDQ" and static["per_channel"] is True
    assert static["calibration"] == {"method": "minmax", "samples": 24, "batch": 8}
    assert "Conv" in static["op_types"]
    assert not list(tmp_path.rglob("augmented_model*.onnx")) and not list(tmp_path.rglob("pre_process.onnx"))
    assert list(cwd.iterdir()) == []
    assert static["pre_process"].startswith("quant_pre_process")


def test_static_int8_quantizes_convolutions(tmp_path):
    import onnx

    model, size = _model("resnet")
    x = _pixels(24, size)
    variants = {v.method: v for v in build_ort_variants(model, x[:16], x[16:], tmp_path, threads=1)}
    ops = {m: {n.op_type for n in onnx.load(variants[m].path + "/model.onnx").graph.node} for m in variants}
    assert "QuantizeLinear" in ops["static"] and "Conv" in ops["static"]  # QDQ around the convolutions
    assert "ConvInteger" not in ops["dynamic"] and "DynamicQuantizeLinear" in ops["dynamic"]  # Gemm only
    static = onnx.load(variants["static"].path + "/model.onnx")
    int8 = [t.name for t in static.graph.initializer if t.data_type == onnx.TensorProto.INT8]
    assert any("convolution" in name or "conv" in name.lower() for name in int8), int8[:5]


def test_failed_export_marks_every_variant_failed(tmp_path, monkeypatch):
    def refuse(*args, **kwargs):  # what export_onnx raises when neither exporter works (see test_onnx_baseline)
        raise RuntimeError("ONNX export failed: torchscript: cannot trace me; dynamo: cannot trace me")

    monkeypatch.setattr(onnx_forms, "export_onnx", refuse)
    model, size = _model("resnet")
    x = _pixels(8, size)
    variants = build_ort_variants(model, x[:4], x[4:], tmp_path, threads=1)
    assert [v.status for v in variants] == ["failed"] * 3
    assert all("ONNX export failed" in v.error and "cannot trace me" in v.error for v in variants)


def test_fp32_mismatch_fails_all_variants(tmp_path):
    model, size = _model("resnet")
    x = _pixels(16, size)
    settings = BackendSettings(fp32_tolerance=-1.0)  # any difference, even 0, counts as a mismatch
    variants = build_ort_variants(model, x[:8], x[8:], tmp_path, threads=1, settings=settings)
    assert variants[0].status == "failed" and "logits differ from torch" in variants[0].error
    assert all(v.status == "failed" and "FP32 export is wrong" in v.error for v in variants[1:])
    assert all(v.model is None for v in variants)


def test_missing_onnxruntime_is_a_reason_not_a_crash(tmp_path, monkeypatch):
    monkeypatch.setattr(onnx_forms, "onnxruntime_missing", lambda: "ONNX Runtime is unavailable (test)")
    model, size = _model("resnet")
    x = _pixels(8, size)
    variants = build_ort_variants(model, x[:4], x[4:], tmp_path)
    assert [(v.status, v.error) for v in variants] == [("failed", "ONNX Runtime is unavailable (test)")] * 3
    assert not any(tmp_path.iterdir())


def test_static_without_calibration_images_fails_alone(tmp_path):
    model, size = _model("resnet")
    x = _pixels(8, size)
    variants = {v.method: v for v in build_ort_variants(model, x[:0], x, tmp_path, threads=1)}
    assert variants["fp32"].status == variants["dynamic"].status == "ok"
    assert variants["static"].status == "failed" and "calibration" in variants["static"].error


@pytest.mark.parametrize("family", ["vit", "swin"])
def test_static_is_skipped_for_transformers_with_the_reason(tmp_path, family):
    model, size = _model(family, layers=1)
    x = _pixels(8, size)
    variants = {v.method: v for v in build_ort_variants(model, x[:4], x[4:], tmp_path, threads=1)}
    assert variants["fp32"].status == variants["dynamic"].status == "ok"
    assert variants["static"].status == "skipped" and "slower than ort_dynamic" in variants["static"].error
    assert not (tmp_path / "ort_static").exists()


def test_only_requested_methods_are_built(tmp_path):
    model, size = _model("vit", layers=1)
    x = _pixels(8, size)
    settings = BackendSettings(methods=("dynamic",))
    variants = build_ort_variants(model, x[:4], x[4:], tmp_path, threads=1, settings=settings)
    assert [v.name for v in variants] == ["ort_dynamic"] and variants[0].status == "ok"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ort_dynamic"]


def test_symbolic_shape_failure_falls_back_and_leaves_the_cwd_clean(tmp_path, monkeypatch):
    import onnxruntime.quantization.shape_inference as shape_inference

    real = shape_inference.quant_pre_process

    def like_ort(src, dst, *args, skip_symbolic_shape=False, **kwargs):
        if not skip_symbolic_shape:  # what onnxruntime does when symbolic inference is incomplete
            Path("sym_shape_infer_temp.onnx").write_bytes(b"x")
            raise Exception("Incomplete symbolic shape inference")
        return real(src, dst, *args, skip_symbolic_shape=True, **kwargs)

    monkeypatch.setattr(shape_inference, "quant_pre_process", like_ort)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    model, size = _model("resnet")
    x = _pixels(16, size)
    settings = BackendSettings(methods=("static",))
    (variant,) = build_ort_variants(model, x[:8], x[8:], tmp_path / "out", threads=1, settings=settings)
    assert variant.status == "ok", variant.error
    assert variant.recipe["quantization"]["pre_process"].startswith("quant_pre_process without symbolic")
    assert list(cwd.iterdir()) == []
