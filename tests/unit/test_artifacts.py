"""Tests of model artifacts: bit-identical round trips (pruned, quantized, several families) and errors."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest
import torch
from helpers.tiny import deit_config, seeded, swin_config, vit_config
from torch import nn

from profiling_agent.state import QuantEntry
from profiling_agent.tools.compression.quantization import quantize_model
from profiling_agent.tools.io import sha256_path
from profiling_agent.tools.models.artifact_load import load_artifact
from profiling_agent.tools.models.artifacts import ArtifactError, is_artifact, save_artifact
from profiling_agent.tools.models.dynamic_quant import quiet_ao_quantization
from profiling_agent.tools.models.sizes import count_params
from profiling_agent.tools.runtimes.forward import batched_logits

# ---------------------------------------------------------------- helpers


def _images(channels: int = 1, seed: int = 1) -> torch.Tensor:
    return torch.randn(3, channels, 16, 16, generator=torch.Generator().manual_seed(seed))


def _keep(n: int, drop: list[int]) -> torch.Tensor:
    return torch.tensor([i for i in range(n) if i not in drop])


def _slice_linear(linear: nn.Linear, rows: torch.Tensor | None = None, cols: torch.Tensor | None = None) -> None:
    weight, bias = linear.weight.data, linear.bias.data
    if rows is not None:
        weight, bias = weight[rows], bias[rows]
    if cols is not None:
        weight = weight[:, cols]
    linear.weight = nn.Parameter(weight.clone())
    linear.bias = nn.Parameter(bias.clone())
    linear.out_features, linear.in_features = weight.shape


def _slice_conv_out(conv: nn.Conv2d, keep: torch.Tensor) -> None:
    conv.weight = nn.Parameter(conv.weight.data[keep].clone())
    conv.out_channels = len(keep)


def _slice_conv_in(conv: nn.Conv2d, keep: torch.Tensor) -> None:
    conv.weight = nn.Parameter(conv.weight.data[:, keep].clone())
    conv.in_channels = len(keep)


def _slice_bn(bn: nn.BatchNorm2d, keep: torch.Tensor) -> None:
    bn.weight = nn.Parameter(bn.weight.data[keep].clone())
    bn.bias = nn.Parameter(bn.bias.data[keep].clone())
    bn.running_mean = bn.running_mean[keep].clone()
    bn.running_var = bn.running_var[keep].clone()
    bn.num_features = len(keep)


def _prune_vit(model: nn.Module) -> dict:
    """Drop 24 of layer 0's 64 MLP channels and head 1 of its 4 attention heads; return the attrs set."""
    mlp = model.vit.layers[0].mlp
    keep = _keep(64, list(range(0, 48, 2)))
    _slice_linear(mlp.fc1, rows=keep)
    _slice_linear(mlp.fc2, cols=keep)
    attention = model.vit.layers[0].attention
    head_dim = attention.head_dim
    keep = _keep(32, list(range(head_dim, 2 * head_dim)))
    for proj in (attention.q_proj, attention.k_proj, attention.v_proj):
        _slice_linear(proj, rows=keep)
    _slice_linear(attention.o_proj, cols=keep)
    attention.num_attention_heads = 3
    return {"vit.layers.0.attention": {"num_attention_heads": 3}}


def _prune_resnet(model: nn.Module) -> None:
    """Drop 3 of the 3x3 conv's 8 channels in the second bottleneck of stage 1 (plus its BN, next conv's inputs)."""
    block = model.resnet.encoder.stages[1].layers[1].layer
    width = block[1].convolution.out_channels
    keep = _keep(width, [0, 3, 5])
    _slice_conv_out(block[1].convolution, keep)
    _slice_bn(block[1].normalization, keep)
    _slice_conv_in(block[2].convolution, keep)


def _vit_processor():
    from transformers.models.vit.image_processing_pil_vit import ViTImageProcessorPil

    return ViTImageProcessorPil(size={"height": 16, "width": 16}, image_mean=[0.5], image_std=[0.5])


def _round_trip(model: nn.Module, folder, x: torch.Tensor, **kwargs):
    want = batched_logits(model, x)
    ref = save_artifact(model, folder, **kwargs)
    loaded = load_artifact(folder)
    assert not loaded.model.training
    assert torch.equal(batched_logits(loaded.model, x), want)
    return ref, loaded


# ---------------------------------------------------------------- round trips


def test_fp32_vit_round_trip_with_processor(tiny_vit, tmp_path):
    processor = _vit_processor()
    extra = {"accuracy": 91.5, "plan": {"pruning": []}}
    ref, loaded = _round_trip(tiny_vit, tmp_path / "vit", _images(), processor=processor, extra=extra)
    folder = tmp_path / "vit"
    assert ref == {
        "path": str(folder),
        "sha256": sha256_path(folder),
        "size_bytes": (folder / "model.safetensors").stat().st_size,
        "params": sum(p.numel() for p in tiny_vit.parameters()),
    }
    assert {"model.safetensors", "recipe.json", "config.json", "preprocessor_config.json"} <= {
        p.name for p in folder.iterdir()
    }
    assert [p.name for p in tmp_path.iterdir()] == ["vit"]  # no temp folders left behind
    recipe = json.loads((folder / "recipe.json").read_text())
    assert recipe["architecture"] == "ViTForImageClassification"
    assert recipe["extra"] == extra and recipe["quantized"] == {} and recipe["attrs"] == {}
    assert set(recipe["versions"]) >= {"torch", "transformers", "profiling_agent"}
    assert recipe["tensors"]["vit.layers.0.mlp.fc1.weight"] == {"shape": [64, 32], "dtype": "float32"}
    assert loaded.recipe == recipe
    assert loaded.processor.to_dict() == processor.to_dict()
    image = np.random.default_rng(0).integers(0, 255, size=(20, 24, 1), dtype=np.uint8)
    want = processor(image, return_tensors="pt", input_data_format="channels_last")["pixel_values"]
    got = loaded.processor(image, return_tensors="pt", input_data_format="channels_last")["pixel_values"]
    assert torch.equal(got, want)


def test_fp32_resnet_round_trip(tiny_resnet, tmp_path):
    _, loaded = _round_trip(tiny_resnet, tmp_path / "resnet", _images())
    assert loaded.processor is None
    # batch-norm statistics come back too
    for (name, want), (_, got) in zip(tiny_resnet.named_buffers(), loaded.model.named_buffers(), strict=True):
        assert torch.equal(got, want), name


def test_pruned_vit_round_trip_restores_shapes_and_attrs(tiny_vit, tmp_path):
    attrs = _prune_vit(tiny_vit)
    ref, loaded = _round_trip(tiny_vit, tmp_path / "vit", _images(), attrs=attrs)
    model = loaded.model
    assert model.vit.layers[0].mlp.fc1.out_features == 40 and model.vit.layers[0].mlp.fc2.in_features == 40
    assert model.vit.layers[0].mlp.fc1.weight.shape == (40, 32)
    attention = model.vit.layers[0].attention
    assert attention.num_attention_heads == 3 and attention.q_proj.out_features == 24
    assert attention.o_proj.weight.shape == (32, 24)
    assert model.vit.layers[1].attention.num_attention_heads == 4  # untouched layer keeps its size
    assert ref["params"] == sum(p.numel() for p in tiny_vit.parameters()) == count_params(model)


def test_pruned_resnet_round_trip(tiny_resnet, tmp_path):
    _prune_resnet(tiny_resnet)
    _, loaded = _round_trip(tiny_resnet, tmp_path / "resnet", _images())
    block = loaded.model.resnet.encoder.stages[1].layers[1].layer
    assert block[1].convolution.out_channels == 5 and block[1].normalization.num_features == 5
    assert block[2].convolution.in_channels == 5 and block[2].convolution.weight.shape == (32, 5, 1, 1)
    assert block[1].normalization.running_mean.shape == (5,)


@pytest.mark.parametrize("dtype", ["qint8", "float16"])
def test_pruned_quantized_vit_round_trip(tiny_vit, tmp_path, dtype):
    attrs = _prune_vit(tiny_vit)
    quantized, done = quantize_model(tiny_vit, [QuantEntry(layer="all", dtype=dtype)], protected=("classifier",))
    assert len(done) == 12
    ref, loaded = _round_trip(quantized, tmp_path / dtype, _images(), attrs=attrs, quantized=done)
    assert loaded.recipe["quantized"] == done
    fc1 = loaded.model.get_submodule("vit.layers.0.mlp.fc1")
    assert (fc1.in_features, fc1.out_features) == (32, 40)
    assert fc1._packed_params.dtype == (torch.qint8 if dtype == "qint8" else torch.float16)
    assert type(loaded.model.classifier) is nn.Linear
    assert ref["params"] == count_params(loaded.model) == sum(p.numel() for p in tiny_vit.parameters())


def test_per_channel_qint8_round_trip(tiny_vit, tmp_path):
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    with quiet_ao_quantization():
        quantized = quantize_dynamic(tiny_vit, {"vit.layers.1.mlp.fc2": per_channel_dynamic_qconfig}, inplace=False)
    _, loaded = _round_trip(quantized, tmp_path / "pc", _images(), quantized={"vit.layers.1.mlp.fc2": "qint8"})
    weight = loaded.model.get_submodule("vit.layers.1.mlp.fc2").weight()
    assert weight.qscheme() == torch.per_channel_affine
    assert torch.equal(weight.int_repr(), quantized.get_submodule("vit.layers.1.mlp.fc2").weight().int_repr())


def test_pruned_quantized_resnet_round_trip(tiny_resnet, tmp_path):
    _prune_resnet(tiny_resnet)
    quantized, done = quantize_model(tiny_resnet, [QuantEntry(layer="all")])
    assert done == {"classifier.1": "qint8"}
    _round_trip(quantized, tmp_path / "resnet", _images(), quantized=done)


def test_qint8_artifact_is_much_smaller(tmp_path):
    # a wider ViT so Linear weights dominate the file, as in real models
    from transformers import ViTForImageClassification

    model = seeded(ViTForImageClassification, vit_config(hidden_size=128, intermediate_size=512))
    fp32 = save_artifact(model, tmp_path / "fp32")
    quantized, _ = quantize_model(model, [QuantEntry(layer="all")])
    qint8 = save_artifact(quantized, tmp_path / "qint8")
    assert qint8["size_bytes"] < 0.32 * fp32["size_bytes"]
    assert qint8["params"] == fp32["params"]


def test_deit_with_teacher_round_trip(tmp_path):
    from transformers import DeiTForImageClassificationWithTeacher

    model = seeded(DeiTForImageClassificationWithTeacher, deit_config())
    _, loaded = _round_trip(model, tmp_path / "deit", _images(channels=3))
    assert type(loaded.model) is DeiTForImageClassificationWithTeacher
    assert loaded.recipe["architecture"] == "DeiTForImageClassificationWithTeacher"


def test_swin_round_trip(tmp_path):
    from transformers import SwinForImageClassification

    model = seeded(SwinForImageClassification, swin_config())
    with torch.no_grad():  # the table is zero-initialised: make it matter
        for module in model.modules():
            if hasattr(module, "relative_position_bias_table"):
                module.relative_position_bias_table.normal_()
    _, loaded = _round_trip(model, tmp_path / "swin", _images(channels=3))
    assert type(loaded.model) is SwinForImageClassification


# ---------------------------------------------------------------- safety and errors


def test_loading_never_unpickles(tiny_vit, tmp_path, monkeypatch):
    attrs = _prune_vit(tiny_vit)
    quantized, done = quantize_model(tiny_vit, [QuantEntry(layer="mlp")])
    save_artifact(quantized, tmp_path / "a", attrs=attrs, processor=_vit_processor())

    def refuse(*args, **kwargs):
        raise AssertionError("unpickling is not allowed")

    monkeypatch.setattr(torch, "load", refuse)
    monkeypatch.setattr(pickle, "load", refuse)
    monkeypatch.setattr(pickle, "loads", refuse)
    loaded = load_artifact(tmp_path / "a")
    assert torch.equal(batched_logits(loaded.model, _images()), batched_logits(quantized, _images()))


def test_saving_again_replaces_the_folder(tiny_vit, tmp_path):
    folder = tmp_path / "a"
    save_artifact(tiny_vit, folder, processor=_vit_processor())
    ref = save_artifact(tiny_vit, folder)
    assert not (folder / "preprocessor_config.json").exists()
    assert ref["sha256"] == sha256_path(folder)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a"]


def test_quantized_argument_must_match_the_model(tiny_vit, tmp_path):
    with pytest.raises(ValueError, match="disagrees"):
        save_artifact(tiny_vit, tmp_path / "a", quantized={"classifier": "qint8"})
    assert not (tmp_path / "a").exists()


@pytest.fixture
def saved(tiny_vit, tmp_path):
    folder = tmp_path / "a"
    save_artifact(tiny_vit, folder)
    return folder


def _assert_artifact_error(folder, match: str) -> None:
    with pytest.raises(ArtifactError, match=match) as info:
        load_artifact(folder)
    assert "\n" not in str(info.value)


def test_is_artifact(saved, tmp_path):
    assert is_artifact(saved)
    assert not is_artifact(tmp_path / "missing")
    assert not is_artifact(saved / "model.safetensors")
    (saved / "recipe.json").unlink()
    assert not is_artifact(saved)


def test_missing_folder(tmp_path):
    _assert_artifact_error(tmp_path / "missing", "does not exist")


def test_missing_recipe(saved):
    (saved / "recipe.json").unlink()
    _assert_artifact_error(saved, "recipe.json is missing")


@pytest.mark.parametrize("name", ["model.safetensors", "config.json"])
def test_missing_file(saved, name):
    (saved / name).unlink()
    _assert_artifact_error(saved, f"{name} is missing")


def test_truncated_weights(saved):
    weights = saved / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    _assert_artifact_error(saved, "model.safetensors is corrupt")


def test_garbage_weights(saved):
    (saved / "model.safetensors").write_bytes(b"\xff" * 64)
    _assert_artifact_error(saved, "model.safetensors is corrupt")


def test_corrupt_recipe(saved):
    (saved / "recipe.json").write_text("{not json")
    _assert_artifact_error(saved, "recipe.json is unreadable")


def test_recipe_disagreeing_with_weights(saved):
    recipe = json.loads((saved / "recipe.json").read_text())
    recipe["tensors"]["vit.layers.0.mlp.fc1.weight"]["shape"] = [10, 32]
    (saved / "recipe.json").write_text(json.dumps(recipe))
    _assert_artifact_error(saved, "fc1.weight has shape")


def test_format_version_too_new(saved):
    recipe = json.loads((saved / "recipe.json").read_text())
    recipe["format_version"] = 99
    (saved / "recipe.json").write_text(json.dumps(recipe))
    _assert_artifact_error(saved, "version 99 is newer")


def test_unknown_attrs_module(saved):
    recipe = json.loads((saved / "recipe.json").read_text())
    recipe["attrs"] = {"vit.layers.7.attention": {"num_attention_heads": 3}}
    (saved / "recipe.json").write_text(json.dumps(recipe))
    _assert_artifact_error(saved, "lacks")


def test_attrs_must_be_json(tiny_vit, tmp_path):
    with pytest.raises(ValueError, match="attrs must hold JSON values"):
        save_artifact(tiny_vit, tmp_path / "a", attrs={"vit": {"x": torch.ones(1)}})


def test_pruned_depthwise_conv_keeps_groups(tmp_path):
    from transformers import MobileNetV2Config, MobileNetV2ForImageClassification

    torch.manual_seed(0)
    config = MobileNetV2Config(num_channels=3, image_size=16, depth_multiplier=0.25, num_labels=10)
    model = MobileNetV2ForImageClassification(config).eval()
    block = model.mobilenet_v2.layer[1]
    keep = _keep(48, list(range(0, 32, 2)))
    _slice_conv_out(block.expand_1x1.convolution, keep)
    _slice_bn(block.expand_1x1.normalization, keep)
    depthwise = block.conv_3x3.convolution
    _slice_conv_out(depthwise, keep)
    depthwise.in_channels = depthwise.groups = len(keep)
    _slice_bn(block.conv_3x3.normalization, keep)
    _slice_conv_in(block.reduce_1x1.convolution, keep)
    _, loaded = _round_trip(model, tmp_path / "mobilenet", _images(channels=3))
    conv = loaded.model.mobilenet_v2.layer[1].conv_3x3.convolution
    assert (conv.in_channels, conv.out_channels, conv.groups) == (32, 32, 32)
    assert conv.weight.shape == (32, 1, 3, 3)


def test_loading_leaves_the_global_rng_alone(saved):
    torch.manual_seed(123)
    want = torch.rand(3)
    torch.manual_seed(123)
    load_artifact(saved)
    assert torch.equal(torch.rand(3), want)
