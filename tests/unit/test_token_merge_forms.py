"""Merged ViT and DeiT as deployable forms: ONNX Runtime and OpenVINO match torch, NNCF keeps the matching float.

Bars as in test_openvino_forms: FP32 forms within the form builders' own tolerance (checked by `build_forms`) and
1e-4 x the largest |logit| on fresh images of another batch size; INT8 forms correlate with torch above 0.9 and
differ by at most half the largest |logit| (random tiny models have nearly tied logits: top-1 agreement is noise).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from helpers.tiny import deit_config, digit_labels, seeded, vit_config

pytest.importorskip("openvino")
pytest.importorskip("nncf")
pytest.importorskip("onnxruntime")

from profiling_agent.graph.cli.main import main  # noqa: E402
from profiling_agent.tools.compression.token_merge import apply_token_merging  # noqa: E402
from profiling_agent.tools.io import read_json, write_json_atomic  # noqa: E402
from profiling_agent.tools.models.artifacts import save_artifact  # noqa: E402
from profiling_agent.tools.models.merged_tokens import MATCH_SCOPE  # noqa: E402
from profiling_agent.tools.runtimes import openvino_forms  # noqa: E402
from profiling_agent.tools.runtimes.forms import build_forms, load_form  # noqa: E402
from profiling_agent.tools.runtimes.openvino_forms import quantized_ops  # noqa: E402
from profiling_agent.tools.runtimes.openvino_model import shared_core  # noqa: E402

FORMS = ["ort_fp32", "ort_dynamic", "ov_fp32", "ov_int8"]
FP32_TOLERANCE = 1e-4
INT8_MIN_CORRELATION, INT8_MAX_DIFF = 0.9, 0.5


def _pixels(n: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(n, 3, 16, 16, generator=torch.Generator().manual_seed(seed))


def _merged(family: str) -> torch.nn.Module:
    """Two layers merging 5 then 3 tokens: a chain of merges (the second layer merges merged tokens), and each
    export, conversion and NNCF quantization takes about two thirds of the time three layers took."""
    import transformers as tf

    if family == "vit":
        model = seeded(tf.ViTForImageClassification, vit_config(num_channels=3, num_hidden_layers=2))
    else:
        model = seeded(tf.DeiTForImageClassificationWithTeacher, deit_config(num_hidden_layers=2))
    apply_token_merging(model, [5, 3])
    return model


@pytest.fixture(scope="module")
def merged_forms(tmp_path_factory):
    """Return `build(family)`: the merged model and its forms by name, built once per family for the module."""
    built: dict[str, tuple[torch.nn.Module, dict]] = {}

    def build(family: str) -> tuple[torch.nn.Module, dict]:
        if family not in built:
            model, x = _merged(family), _pixels(40)
            out = tmp_path_factory.mktemp(f"merged_{family}")
            forms = build_forms(model, x[:24], x[24:], out, forms=FORMS, threads=1)
            built[family] = model, {v.name: v for v in forms}
        return built[family]

    return build


@pytest.mark.parametrize("family", ["vit", "deit"])
def test_every_form_of_a_merged_model_matches_torch(merged_forms, family):
    model, built = merged_forms(family)
    assert all(v.status == "ok" for v in built.values()), {n: v.error for n, v in built.items()}
    fresh = _pixels(5, seed=7)  # other images, another batch size than the export's example
    with torch.inference_mode():
        ref = model(pixel_values=fresh).logits
    scale = ref.abs().max().item()
    for name in FORMS:
        got = load_form(built[name].path, threads=1)(pixel_values=fresh).logits
        if name.endswith("fp32"):
            assert (got - ref).abs().max().item() <= FP32_TOLERANCE * scale, name
        else:
            corr = torch.corrcoef(torch.stack([got.flatten(), ref.flatten()]))[0, 1].item()
            assert corr > INT8_MIN_CORRELATION and (got - ref).abs().max().item() <= INT8_MAX_DIFF * scale, name


def test_nncf_keeps_the_token_matching_in_float(merged_forms, tmp_path, monkeypatch):
    model, built = merged_forms("vit")
    int8 = built["ov_int8"]
    assert int8.status == "ok", int8.error
    ir = shared_core().read_model(str(Path(int8.path) / "openvino_model.xml"))
    assert quantized_ops(ir) and not [n for n in quantized_ops(ir) if MATCH_SCOPE in n]
    quant = read_json(Path(int8.path) / "recipe.json")["quantization"]
    assert quant["ignored_patterns"] == [f".*{openvino_forms.KEEP_FLOAT_SCOPE}.*"]
    # without the hook NNCF quantizes the similarity MatMul (both of its inputs are activations)
    monkeypatch.setattr(openvino_forms, "keep_float_patterns", lambda ov_model: [])
    x = _pixels(24)
    forms = build_forms(model, x[:16], x[16:], tmp_path, forms=["ov_int8"], threads=1)
    plain = next(v for v in forms if v.name == "ov_int8")
    ir = shared_core().read_model(str(Path(plain.path) / "openvino_model.xml"))
    assert [n for n in quantized_ops(ir) if MATCH_SCOPE in n]


def _imagefolder(root: Path, per_class: int = 2) -> Path:
    from PIL import Image

    rng = np.random.default_rng(0)
    for label in range(10):
        (root / str(label)).mkdir(parents=True)
        for i in range(per_class):
            pixels = rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / str(label) / f"{i}.png")
    return root


def test_cli_evaluate_reapplies_the_schedule_and_refuses_a_bad_one(tmp_path, capfd):
    from transformers import ViTForImageClassification, ViTImageProcessor

    model = seeded(ViTForImageClassification, vit_config(num_channels=3, **digit_labels()))
    apply_token_merging(model, [4, 2])
    processor = ViTImageProcessor(size={"height": 16, "width": 16})
    save_artifact(model, tmp_path / "art", processor=processor)
    data = _imagefolder(tmp_path / "images")
    args = ["evaluate", "--model", str(tmp_path / "art"), "--dataset", str(data), "--split", "train"]
    args += ["--subset", "all", "--device", "cpu", "--json", str(tmp_path / "m.json")]
    assert main(args) == 0, capfd.readouterr().err
    assert read_json(tmp_path / "m.json")["params"] > 0
    recipe = read_json(tmp_path / "art" / "recipe.json")
    write_json_atomic(tmp_path / "art" / "recipe.json", {**recipe, "token_schedule": [4, 2, 1]})
    capfd.readouterr()
    assert main(args) == 2
    err = [line for line in capfd.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and "invalid token_schedule: a token schedule needs one r per layer" in err[0], err
