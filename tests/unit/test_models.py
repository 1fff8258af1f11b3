"""Tests of model loading, input-shape resolution and verification (tools/models/loading.py)."""

from __future__ import annotations

import json
import logging
import socket

import pytest
import torch

from profiling_agent.tools.hub import ModelLoadError
from profiling_agent.tools.models import embedded
from profiling_agent.tools.models.input_shape import resolve_input_shape, verify_input_shape
from profiling_agent.tools.models.loading import load_model


def _processor(size=16, mean=(0.5,), **kwargs):
    from transformers.models.vit.image_processing_pil_vit import ViTImageProcessorPil

    return ViTImageProcessorPil(
        size={"height": size, "width": size}, image_mean=list(mean), image_std=[0.5] * len(mean), **kwargs
    )


def _same_outputs(a, b, shape=(2, 1, 16, 16)) -> bool:
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        return torch.allclose(a(pixel_values=x).logits, b(pixel_values=x).logits, atol=1e-6)


def _assert_one_line(err: pytest.ExceptionInfo) -> str:
    text = str(err.value)
    assert "\n" not in text and text
    return text


def test_load_local_folder_with_processor(tiny_vit, tmp_path):
    tiny_vit.save_pretrained(tmp_path / "vit")
    _processor().save_pretrained(tmp_path / "vit")
    loaded = load_model(str(tmp_path / "vit"))
    assert loaded.source == "local" and loaded.path == str(tmp_path / "vit")
    assert type(loaded.model).__name__ == "ViTForImageClassification"
    assert not loaded.model.training
    assert loaded.processor is not None and loaded.processor.size.height == 16
    assert _same_outputs(tiny_vit, loaded.model)


def test_load_without_processor_warns(tiny_resnet, tmp_path, caplog):
    tiny_resnet.save_pretrained(tmp_path / "resnet")
    with caplog.at_level(logging.WARNING, logger="profiling_agent.tools.models.loading"):
        loaded = load_model(str(tmp_path / "resnet"))
    assert loaded.processor is None
    assert any("no image processor" in r.getMessage() for r in caplog.records)
    assert _same_outputs(tiny_resnet, loaded.model)


def test_missing_path(tmp_path):
    for ref in (str(tmp_path / "nope"), "./no/such/folder", "a/b/c"):
        with pytest.raises(ModelLoadError) as err:
            load_model(ref)
        assert _assert_one_line(err) == f"model path not found: {ref}"


def test_folder_without_config(tmp_path):
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "notes.txt").write_text("hi")
    with pytest.raises(ModelLoadError) as err:
        load_model(str(tmp_path / "junk"))
    assert "not a model folder" in _assert_one_line(err)


def test_file_instead_of_folder(tmp_path):
    (tmp_path / "model.bin").write_bytes(b"\0")
    with pytest.raises(ModelLoadError) as err:
        load_model(str(tmp_path / "model.bin"))
    assert "not a model folder" in _assert_one_line(err)


def test_not_an_image_classifier(tmp_path):
    from transformers import BertConfig, BertModel

    BertModel(
        BertConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32, vocab_size=50)
    ).save_pretrained(tmp_path / "bert")
    with pytest.raises(ModelLoadError) as err:
        load_model(str(tmp_path / "bert"))
    assert "not an image classifier" in _assert_one_line(err) and "'bert'" in str(err.value)


def test_backbone_without_classifier_head(tiny_vit, tmp_path):
    tiny_vit.vit.save_pretrained(tmp_path / "backbone")  # a ViTModel: no trained classifier
    with pytest.raises(ModelLoadError) as err:
        load_model(str(tmp_path / "backbone"))
    assert "classifier" in _assert_one_line(err)


def test_remote_code_required(tmp_path):
    folder = tmp_path / "remote"
    folder.mkdir()
    (folder / "config.json").write_text(
        json.dumps(
            {
                "model_type": "fancy-vision",
                "auto_map": {
                    "AutoConfig": "modeling_fancy.FancyConfig",
                    "AutoModelForImageClassification": "modeling_fancy.FancyModel",
                },
            }
        )
    )
    with pytest.raises(ModelLoadError) as err:
        load_model(str(folder))
    assert "trust_remote_code" in _assert_one_line(err)


def test_unknown_hub_id_offline_fails_fast(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    dialled: list[object] = []
    real_connect = socket.socket.connect

    def connect(sock, address):
        dialled.append(address)
        return real_connect(sock, address)

    monkeypatch.setattr(socket.socket, "connect", connect)
    with pytest.raises(ModelLoadError) as err:
        load_model("nobody-xyz/no-such-model-123")
    text = _assert_one_line(err)
    assert "cannot fetch hub model nobody-xyz/no-such-model-123" in text and "offline" in text
    assert dialled == []  # offline means no connection is even attempted, so it cannot hang on a network timeout


def test_embedded_refs(monkeypatch, tmp_path, tiny_vit):
    monkeypatch.setenv("PROFILING_AGENT_CACHE", str(tmp_path))
    with pytest.raises(ModelLoadError) as err:
        load_model("embedded:bert-digits")
    assert "unknown embedded model" in _assert_one_line(err)

    folder = tmp_path / "models" / "vit-digits"  # stands in for a trained model: no 30 s training here
    tiny_vit.save_pretrained(folder)
    _processor().save_pretrained(folder)
    (folder / "training.json").write_text(json.dumps({"test_accuracy": 12.5}))
    loaded = load_model("embedded:vit-digits")
    assert loaded.source == "embedded" and loaded.path == str(embedded.model_path("vit-digits"))
    assert loaded.info["training"]["test_accuracy"] == 12.5
    assert _same_outputs(tiny_vit, loaded.model)


def test_artifact_folder_dispatch(tiny_vit, tmp_path):
    from profiling_agent.tools.models.artifacts import save_artifact

    save_artifact(tiny_vit, tmp_path / "art", processor=_processor())
    loaded = load_model(str(tmp_path / "art"))
    assert loaded.source == "artifact"
    assert "architecture" in loaded.info["recipe"]
    assert loaded.processor is not None
    assert _same_outputs(tiny_vit, loaded.model)


def test_corrupt_artifact_is_a_model_load_error(tiny_vit, tmp_path):
    from profiling_agent.tools.models.artifacts import save_artifact

    save_artifact(tiny_vit, tmp_path / "art")
    (tmp_path / "art" / "model.safetensors").write_bytes(b"garbage")
    with pytest.raises(ModelLoadError) as err:
        load_model(str(tmp_path / "art"))
    assert _assert_one_line(err).startswith("cannot load artifact")


# ---------------------------------------------------------------- input shape


def test_shape_from_processor_and_config(tiny_vit):
    shape = resolve_input_shape(tiny_vit, _processor())
    assert (shape["channels"], shape["height"], shape["width"]) == (1, 16, 16)
    assert shape["source"] == "processor+config" and shape["ambiguous"] is False
    verify_input_shape(tiny_vit, shape)


def test_shape_from_config_only(tiny_vit):
    shape = resolve_input_shape(tiny_vit, None)
    assert (shape["channels"], shape["height"], shape["width"], shape["source"]) == (1, 16, 16, "config")
    assert shape["ambiguous"] is False


def test_shape_default_when_nothing_known(tiny_resnet):
    shape = resolve_input_shape(tiny_resnet, None)  # ResNet configs carry no image_size
    assert shape["source"] == "default" and shape["ambiguous"] is True
    assert (shape["channels"], shape["height"], shape["width"]) == (1, 224, 224)


def test_shape_processor_crop_and_shortest_edge(tiny_resnet_basic):
    from transformers.models.convnext.image_processing_pil_convnext import ConvNextImageProcessorPil

    deit_like = _processor(size=20, mean=(0.5, 0.5, 0.5), do_center_crop=True, crop_size={"height": 14, "width": 14})
    shape = resolve_input_shape(tiny_resnet_basic, deit_like)
    assert (shape["channels"], shape["height"], shape["width"], shape["source"]) == (3, 14, 14, "processor")
    verify_input_shape(tiny_resnet_basic, shape)

    convnext_like = ConvNextImageProcessorPil(size={"shortest_edge": 24}, crop_pct=0.875)
    shape = resolve_input_shape(tiny_resnet_basic, convnext_like)
    assert (shape["height"], shape["width"], shape["ambiguous"]) == (24, 24, False)


def test_shape_disagreement_is_ambiguous(tiny_vit):
    shape = resolve_input_shape(tiny_vit, _processor(size=32, mean=(0.5, 0.5, 0.5)))
    assert shape["ambiguous"] is True
    assert (shape["channels"], shape["height"], shape["width"]) == (1, 16, 16)  # the config constrains ViT
    assert shape["candidates"] == [[1, 16, 16], [1, 32, 32]]
    assert any("num_channels" in note for note in shape["notes"])
    verify_input_shape(tiny_vit, shape)
    with pytest.raises(ValueError) as err:
        verify_input_shape(tiny_vit, shape["candidates"][1])
    assert "1x1x32x32 failed" in _assert_one_line(err)


def test_verify_wrong_channels_and_labels(tiny_resnet):
    with pytest.raises(ValueError) as err:
        verify_input_shape(tiny_resnet, {"channels": 3, "height": 16, "width": 16})
    assert "forward pass" in _assert_one_line(err)
    with pytest.raises(ValueError, match="three positive ints"):
        verify_input_shape(tiny_resnet, (1, 16))
    tiny_resnet.config.id2label = {i: str(i) for i in range(5)}  # config says 5 labels, the head gives 10
    with pytest.raises(ValueError) as err:
        verify_input_shape(tiny_resnet, (1, 16, 16))
    assert "(1, 10)" in _assert_one_line(err) and "(1, 5)" in str(err.value)
