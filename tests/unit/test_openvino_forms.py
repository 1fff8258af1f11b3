"""OpenVINO forms per family: FP32 equal to torch, NNCF INT8 close to it, bf16 skipped with a reason, IR alone.

Tolerances: ov_fp32 (f32 precision hint) matches torch within 1e-4 x the largest |logit| on images it was not
checked on; an INT8 form's logits correlate with torch's above 0.9 and differ by at most half the largest |logit|
(random tiny models have small, nearly tied logits, so top-1 agreement is not a fair bar for them).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("openvino")
pytest.importorskip("nncf")
pytest.importorskip("onnxruntime")

from helpers.tiny import family_model as _model
from helpers.tiny import random_pixels as _pixels  # noqa: E402

from profiling_agent.tools.io import read_json  # noqa: E402
from profiling_agent.tools.runtimes import openvino_forms  # noqa: E402
from profiling_agent.tools.runtimes.forms import build_forms, form_source, round_forms  # noqa: E402
from profiling_agent.tools.runtimes.openvino_model import (  # noqa: E402
    OvClassifier,
    compile_config,
    load_openvino_folder,
)

FP32_TOLERANCE = 1e-4  # x the largest |logit|
INT8_MIN_CORRELATION, INT8_MAX_DIFF = 0.9, 0.5  # correlation with torch; max |diff| x the largest |logit|


@pytest.fixture(scope="module")
def family_forms(tmp_path_factory):
    """Return `build(family)`: the tiny model, its image size and its FP32 and INT8 forms, built once per family.

    ViT and DeiT have one encoder layer (every op kind of the family, each build in about half the time). The INT8
    form is calibrated on 24 images and both forms are checked on 16 (the builders' own check).
    """
    built: dict[str, tuple[torch.nn.Module, int, list]] = {}

    def build(family: str) -> tuple[torch.nn.Module, int, list]:
        if family not in built:
            model, size = _model(family, layers=1)
            x = _pixels(40, size)
            out = tmp_path_factory.mktemp(f"forms_{family}")
            built[family] = (
                model,
                size,
                build_forms(model, x[:24], x[24:], out, forms=["ov_fp32", "ov_int8"], threads=1),
            )
        return built[family]

    return build


@pytest.mark.parametrize("family", ["vit", "deit", "swin", "resnet"])
def test_fp32_and_int8_per_family(family_forms, family):
    model, size, forms = family_forms(family)
    by_name = {v.name: v for v in forms}
    assert list(by_name) == ["ort_fp32", "ov_fp32", "ov_int8"]  # the FP32 ONNX file is what OpenVINO converts
    assert all(v.status == "ok" for v in forms), [v.error for v in forms]
    fresh = _pixels(5, size, seed=7)  # other images and another batch size than the calibration and the check
    with torch.inference_mode():
        ref = model(pixel_values=fresh).logits
    scale = ref.abs().max().item()
    fp32 = load_openvino_folder(by_name["ov_fp32"].path, threads=1)
    assert fp32.settings["INFERENCE_PRECISION_HINT"] == "f32" and fp32.settings["NUM_STREAMS"] == "1"
    assert (fp32(pixel_values=fresh).logits - ref).abs().max().item() <= FP32_TOLERANCE * scale
    int8 = load_openvino_folder(by_name["ov_int8"].path, threads=1)
    got = int8(pixel_values=fresh).logits
    corr = torch.corrcoef(torch.stack([got.flatten(), ref.flatten()]))[0, 1].item()
    assert corr > INT8_MIN_CORRELATION and (got - ref).abs().max().item() <= INT8_MAX_DIFF * scale
    recipe = read_json(Path(by_name["ov_int8"].path) / "recipe.json")
    quant = recipe["quantization"]
    assert quant["method"] == "nncf_ptq" and quant["calibration"]["samples"] == 24 and quant["quantized_ops"] > 0
    assert quant["model_type"] == ("default (CNN)" if family == "resnet" else "transformer")
    assert recipe["runtime"]["precision_hint"] == "default" and recipe["check"]["images"] == 16
    assert recipe["versions"]["openvino"] and recipe["versions"]["nncf"]
    assert (Path(by_name["ov_int8"].path) / "openvino_model.bin").stat().st_size < by_name["ov_fp32"].size_bytes


def test_bf16_is_skipped_with_the_reason_where_the_cpu_has_none(tmp_path, monkeypatch):
    monkeypatch.setattr(openvino_forms, "bf16_unsupported", lambda: "this CPU has no native bf16 (test)")
    model, size = _model("vit", layers=1)
    x = _pixels(12, size)
    forms = {v.name: v for v in build_forms(model, x[:4], x[4:], tmp_path, forms=["ov_fp32", "ov_bf16"], threads=1)}
    assert forms["ov_bf16"].status == "skipped" and "no native bf16" in forms["ov_bf16"].error
    assert not (tmp_path / "ov_bf16").exists() and forms["ov_fp32"].status == "ok"


def test_a_form_that_fails_is_marked_failed_and_the_others_go_on(tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("NNCF could not collect statistics")

    monkeypatch.setattr(openvino_forms, "quantize_int8", broken)
    model, size = _model("resnet")
    x = _pixels(12, size)
    forms = {v.name: v for v in build_forms(model, x[:4], x[4:], tmp_path, forms=["ov_fp32", "ov_int8"], threads=1)}
    assert forms["ov_int8"].status == "failed" and "could not collect statistics" in forms["ov_int8"].error
    assert forms["ov_fp32"].status == "ok" and not (tmp_path / "ov_int8").exists()


def test_the_ir_folder_runs_with_openvino_alone(family_forms, tmp_path):
    _, size, forms = family_forms("resnet")
    (int8,) = [v for v in forms if v.name == "ov_int8"]
    x = _pixels(3, size, seed=5)
    assert form_source(int8.path) == "openvino"
    expected = load_openvino_folder(int8.path, threads=1)(pixel_values=x[:3]).logits
    import numpy as np

    np.save(tmp_path / "x.npy", x[:3].numpy())
    code = (
        "import sys, numpy as np, openvino as ov\n"
        "core = ov.Core()\n"
        f"model = core.read_model({str(Path(int8.path) / 'openvino_model.xml')!r})\n"
        "out = core.compile_model(model, 'CPU')(np.load(sys.argv[1]))[0]\n"
        "assert not any(m.startswith(('profiling_agent', 'torch')) for m in sys.modules)\n"
        "np.save(sys.argv[2], out)\n"
    )
    subprocess.run([sys.executable, "-I", "-c", code, str(tmp_path / "x.npy"), str(tmp_path / "y.npy")], check=True)
    got = torch.from_numpy(np.load(tmp_path / "y.npy"))
    assert got.shape == expected.shape  # the CPU's default precision may differ from the recorded hint's
    assert torch.equal(got.argmax(-1), expected.argmax(-1)) or (got - expected).abs().max() < 0.05


def test_compile_config_is_fair_for_side_by_side_timing():
    config = compile_config("f32", 3)
    assert config["NUM_STREAMS"] == "1" and config["ENABLE_CPU_PINNING"] == "NO"
    assert config["INFERENCE_NUM_THREADS"] == "3" and config["INFERENCE_PRECISION_HINT"] == "f32"
    assert "INFERENCE_PRECISION_HINT" not in compile_config("default", 1)  # INT8: the rest at the CPU's best


def test_rounds_build_the_unpruned_models_fastest_forms_within_budget():
    base = [
        {"name": "torch_fp32", "status": "ok", "accuracy": 90.0, "latency_ms": 10.0},
        {"name": "ort_fp32", "status": "ok", "accuracy": 90.0, "latency_ms": 5.0},
        {"name": "ort_dynamic", "status": "ok", "accuracy": 89.5, "latency_ms": 3.0},
        {"name": "ort_static", "status": "skipped"},
        {"name": "ov_fp32", "status": "ok", "accuracy": 90.0, "latency_ms": 4.0},
        {"name": "ov_bf16", "status": "ok", "accuracy": 90.0, "latency_ms": 4.4},
        {"name": "ov_int8", "status": "ok", "accuracy": 80.0, "latency_ms": 1.0},  # outside a 2 pp budget
    ]
    assert round_forms(base, 90.0, 2.0) == ["ort_fp32", "ort_dynamic", "ov_fp32", "ov_bf16"]  # 2 fastest + <=1.5x
    assert "ov_int8" in round_forms(base, 90.0, 10.0)
    assert len(round_forms([], 90.0, 2.0)) == 6  # no baseline forms measured: every form


def test_ov_classifier_runs_any_batch(family_forms):
    _, size, forms = family_forms("deit")
    (fp32,) = [v for v in forms if v.name == "ov_fp32"]
    ov = OvClassifier(Path(fp32.path) / "openvino_model.xml", "f32", threads=1)
    for n in (1, 5):
        assert ov(pixel_values=_pixels(n, size)).logits.shape == (n, 10)
    x = _pixels(3, size)
    native = next(iter(ov.native_call(x)().values()))  # the infer request alone: what latency times
    assert torch.allclose(torch.from_numpy(native.copy()), ov(pixel_values=x).logits)
    single, batch = ov.native_call(_pixels(1, size)), ov.native_call(_pixels(5, size))
    for _ in range(2):  # timed in turns, as measure_latency does: each input keeps its own request
        assert next(iter(single().values())).shape == (1, 10) and next(iter(batch().values())).shape == (5, 10)
    # an IR without shape-dependent ops is timed on its dynamic compilation (a static one runs alike)
    assert set(ov.static) == {(3, 3, size, size), (1, 3, size, size), (5, 3, size, size)}
    assert all(c is ov.compiled for c in ov.static.values())


def test_a_merged_ir_is_timed_compiled_for_the_static_shape(tmp_path):
    from profiling_agent.tools.compression.token_merge import apply_token_merging

    model, size = _model("deit", layers=1)
    apply_token_merging(model, 2)
    x = _pixels(4, size)
    (fp32,) = [
        v for v in build_forms(model, x[:2], x[2:], tmp_path, forms=["ov_fp32"], threads=1) if v.name == "ov_fp32"
    ]
    ov = OvClassifier(Path(fp32.path) / "openvino_model.xml", "f32", threads=1)
    native = next(iter(ov.native_call(x[:1])().values()))  # what is timed: the IR compiled for batch 1
    assert not ov.static[(1, 3, size, size)].inputs[0].get_partial_shape().is_dynamic
    assert ov.compiled.inputs[0].get_partial_shape().is_dynamic  # forward keeps the dynamic batch
    assert torch.allclose(torch.from_numpy(native.copy()), ov(pixel_values=x[:1]).logits, atol=1e-4)


def test_without_openvino_its_forms_fail_with_the_reason_and_rounds_skip_them(tmp_path, monkeypatch):
    monkeypatch.setattr(openvino_forms, "openvino_missing", lambda: "OpenVINO is unavailable (ImportError: test)")
    model, size = _model("resnet")
    x = _pixels(12, size)
    built = build_forms(model, x[:4], x[4:], tmp_path, threads=1)
    ov = [v for v in built if v.name.startswith("ov_")]
    assert [v.status for v in ov] == ["failed"] * 3 and all("OpenVINO is unavailable" in v.error for v in ov)
    assert all(v.status == "ok" for v in built if v.name.startswith("ort_"))  # the run goes on with ONNX Runtime
    records = [{"name": v.name, "status": v.status, "accuracy": 90.0, "latency_ms": 1.0} for v in built]
    assert not [f for f in round_forms(records, 90.0, 2.0) if f.startswith("ov_")]  # said once, not retried


def test_the_same_model_built_twice_in_one_process_writes_the_same_ir(family_forms, tmp_path):
    """OpenVINO counts the names it gives over the whole process; the forms' IRs must not depend on it (issue 49)."""
    model, size, first = family_forms("resnet")  # its FP32 IR has constants folded from counted ops (Range, Concat)
    x = _pixels(40, size)  # the same images as the first build
    second = build_forms(model, x[:24], x[24:], tmp_path, forms=["ov_fp32", "ov_int8"], threads=1)
    built = [first, second]
    assert all(v.status == "ok" for forms in built for v in forms), [v.error for forms in built for v in forms]
    for form in ("ov_fp32", "ov_int8"):
        for name in ("openvino_model.xml", "openvino_model.bin"):
            one, two = (next(Path(v.path) for v in forms if v.name == form) / name for forms in built)
            assert one.read_bytes() == two.read_bytes(), f"{form}/{name} differs"


def test_counted_names_are_renamed_by_order_whatever_suffix_made_them_unique():
    """`Constant_256` and the de-duplicated `Constant_256_1` are counted names; the exporter's names stay.

    The digits ViT's INT8 IR had a `Constant_256_1` in one run and a plain counted name in the next (the e2e
    same-seed test, 2026-11-28).
    """
    import numpy as np
    import openvino as ov
    import openvino.opset13 as ops

    from profiling_agent.tools.runtimes.openvino_forms import stable_names

    def model(first: str, second: str):
        x = ops.parameter([1, 4], np.float32, name="pixel_values")
        one, two = ops.constant(np.ones((1, 4), np.float32)), ops.constant(np.full((1, 4), 2.0, np.float32))
        one.set_friendly_name(first)
        two.set_friendly_name(second)
        add = ops.add(ops.add(x, one), two)
        add.set_friendly_name("/classifier/Add")
        return ov.Model([add], [x])

    names = [[op.get_friendly_name() for op in stable_names(m, "s").get_ordered_ops()] for m in (
        model("Constant_256_1", "Constant_9"), model("Constant_17", "Constant_4_2"))]  # fmt: skip
    assert names[0] == names[1]
    assert "/classifier/Add" in names[0] and not any(n.startswith("Constant_") and n[9:].isdigit() for n in names[0])
