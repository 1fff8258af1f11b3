"""Tests of the ONNX Runtime baseline: export, dynamic QInt8 quantization and evaluation through the torch tools."""

from __future__ import annotations

import pytest
import torch
from torch import nn

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

from profiling_agent.tools.evaluation.latency import measure_latency
from profiling_agent.tools.evaluation.metrics import predict  # noqa: E402
from profiling_agent.tools.runtimes.onnx_runtime import (
    OrtClassifier,
    export_onnx,
    onnx_runtime_baseline,
    quantize_onnx,
)


def _pixels(n, channels=1, size=16, seed=0):
    return torch.randn(n, channels, size, size, generator=torch.Generator().manual_seed(seed))


def _torch_logits(model, x):
    with torch.inference_mode():
        return model(pixel_values=x).logits


def test_vit_export_quantize_and_run(tmp_path, tiny_vit):
    out = onnx_runtime_baseline(tiny_vit, _pixels(2), tmp_path, threads=1)
    assert out["export"]["exporter"] == "torchscript"
    fp32, int8 = out["fp32"], out["int8"]
    assert isinstance(fp32, OrtClassifier) and list(fp32.parameters()) == []
    x = _pixels(7, seed=1)  # another batch size than the traced one: the batch axis is dynamic
    ref = _torch_logits(tiny_vit, x)
    got = fp32(pixel_values=x).logits
    assert got.shape == ref.shape == (7, 10)
    assert torch.allclose(got, ref, atol=1e-4, rtol=1e-4)
    q = int8(pixel_values=x).logits
    err = (q - ref).abs().max().item()
    assert 0 < err < 0.1 * ref.abs().max().item()  # quantized: different, but close
    assert torch.corrcoef(torch.stack([q.flatten(), ref.flatten()]))[0, 1] > 0.98
    assert out["quantize"]["size_bytes"] < out["export"]["size_bytes"]
    assert int8.size_bytes == out["quantize"]["size_bytes"]
    assert fp32(pixel_values=x[:1]).logits.shape == (1, 10)


def test_evaluation_tools_accept_the_session(tmp_path, tiny_vit):
    out = onnx_runtime_baseline(tiny_vit, _pixels(2), tmp_path, threads=1)
    x = _pixels(20, seed=2)
    ref_preds = predict(tiny_vit, x, batch_size=8)
    assert torch.equal(predict(out["fp32"], x, batch_size=8), ref_preds)
    allowed = predict(out["fp32"], x, batch_size=8, allowed_ids=[1, 3])
    assert set(allowed.tolist()) <= {1, 3}
    lat = measure_latency(
        {"torch": tiny_vit, "ort": out["fp32"], "ort_q": out["int8"]}, x, batch_size=4, warmup=1, repeats=2
    )
    assert set(lat) == {"torch", "ort", "ort_q"}
    assert all(row["latency_ms"] > 0 and row["latency_batch_ms"] > 0 for row in lat.values())


def test_latency_times_the_session_alone_through_its_native_call(tmp_path, tiny_vit, monkeypatch):
    out = onnx_runtime_baseline(tiny_vit, _pixels(2), tmp_path, threads=1)
    x = _pixels(3, seed=4)
    (logits,) = out["fp32"].native_call(x)()  # session.run's outputs: the same logits as the module's forward
    assert torch.allclose(torch.from_numpy(logits), out["fp32"](pixel_values=x).logits)
    seen = []

    def no_forward(*args, **kwargs):  # the timed session must not go through the module call
        raise AssertionError("measure_latency called OrtClassifier.forward")

    monkeypatch.setattr(out["fp32"], "forward", no_forward)
    original = out["fp32"].native_call
    monkeypatch.setattr(out["fp32"], "native_call", lambda pixels: seen.append(tuple(pixels.shape)) or original(pixels))
    lat = measure_latency({"ort": out["fp32"]}, x, batch_size=4, warmup=1, repeats=2)
    assert lat["ort"]["latency_ms"] > 0 and sorted(seen) == [(1, 1, 16, 16), (4, 1, 16, 16)]


def test_resnet_export_matches_torch(tmp_path, tiny_resnet):
    exported = export_onnx(tiny_resnet, _pixels(2), tmp_path / "r.onnx")
    x = _pixels(3, seed=3)
    got = OrtClassifier(exported["path"], threads=1)(pixel_values=x).logits
    assert torch.allclose(got, _torch_logits(tiny_resnet, x), atol=1e-4, rtol=1e-4)
    quantized = quantize_onnx(exported["path"], tmp_path / "r.int8.onnx")
    # only the classifier (Gemm) is quantized in a CNN; on a model this small the quantization nodes and scales
    # even make the file larger, so only check the quantized model runs and stays close
    q = OrtClassifier(quantized["path"], threads=1)(pixel_values=x).logits
    ref = _torch_logits(tiny_resnet, x)
    assert q.shape == (3, 10) and (q - ref).abs().max() < 0.1 * ref.abs().max()


class _Broken(nn.Module):
    def forward(self, pixel_values):
        raise RuntimeError("cannot trace me")


def test_export_failure_names_each_exporter(tmp_path):
    with pytest.raises(RuntimeError, match="torchscript.*cannot trace me.*dynamo"):
        export_onnx(_Broken(), _pixels(1), tmp_path / "x.onnx")


@pytest.mark.slow
def test_dynamo_exporter_on_vit(tmp_path, tiny_vit):
    exported = export_onnx(tiny_vit, _pixels(2), tmp_path / "d.onnx", exporter="dynamo")
    assert exported["exporter"] == "dynamo"
    x = _pixels(5, seed=4)
    got = OrtClassifier(exported["path"], threads=1)(pixel_values=x).logits
    assert torch.allclose(got, _torch_logits(tiny_vit, x), atol=1e-4, rtol=1e-4)
