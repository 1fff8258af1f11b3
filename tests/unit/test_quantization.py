"""Tests of dynamic quantization: layer matching, override semantics, accuracy of qint8 and float16."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear

from profiling_agent.state import QuantEntry
from profiling_agent.tools.compression.quantization import match_linear_layers, quantize_model
from profiling_agent.tools.models.sizes import count_params, state_bytes
from profiling_agent.tools.runtimes.forward import batched_logits


def _linear_names(model: nn.Module) -> list[str]:
    return [name for name, module in model.named_modules() if isinstance(module, nn.Linear)]


def _relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).norm() / want.norm())


@pytest.fixture
def images():
    return torch.randn(4, 1, 16, 16, generator=torch.Generator().manual_seed(1))


def test_match_all_selects_every_linear(tiny_vit):
    names = _linear_names(tiny_vit)
    assert len(names) == 2 * 6 + 1  # q, k, v, o, fc1, fc2 per layer, plus the classifier
    assert match_linear_layers(tiny_vit, [QuantEntry(layer="all")]) == dict.fromkeys(names, "qint8")


def test_match_regex_uses_search_and_protection(tiny_vit):
    matched = match_linear_layers(tiny_vit, [{"layer": r"mlp\.fc1$", "dtype": "float16"}])
    assert matched == {"vit.layers.0.mlp.fc1": "float16", "vit.layers.1.mlp.fc1": "float16"}
    everything_but_head = match_linear_layers(tiny_vit, [{"layer": "all"}], protected=("classifier",))
    assert set(everything_but_head) == set(_linear_names(tiny_vit)) - {"classifier"}
    # protecting a parent module protects every Linear inside it
    assert set(match_linear_layers(tiny_vit, [{"layer": "all"}], protected=("vit.layers.1",))) == {
        n for n in _linear_names(tiny_vit) if not n.startswith("vit.layers.1.")
    }


def test_later_entries_override_earlier_ones(tiny_vit):
    entries = [QuantEntry(layer="all", dtype="qint8"), QuantEntry(layer="mlp", dtype="float16")]
    matched = match_linear_layers(tiny_vit, entries)
    for name in _linear_names(tiny_vit):
        assert matched[name] == ("float16" if ".mlp." in name else "qint8")
    reversed_order = match_linear_layers(tiny_vit, list(reversed(entries)))
    assert set(reversed_order.values()) == {"qint8"}


def test_invalid_regex_raises_one_line_value_error(tiny_vit):
    with pytest.raises(ValueError, match=r"invalid layer regex '\(unclosed'") as info:
        match_linear_layers(tiny_vit, [{"layer": "(unclosed", "dtype": "qint8"}])
    assert "\n" not in str(info.value)
    with pytest.raises(ValueError, match="dtype"):
        match_linear_layers(tiny_vit, [{"layer": "all", "dtype": "int4"}])


def test_quantize_all_qint8_is_close_and_leaves_input_untouched(tiny_vit, images):
    reference = batched_logits(tiny_vit, images)
    quantized, done = quantize_model(tiny_vit, [QuantEntry(layer="all", dtype="qint8")])
    assert done == dict.fromkeys(_linear_names(tiny_vit), "qint8")
    assert all(isinstance(quantized.get_submodule(n), DynamicLinear) for n in done)
    assert not quantized.training
    assert _relative_error(batched_logits(quantized, images), reference) < 0.05
    # the input model is still float and gives the same outputs
    assert all(type(tiny_vit.get_submodule(n)) is nn.Linear for n in done)
    assert torch.equal(batched_logits(tiny_vit, images), reference)


def test_quantize_regex_only_touches_matches(tiny_vit, images):
    quantized, done = quantize_model(tiny_vit, [{"layer": r"layers\.0\.attention\.(q|k)_proj", "dtype": "qint8"}])
    assert done == {"vit.layers.0.attention.q_proj": "qint8", "vit.layers.0.attention.k_proj": "qint8"}
    untouched = set(_linear_names(tiny_vit)) - set(done)
    assert all(type(quantized.get_submodule(n)) is nn.Linear for n in untouched)
    assert _relative_error(batched_logits(quantized, images), batched_logits(tiny_vit, images)) < 0.05


def test_quantize_float16_is_nearly_exact(tiny_vit, images):
    quantized, done = quantize_model(tiny_vit, [QuantEntry(layer="all", dtype="float16")])
    assert set(done.values()) == {"float16"} and len(done) == 13
    assert quantized.get_submodule("classifier")._packed_params.dtype == torch.float16
    assert _relative_error(batched_logits(quantized, images), batched_logits(tiny_vit, images)) < 2e-3


def test_empty_entries_return_model_unchanged(tiny_vit):
    same, done = quantize_model(tiny_vit, [])
    assert same is tiny_vit and done == {}
    same, done = quantize_model(tiny_vit, [{"layer": "no_such_module", "dtype": "qint8"}])
    assert same is tiny_vit and done == {}


def test_resnet_only_has_its_classifier_quantized(tiny_resnet):
    quantized, done = quantize_model(tiny_resnet, [QuantEntry(layer="all")])
    assert done == {"classifier.1": "qint8"}
    images = torch.randn(2, 1, 16, 16, generator=torch.Generator().manual_seed(2))
    assert _relative_error(batched_logits(quantized, images), batched_logits(tiny_resnet, images)) < 0.05


def test_logical_params_and_state_bytes_count_packed_weights(tiny_vit):
    float_params = sum(p.numel() for p in tiny_vit.parameters())
    float_bytes = sum(p.numel() * 4 for p in tiny_vit.parameters()) + sum(b.numel() * 4 for b in tiny_vit.buffers())
    assert count_params(tiny_vit) == float_params
    assert state_bytes(tiny_vit) == float_bytes

    quantized, done = quantize_model(tiny_vit, [QuantEntry(layer="all", dtype="qint8")])
    assert count_params(quantized) == float_params
    linear_sizes = [tiny_vit.get_submodule(n).weight.shape for n in done]
    linear_bytes_fp32 = sum((o * i + o) * 4 for o, i in linear_sizes)
    # int8 weight, fp32 bias, float64 scale and int64 zero point per per-tensor-quantized Linear
    linear_bytes_q = sum(o * i + o * 4 + 16 for o, i in linear_sizes)
    assert state_bytes(quantized) == float_bytes - linear_bytes_fp32 + linear_bytes_q
