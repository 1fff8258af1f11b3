"""Token merging on ViT and DeiT: the merge itself, schedules and their refusals, artifacts that remember it."""

from __future__ import annotations

import copy

import pytest
import torch
from helpers.tiny import deit_config, resnet_config, seeded, swin_config, vit_config

from profiling_agent.tools.compression.pruning import prune_model
from profiling_agent.tools.compression.token_merge import (
    TokenScheduleError,
    apply_token_merging,
    remove_token_merging,
    schedule_from_entry,
    schedule_from_rate,
    token_schedule,
    tokens_per_layer,
)
from profiling_agent.tools.io import read_json, write_json_atomic
from profiling_agent.tools.models.artifact_load import load_artifact
from profiling_agent.tools.models.artifacts import ArtifactError, save_artifact
from profiling_agent.tools.models.merged_tokens import TokenMatch, proportional_attention


def _vit(**overrides):
    from transformers import ViTForImageClassification

    return seeded(ViTForImageClassification, vit_config(num_channels=3, **overrides))


def _deit(teacher: bool = False):
    import transformers as tf

    cls = tf.DeiTForImageClassificationWithTeacher if teacher else tf.DeiTForImageClassification
    return seeded(cls, deit_config())


def _pixels(n: int, size: int = 16, seed: int = 1) -> torch.Tensor:
    return torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(seed))


@torch.inference_mode()
def _logits(model, x):
    return model(pixel_values=x).logits


@pytest.mark.parametrize("build", [_vit, _deit, lambda: _deit(teacher=True)], ids=["vit", "deit", "deit-teacher"])
def test_a_schedule_of_zeros_changes_nothing_and_merging_changes_the_logits(build):
    model = build()
    x = _pixels(4)
    before = _logits(model, x)
    assert apply_token_merging(model, [0, 0]) == [0, 0]
    assert torch.allclose(_logits(model, x), before, atol=1e-5)
    apply_token_merging(model, 4)
    assert token_schedule(model) == [4, 4]
    merged = _logits(model, x)
    assert merged.shape == before.shape and torch.isfinite(merged).all()
    assert not torch.allclose(merged, before, atol=1e-4)  # 17 or 18 tokens -> 9 or 10: the model sees fewer
    remove_token_merging(model)
    assert token_schedule(model) is None and torch.allclose(_logits(model, x), before, atol=1e-5)


def test_merge_is_a_size_weighted_mean_and_keeps_protected_tokens_in_place():
    # tokens: CLS, then A/B alternating: a0 b0 a1 b1; a1 points exactly as b0 does, a0 nearly as b1 does
    c, a0, b0, a1, b1 = (torch.tensor([v]) for v in ([9.0, 9.0], [1.0, 0.2], [0.0, 4.0], [0.0, 2.0], [3.0, 0.0]))
    hidden = torch.cat([c, a0, b0, a1, b1]).unsqueeze(0)
    size = torch.tensor([1.0, 1.0, 3.0, 1.0, 1.0]).view(1, 5, 1)
    out, new_size = TokenMatch(r=1, protected=1, tokens=5)(hidden, hidden, size)  # the tokens are their own keys here
    assert out.shape == (1, 4, 2) and new_size.flatten().tolist()[0] == 1.0
    assert torch.equal(out[0, 0], c[0])  # CLS first, untouched
    assert sorted(new_size.flatten().tolist()) == [1.0, 1.0, 1.0, 4.0]  # a1 (size 1) joined b0 (size 3)
    joined = out[0][new_size[0, :, 0] == 4.0][0]
    assert torch.allclose(joined, (3 * b0[0] + a1[0]) / 4)  # a size-weighted mean, not a plain one
    out2, size2 = TokenMatch(r=2, protected=1, tokens=5)(hidden, hidden, size)
    assert out2.shape == (1, 3, 2) and size2.sum().item() == size.sum().item()  # sizes always add up


def test_proportional_attention_counts_a_merged_token_as_its_copies():
    model = _vit()
    attention = model.vit.layers[0].attention
    tokens = torch.randn(1, 3, 32, generator=torch.Generator().manual_seed(3))
    copies = torch.cat([tokens, tokens[:, 2:]], dim=1)  # the last token twice
    with torch.inference_mode():
        full, _ = proportional_attention(attention, copies, None)
        merged, _ = proportional_attention(attention, tokens, torch.tensor([[[1.0], [1.0], [2.0]]]))
    assert torch.allclose(full[:, :3], merged, atol=1e-5)


def test_rates_are_capped_per_layer_and_entries_name_a_schedule():
    model = _vit(num_hidden_layers=4)  # 16 patches + CLS
    assert schedule_from_rate(model, 8) == [8, 4, 2, 1]  # at most half the unprotected tokens each layer
    assert tokens_per_layer(model, [8, 4, 2, 1]) == [9, 5, 3, 2]
    assert schedule_from_entry(model, {"type": "tokens", "rate": 3}) == [3, 3, 3, 3]
    assert schedule_from_entry(model, {"type": "tokens", "schedule": [4, 2, 0, 0]}) == [4, 2, 0, 0]
    for bad in ({"type": "tokens"}, {"type": "tokens", "rate": 1, "schedule": [1] * 4}, {"type": "structured"}):
        with pytest.raises(TokenScheduleError):
            schedule_from_entry(model, bad)


@pytest.mark.parametrize(
    ("schedule", "message"),
    [
        ([1, 1, 1], "needs one r per layer (4 layers), got 3"),
        ([1, -1, 0, 0], "whole number >= 0"),
        ([1, 1.5, 0, 0], "whole number >= 0"),
        ([9, 0, 0, 0], "layer 0 sees 17 tokens (1 protected) and can merge at most 8, not 9"),
        ([8, 5, 0, 0], "layer 1 sees 9 tokens (1 protected) and can merge at most 4, not 5"),
        ("fast", "needs one r per layer"),
    ],
)
def test_a_schedule_that_does_not_fit_is_refused_in_one_line(schedule, message):
    with pytest.raises(TokenScheduleError) as caught:
        apply_token_merging(_vit(num_hidden_layers=4), schedule)
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_swin_and_resnet_say_why_they_have_no_token_axis():
    import transformers as tf

    swin = seeded(tf.SwinForImageClassification, swin_config())
    resnet = seeded(tf.ResNetForImageClassification, resnet_config())
    with pytest.raises(TokenScheduleError, match="Swin has no global token axis: its attention runs in .*windows"):
        apply_token_merging(swin, 1)
    with pytest.raises(TokenScheduleError, match="resnet has no token axis .* feature maps, not tokens"):
        apply_token_merging(resnet, [1, 1])


def test_merging_composes_with_pruning_and_the_artifact_remembers_the_schedule(tmp_path):
    model = _vit(num_hidden_layers=3)
    prune_model(model, [{"layer": "mlp", "type": "structured", "ratio": 0.25}], _pixels(2))
    apply_token_merging(model, [4, 3, 2])
    x = _pixels(5, seed=4)
    expected = _logits(model, x)
    save_artifact(model, tmp_path / "art")
    recipe = read_json(tmp_path / "art" / "recipe.json")
    assert recipe["token_schedule"] == [4, 3, 2] and recipe["format_version"] == 3
    loaded = load_artifact(tmp_path / "art").model
    assert token_schedule(loaded) == [4, 3, 2] and loaded.vit.layers[0].mlp.fc1.out_features == 48
    assert torch.equal(_logits(loaded, x), expected)
    assert torch.equal(_logits(copy.deepcopy(loaded), x), expected)  # a copy merges alike
    save_artifact(_vit(), tmp_path / "plain")  # a model without merging writes neither field nor version 3
    plain = read_json(tmp_path / "plain" / "recipe.json")
    assert "token_schedule" not in plain and plain["format_version"] == 1


@pytest.mark.parametrize("bad", [[4, 3], [4, -1, 0], "ToMe", [40, 0, 0]])
def test_a_recipe_with_an_invalid_schedule_is_refused_in_one_line(tmp_path, bad):
    model = _vit(num_hidden_layers=3)
    apply_token_merging(model, [4, 3, 2])
    save_artifact(model, tmp_path / "art")
    recipe = read_json(tmp_path / "art" / "recipe.json")
    write_json_atomic(tmp_path / "art" / "recipe.json", {**recipe, "token_schedule": bad})
    with pytest.raises(ArtifactError, match="invalid token_schedule") as caught:
        load_artifact(tmp_path / "art")
    assert "\n" not in str(caught.value)


def test_a_merged_model_quantizes_dynamically_and_reloads(tmp_path):
    from profiling_agent.tools.compression.quantization import quantize_model

    model = _vit(num_hidden_layers=3)
    apply_token_merging(model, [4, 3, 2])
    quantized, done = quantize_model(model, [{"layer": "all", "dtype": "qint8"}])
    assert done and token_schedule(quantized) == [4, 3, 2]
    x = _pixels(3, seed=5)
    expected = _logits(quantized, x)
    save_artifact(quantized, tmp_path / "q", quantized=done)
    loaded = load_artifact(tmp_path / "q").model
    assert token_schedule(loaded) == [4, 3, 2] and torch.equal(_logits(loaded, x), expected)
