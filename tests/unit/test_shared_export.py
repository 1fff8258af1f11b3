"""The profile step's forms share one ONNX export and one OpenVINO conversion: the same files, built once."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest
import torch

import profiling_agent.tools.runtimes.onnx_runtime as onnx_runtime
from profiling_agent.tools.profiling.backend_profile import ORT_FORMS, profile_backends
from profiling_agent.tools.profiling.shared_export import onnx_export, shared_exports


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _ir_text(path: Path) -> str:
    """An IR's XML with OpenVINO's generated node numbers blanked: two conversions of one file differ only there."""
    return re.sub(r"_\d+", "_N", path.read_text())


def _counting_exports(monkeypatch) -> list[str]:
    calls: list[str] = []
    real = onnx_runtime.export_onnx

    def counted(model, example, path, **kwargs):
        calls.append(str(path))
        return real(model, example, path, **kwargs)

    monkeypatch.setattr(onnx_runtime, "export_onnx", counted)
    return calls


def test_the_profile_forms_export_the_model_once(one_layer_vit, monkeypatch, tmp_path):
    calls = _counting_exports(monkeypatch)
    built: dict[str, Path] = {}
    out = profile_backends(
        one_layer_vit, torch.randn(1, 1, 16, 16), [], ORT_FORMS, folder=tmp_path, built=built, repeats=1
    )
    assert all("error" not in row for row in out["forms"].values()), out["forms"]
    assert len(calls) == 1  # ort_dynamic quantizes ort_fp32's export instead of exporting again
    assert built["ort_dynamic"].is_file() and built["ort_fp32"].is_file()


def test_a_shared_export_is_the_bytes_a_fresh_export_writes(one_layer_vit, tmp_path):
    example = torch.randn(1, 1, 16, 16)
    fresh = onnx_export(one_layer_vit, example, tmp_path / "fresh")  # outside a block: its own export
    with shared_exports():
        first = onnx_export(one_layer_vit, example, tmp_path / "a")
        again = onnx_export(one_layer_vit, example, tmp_path / "b")
        other_shape = onnx_export(one_layer_vit, torch.randn(2, 1, 16, 16), tmp_path / "c")
    assert again == first and not (tmp_path / "b").exists()
    assert other_shape != first  # another input shape is another export
    assert _digest(first) == _digest(fresh)
    outside = onnx_export(one_layer_vit, example, tmp_path / "d")  # the block closed: exports again
    assert outside == tmp_path / "d" / "model.onnx"


def test_openvino_profile_forms_convert_once_into_the_same_ir(one_layer_vit, monkeypatch, tmp_path):
    pytest.importorskip("nncf")
    from profiling_agent.tools.profiling.openvino_profile import OV_PROFILE_FORMS

    example = torch.randn(1, 1, 16, 16)
    before: dict[str, Path] = {}
    for form in OV_PROFILE_FORMS:  # each form on its own, as every build was before the shared block
        before[form.name] = form.build(one_layer_vit, example, tmp_path / "before" / form.name)
    calls = _counting_exports(monkeypatch)
    built: dict[str, Path] = {}
    profile_backends(one_layer_vit, example, [], OV_PROFILE_FORMS, folder=tmp_path / "after", built=built, repeats=1)
    assert len(calls) == 1
    for name, path in before.items():  # the same weights and graph; node numbers come from a process-wide counter
        assert _ir_text(built[name]) == _ir_text(path), name
        assert _digest(built[name].with_suffix(".bin")) == _digest(path.with_suffix(".bin")), name
