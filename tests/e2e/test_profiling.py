"""Tests of the static, operator and per-module profiler on tiny transformers models."""

from __future__ import annotations

import copy
import json
import warnings

import pytest
import torch
from torch import nn

from profiling_agent.tools.compression.families.base import PrunableGroup
from profiling_agent.tools.models.sizes import count_params
from profiling_agent.tools.profiling.dynamic import module_timings, operator_table, profile_model
from profiling_agent.tools.profiling.static import static_profile
from profiling_agent.tools.profiling.summary import format_layer_table, group_costs, summarize_profile
from profiling_agent.tools.runtimes.forward import example_input

# Tiny ViT of conftest: 16x16x1 images, patch 4 -> 16 patches + CLS = 17 tokens, hidden 32, 4 heads of 8,
# MLP 64, 2 layers, 10 labels.
TOKENS, HIDDEN, HEADS, HEAD_DIM, MLP, LAYERS, LABELS = 17, 32, 4, 8, 64, 2, 10


def _linear(n_in: int, n_out: int, tokens: int) -> int:
    """ptflops' Linear count: in*out multiply-accumulates plus one bias add per output, per token."""
    return tokens * (n_in * n_out + n_out)


def _tiny_vit_linear_macs() -> int:
    per_layer = 4 * _linear(HIDDEN, HIDDEN, TOKENS) + _linear(HIDDEN, MLP, TOKENS) + _linear(MLP, HIDDEN, TOKENS)
    return LAYERS * per_layer + _linear(HIDDEN, LABELS, 1)  # the classifier sees the CLS token only


def _tiny_vit_attention_macs() -> int:
    # QK^T (T*T*d) + softmax (T*T) + AV (T*T*d), per head.
    return LAYERS * HEADS * TOKENS * TOKENS * (HEAD_DIM + 1 + HEAD_DIM)


def _tiny_vit_total_macs() -> int:
    conv = 16 * HIDDEN * (4 * 4 * 1) + 16 * HIDDEN  # 16 positions x 32 filters x 4x4x1 kernel, plus bias
    # ptflops counts a norm as 2 per element when it has `affine` (BatchNorm), else 1: LayerNorm names it
    # `elementwise_affine`, so 1 per element.
    layer_norms = (2 * LAYERS + 1) * TOKENS * HIDDEN
    gelu = LAYERS * TOKENS * MLP
    return conv + _tiny_vit_linear_macs() + _tiny_vit_attention_macs() + layer_norms + gelu


def _quantized(model: nn.Module, dtype: torch.dtype = torch.qint8) -> nn.Module:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.ao.quantization.quantize_dynamic(copy.deepcopy(model), {nn.Linear}, dtype=dtype)


def _rows(profile: dict) -> dict[str, dict]:
    return {row["name"]: row for row in profile["layers"]}


# ---------------------------------------------------------------- static profile


def test_vit_linear_macs_match_analytic_count(tiny_vit):
    static = static_profile(tiny_vit, (1, 16, 16))
    linear_rows = [row for row in static["layers"] if row["type"] == "Linear"]
    assert len(linear_rows) == LAYERS * 6 + 1
    assert sum(row["macs"] for row in linear_rows) == _tiny_vit_linear_macs()
    assert _rows(static)["vit.layers.0.mlp.fc1"]["macs"] == _linear(HIDDEN, MLP, TOKENS)


def test_vit_total_macs_match_analytic_count_including_attention(tiny_vit):
    static = static_profile(tiny_vit, {"channels": 1, "height": 16, "width": 16})
    assert static["total_macs"] == _tiny_vit_total_macs()
    # ptflops' module hooks alone miss the attention matmuls: we add them as functional MACs.
    assert static["functional_macs"] == _tiny_vit_attention_macs()
    assert static["ptflops_macs"] == static["module_macs"] == _tiny_vit_total_macs() - _tiny_vit_attention_macs()
    attention = _rows(static)["vit.layers.1.attention"]
    assert attention["macs"] == _tiny_vit_attention_macs() // LAYERS and attention["params"] == 0


def test_eager_and_sdpa_attention_give_the_same_count(tiny_vit):
    sdpa = static_profile(tiny_vit, (1, 16, 16))
    tiny_vit.set_attn_implementation("eager")
    eager = static_profile(tiny_vit, (1, 16, 16))
    assert eager["total_macs"] == sdpa["total_macs"] == _tiny_vit_total_macs()


@pytest.mark.parametrize("fixture", ["tiny_vit", "tiny_resnet", "tiny_resnet_basic"])
def test_per_layer_rows_sum_to_totals(fixture, request):
    model = request.getfixturevalue(fixture)
    channels = model.config.num_channels
    static = static_profile(model, (channels, 16, 16))
    assert "error" not in static
    assert sum(row["macs"] for row in static["layers"]) == static["total_macs"] > 0
    assert sum(row["params"] for row in static["layers"]) == static["total_params"]
    assert static["total_params"] == sum(p.numel() for p in model.parameters())
    assert not any(hasattr(m, "__flops__") or m._forward_hooks or m._forward_pre_hooks for m in model.modules())
    json.dumps(static)


def test_resnet_conv_macs_match_output_shapes(tiny_resnet_basic):
    outputs: dict[str, torch.Size] = {}
    convs = {name: m for name, m in tiny_resnet_basic.named_modules() if isinstance(m, nn.Conv2d)}
    handles = [
        m.register_forward_hook(lambda mod, i, o, n=name: outputs.__setitem__(n, o.shape)) for name, m in convs.items()
    ]
    with torch.inference_mode():
        tiny_resnet_basic(pixel_values=torch.zeros(1, 3, 16, 16))
    for handle in handles:
        handle.remove()
    rows = _rows(static_profile(tiny_resnet_basic, (3, 16, 16)))
    for name, conv in convs.items():
        kernel = conv.in_channels // conv.groups * conv.kernel_size[0] * conv.kernel_size[1]
        expected = outputs[name].numel() * kernel + (outputs[name].numel() if conv.bias is not None else 0)
        assert rows[name]["macs"] == expected, name


def test_quantized_model_keeps_logical_params_and_fp32_macs(tiny_vit):
    base = static_profile(tiny_vit, (1, 16, 16))
    quant = static_profile(_quantized(tiny_vit), (1, 16, 16))
    assert "error" not in quant
    assert quant["total_macs"] == base["total_macs"]
    assert quant["total_params"] == base["total_params"] == count_params(tiny_vit)
    assert _rows(quant)["vit.layers.0.mlp.fc1"]["type"] == "DynamicQuantizedLinear"


def test_static_profile_reports_a_failed_count(tiny_vit):
    static = static_profile(tiny_vit, (3, 16, 16))  # the model takes 1 channel: its forward raises
    assert static["total_macs"] is None and "error" in static
    assert static["total_params"] == sum(p.numel() for p in tiny_vit.parameters())
    assert torch.nn.functional.scaled_dot_product_attention.__name__ == "scaled_dot_product_attention"
    assert not hasattr(torch.matmul, "op")  # ptflops' patches were undone
    assert not any(hasattr(m, "__flops__") or m._forward_hooks or m._forward_pre_hooks for m in tiny_vit.modules())


# ---------------------------------------------------------------- operators and module timings


def test_operator_table_vit_and_resnet(tiny_vit, tiny_resnet):
    vit_ops = operator_table(tiny_vit, example_input((1, 16, 16)), top_k=40)
    names = {row["op"] for row in vit_ops}
    assert names & {"aten::linear", "aten::addmm"}
    selfs = [row["self_cpu_ms"] for row in vit_ops]
    assert selfs == sorted(selfs, reverse=True) and selfs[0] > 0
    assert set(vit_ops[0]) >= {"op", "calls", "self_cpu_ms", "cpu_total_ms", "self_cpu_memory_bytes"}
    resnet_ops = operator_table(tiny_resnet, example_input((1, 16, 16)), top_k=5)
    assert len(resnet_ops) == 5
    assert any("conv" in row["op"] for row in operator_table(tiny_resnet, example_input((1, 16, 16)), top_k=40))


def test_module_timings_cover_every_linear(tiny_vit):
    rows = {row["name"]: row for row in module_timings(tiny_vit, example_input((1, 16, 16)), warmup=1, repeats=3)}
    linears = [name for name, m in tiny_vit.named_modules() if isinstance(m, nn.Linear)]
    for name in linears:
        row = rows[name]
        assert row["leaf"] and row["calls"] == 1 and row["latency_ms"] > 0
        assert row["self_ms"] == pytest.approx(row["latency_ms"])
        assert row["act_bytes"] == 4 * torch.Size(row["output_shape"]).numel()
    assert rows["vit.layers.0.mlp.fc1"]["output_shape"] == [1, TOKENS, MLP]
    assert not rows["vit.layers.0"]["leaf"]
    assert rows[""]["latency_ms"] >= rows["vit.layers.0"]["latency_ms"] >= rows["vit.layers.0.mlp"]["latency_ms"]
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in tiny_vit.modules())


# ---------------------------------------------------------------- full profile, groups, summary


def test_profile_model_is_json_and_consistent(tiny_vit):
    profile = profile_model(tiny_vit, (1, 16, 16), warmup=1, repeats=3, top_k=5)
    assert json.loads(json.dumps(profile)) == profile
    totals = profile["totals"]
    assert totals["macs"] == _tiny_vit_total_macs()
    assert totals["params"] == sum(p.numel() for p in tiny_vit.parameters())
    assert totals["latency_ms"] > 0 and totals["timed_ms"] > 0
    rows = _rows(profile)
    assert sum(r["macs_share"] for r in rows.values()) == pytest.approx(1.0)
    timed = [row for row in module_timings(tiny_vit, example_input((1, 16, 16)), warmup=0, repeats=1)]
    assert {row["name"] for row in timed} - {""} <= set(rows)  # every called module has a row
    # shares of self time: the rows plus the model's own self time make 1
    assert 0.5 < sum(r["latency_share"] for r in rows.values()) <= 1.0 + 1e-9
    assert sum(r["latency_ms"] for r in rows.values()) <= totals["timed_ms"] + 1e-9
    assert rows["vit.layers.0.mlp.fc1"]["macs"] == _linear(HIDDEN, MLP, TOKENS)
    assert rows["vit.layers.0.mlp.fc1"]["act_bytes"] == 4 * TOKENS * MLP
    assert len(profile["operators"]) == 5
    assert profile["env"]["threads"] == torch.get_num_threads() and profile["env"]["input_shape"] == [1, 16, 16]


def _vit_groups(layers: int) -> list:
    groups = []
    for i in range(layers):
        att = f"vit.layers.{i}.attention"
        groups.append({"name": f"layers.{i}.heads", "kind": "head", "block": f"vit.layers.{i}", "members": [att]})
        groups.append(
            PrunableGroup(
                name=f"layers.{i}.mlp",
                kind="structured",
                module=f"vit.layers.{i}.mlp.fc1",
                roots=(f"vit.layers.{i}.mlp.fc1",),
                members=(f"vit.layers.{i}.mlp.fc1", f"vit.layers.{i}.mlp.fc2"),
                units=MLP,
                block=f"vit.layers.{i}",
            )
        )
    return groups


def test_group_costs_sum_member_rows(tiny_vit):
    profile = profile_model(tiny_vit, (1, 16, 16), warmup=1, repeats=2)
    rows, totals = _rows(profile), profile["totals"]
    costs = group_costs(profile, _vit_groups(LAYERS))
    mlp = costs["layers.1.mlp"]
    fc1, fc2 = rows["vit.layers.1.mlp.fc1"], rows["vit.layers.1.mlp.fc2"]
    assert mlp["params"] == fc1["params"] + fc2["params"] == 2 * HIDDEN * MLP + MLP + HIDDEN
    assert mlp["macs"] == _linear(HIDDEN, MLP, TOKENS) + _linear(MLP, HIDDEN, TOKENS)
    assert mlp["macs_share"] == pytest.approx(mlp["macs"] / totals["macs"])
    assert mlp["latency_ms"] == pytest.approx(fc1["latency_ms"] + fc2["latency_ms"])
    heads = costs["layers.0.heads"]  # the attention module: q/k/v/o plus the attention matmuls
    assert heads["macs"] == 4 * _linear(HIDDEN, HIDDEN, TOKENS) + _tiny_vit_attention_macs() // LAYERS
    assert heads["kind"] == "head" and heads["missing"] == []
    everything = group_costs(profile, [{"name": "all", "members": ["vit", "classifier"]}])["all"]
    assert everything["params_share"] == pytest.approx(1.0) and everything["macs_share"] == pytest.approx(1.0)
    parts = sum(c["macs_share"] for c in costs.values())
    assert parts == pytest.approx(LAYERS * (mlp["macs"] + heads["macs"]) / totals["macs"])
    assert group_costs(profile, [{"name": "x", "members": ["nope"]}])["x"]["missing"] == ["nope"]


def test_summary_of_a_12_layer_vit_is_small(request):
    from helpers.tiny import seeded, vit_config
    from transformers import ViTForImageClassification

    model = seeded(ViTForImageClassification, vit_config(num_hidden_layers=12))
    profile = profile_model(model, (1, 16, 16), warmup=1, repeats=2)
    summary = summarize_profile(profile, _vit_groups(12), top_k=8)
    text = json.dumps(summary)
    assert len(text.encode()) < 4096, len(text)
    assert len(summary["groups"]["rows"]) == 24 and len(summary["top_latency"]) == 8
    assert summary["totals"]["params"] == profile["totals"]["params"]
    assert summary["top_macs"][0]["macs"] == max(row["macs"] for row in profile["layers"])


def test_format_layer_table(tiny_resnet):
    profile = profile_model(tiny_resnet, (1, 16, 16), warmup=1, repeats=2)
    table = format_layer_table(profile, top=6)
    lines = table.splitlines()
    assert len(lines) == 6 + 4 and lines[0].startswith("layer")
    slowest = max(profile["layers"], key=lambda row: row["latency_ms"])
    assert lines[2].startswith(slowest["name"][:40])
    assert len({len(line) for line in lines[2:8]}) == 1  # fixed width


@pytest.mark.slow
def test_vit_base_total_matches_analytic_count():
    from transformers import ViTConfig, ViTForImageClassification

    model = ViTForImageClassification(ViTConfig(num_labels=1000)).eval()  # ViT-B/16, 224x224
    tokens, hidden, mlp, layers, heads = 197, 768, 3072, 12, 12
    linear = layers * (
        4 * _linear(hidden, hidden, tokens) + _linear(hidden, mlp, tokens) + _linear(mlp, hidden, tokens)
    ) + _linear(hidden, 1000, 1)
    conv = 196 * hidden * (16 * 16 * 3) + 196 * hidden
    attention = layers * heads * tokens * tokens * (64 + 1 + 64)
    norms = (2 * layers + 1) * tokens * hidden
    gelu = layers * tokens * mlp
    static = static_profile(model, (3, 224, 224))
    assert static["total_macs"] == linear + conv + attention + norms + gelu
    assert 16.8e9 < static["ptflops_macs"] < 17.0e9  # ptflops' module-only count, as documented


def test_profile_of_a_quantized_model(tiny_vit):
    profile = profile_model(_quantized(tiny_vit), (1, 16, 16), warmup=1, repeats=2, top_k=40)
    assert json.loads(json.dumps(profile)) == profile and "error" not in profile
    assert profile["totals"]["macs"] == _tiny_vit_total_macs()
    assert any(row["op"] == "quantized::linear_dynamic" for row in profile["operators"])
    fc1 = _rows(profile)["vit.layers.0.mlp.fc1"]
    assert fc1["leaf"] and fc1["latency_ms"] > 0 and fc1["act_bytes"] == 4 * TOKENS * MLP
