"""Backend profile: ONNX Runtime per-node times mapped back to the prunable groups, and the form planners read."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from profiling_agent.state import group_rows
from profiling_agent.tools.compression.families import adapter_for
from profiling_agent.tools.profiling.backend_profile import (
    ORT_FORMS,
    BackendForm,
    form_profile,
    module_of,
    planned_form,
    planning_costs,
    profile_backends,
)


def test_node_names_map_to_module_paths():
    assert module_of("/model/vit/layers.0/mlp/fc1/MatMul") == "vit.layers.0.mlp.fc1"
    assert module_of("/model/vit/layers.0/attention/MatMul/MatMulScaleFusion/") == "vit.layers.0.attention.MatMul"
    assert module_of("SkipLayerNormalization") == ""


def test_form_profile_books_node_times_on_groups():
    groups = [
        {"name": "layers.0.mlp", "kind": "structured", "module": "vit.layers.0.mlp.fc1",
         "members": ("vit.layers.0.mlp.fc1", "vit.layers.0.mlp.fc2")},
        {"name": "layers.0.heads", "kind": "head", "module": "vit.layers.0.attention",
         "members": ("vit.layers.0.attention.q_proj",)},
    ]  # fmt: skip
    nodes = {
        "/model/vit/layers.0/mlp/fc1/MatMul": 3.0,
        "/model/vit/layers.0/mlp/fc2/MatMul_quant": 1.0,
        "/model/vit/layers.0/attention/Softmax": 2.0,  # booked on the attention module: the heads group owns it
        "/model/vit/layers.0/layernorm_before/LayerNormalization": 2.0,
        "Fused": 2.0,
    }
    out = form_profile(nodes, groups)
    assert out["total_ms"] == pytest.approx(10.0)
    assert out["group_latency_share"] == {"layers.0.mlp": pytest.approx(0.4), "layers.0.heads": pytest.approx(0.2)}
    assert out["unmapped_share"] == pytest.approx(0.2)


def test_ort_profile_of_a_tiny_vit_covers_every_group(tiny_vit):
    groups = [dataclasses.asdict(g) for g in adapter_for(tiny_vit).prunable_groups(tiny_vit)]
    out = profile_backends(tiny_vit, torch.randn(1, 1, 16, 16), groups, repeats=3)
    assert set(out["forms"]) == {f.name for f in ORT_FORMS}
    for row in out["forms"].values():
        assert "error" not in row, row
        shares = row["group_latency_share"]
        assert set(shares) == {g["name"] for g in groups} and all(s > 0 for s in shares.values())
        assert sum(shares.values()) + row["unmapped_share"] <= 1.0 + 1e-6


def test_a_form_that_fails_is_reported_not_fatal(tiny_vit):
    def broken(model, example, folder):
        raise RuntimeError("no such backend here")

    form = BackendForm("ov_int8", "openvino", broken, lambda *a: {})
    out = profile_backends(tiny_vit, torch.randn(1, 1, 16, 16), [], [form])
    assert "no such backend here" in out["forms"]["ov_int8"]["error"]


def test_planners_read_the_fastest_form_the_backend_choice_can_deliver():
    profile = {
        "forms": {
            "ort_fp32": {"backend": "onnxruntime", "total_ms": 4.0, "group_latency_share": {"g": 0.5}},
            "ort_dynamic": {"backend": "onnxruntime", "total_ms": 2.0, "group_latency_share": {"g": 0.2}},
            "ov_int8": {"backend": "openvino", "error": "x"},
        }
    }
    assert planned_form(profile, "torch", 1.0) == "torch"
    assert planned_form(profile, "onnxruntime", 1.0) == "ort_dynamic"
    assert planned_form(profile, "auto", 1.0) == "torch"
    assert planned_form(profile, "auto", 9.0) == "ort_dynamic"
    # forms within 10% of the fastest are tied: the int8 form is read, whichever of them profiled faster this time
    close = {"forms": {**profile["forms"], "ort_fp32": {**profile["forms"]["ort_fp32"], "total_ms": 1.9}}}
    assert planned_form(close, "onnxruntime", 1.0) == "ort_dynamic"
    assert planned_form(close, "auto", 2.05) == "ort_dynamic" and planned_form(close, "auto", 1.5) == "torch"
    apart = {"forms": {**profile["forms"], "ort_fp32": {**profile["forms"]["ort_fp32"], "total_ms": 1.7}}}
    assert planned_form(apart, "onnxruntime", 1.0) == "ort_fp32"
    full = {"group_costs": {"g": {"latency_share": 0.6, "macs_share": 0.3}}, "backend_profile": profile}
    assert planning_costs(full)["g"]["latency_share"] == 0.6  # no planned form: the torch profile
    full["backend_profile"] = {**profile, "planned_on": "ort_dynamic"}
    costs = planning_costs(full)
    assert costs["g"]["latency_share"] == 0.2 and costs["g"]["torch_latency_share"] == 0.6
    assert full["group_costs"]["g"]["latency_share"] == 0.6  # the profile itself is not changed


def test_a_latency_table_of_the_planned_form_shapes_the_latency_estimate():
    from profiling_agent.tools.planning.deterministic import estimate_reduction

    groups = [{"name": n, "kind": "structured", "module": f"{n}.fc1", "units": 100, "min_units": 1} for n in ("g", "h")]
    table = {"form": "ort_dynamic", "ratios": [0.0, 0.5], "groups": {"g": [4.0, 1.0]}, "total_ms": [10.0, 7.0]}
    profile = {
        "group_costs": {"g": {"latency_share": 0.1}, "h": {"latency_share": 0.2}},
        "backend_profile": {
            "planned_on": "ort_dynamic",
            "forms": {"ort_dynamic": {"backend": "onnxruntime", "total_ms": 10.0, "group_latency_share": {"g": 0.4}}},
            "latency_table": table,
        },
    }
    costs = planning_costs(profile)
    assert costs["g"]["latency_curve"] == {"ratios": [0.0, 0.5], "saved_share": [0.0, pytest.approx(0.3)]}
    # g saves 30% of the latency at 0.5 (measured, not 0.5 x its 40% share); h has no curve: ratio x share
    assert estimate_reduction({"g": 0.5}, group_rows(groups, costs, {}), "latency") == pytest.approx(0.3)
    assert estimate_reduction({"h": 0.5}, group_rows(groups, costs, {}), "latency") == pytest.approx(
        0.0
    )  # h's share there is 0
    assert estimate_reduction({"g": 0.5}, group_rows(groups, costs, {}), "params") == pytest.approx(0.0)


def test_a_called_container_scope_is_not_doubled_in_the_module_path():
    """TorchScript names an nn.Sequential `layer` and its child `layer.0`: the module is `...layer.0`."""
    node = "/model/resnet/encoder/stages.0/layers.0/layer/layer.0/convolution/Conv"
    assert module_of(node) == "resnet.encoder.stages.0.layers.0.layer.0.convolution"
    assert module_of("/model/vit/layers.0/mlp/fc1/MatMul") == "vit.layers.0.mlp.fc1"


def test_openvino_node_names_map_to_module_paths():
    from profiling_agent.tools.profiling.openvino_profile import ov_module_of

    assert ov_module_of("/model/vit/layers.0/attention/q_proj/MatMul/DequantizationMultiply") == (
        "vit.layers.0.attention.q_proj"
    )
    assert ov_module_of("/model/vit/layers.1/mlp/activation_fn/Mul_1_0_0/nncf_smooth_quant") == (
        "vit.layers.1.mlp.activation_fn"
    )
    reorder = "/model/vit/embeddings/patch_embeddings/projection/Conv/WithoutBiases_acdb_abcd_/model/vit/Reshape"
    assert ov_module_of(reorder) == "vit.embeddings.patch_embeddings.projection"
    assert ov_module_of("/model/resnet/encoder/stages.0/layers.0/layer/layer.1/convolution/Conv") == (
        "resnet.encoder.stages.0.layers.0.layer.1.convolution"
    )
    for fused in ("Multiply_100413", "pixel_values_abcd_acdb_/model/vit/embeddings/Conv", "logits", "/model/vit"):
        assert ov_module_of(fused) == ""


def test_every_resnet_group_owns_backend_time(tiny_resnet):
    """ONNX Runtime names a fused Conv+BN+ReLU after its activation: the group still owns that time."""
    groups = [dataclasses.asdict(g) for g in adapter_for(tiny_resnet).prunable_groups(tiny_resnet)]
    out = profile_backends(tiny_resnet, torch.randn(1, 1, 16, 16), groups, ORT_FORMS[:1], repeats=3)
    shares = out["forms"]["ort_fp32"]["group_latency_share"]
    assert set(shares) == {g["name"] for g in groups} and all(s > 0 for s in shares.values()), shares


def test_openvino_forms_are_profiled_per_node_and_planned_on_under_openvino(tiny_vit):
    from profiling_agent.tools.profiling.deliverable import deliverable_forms
    from profiling_agent.tools.profiling.openvino_profile import OV_PROFILE_FORMS

    assert [f.name for f in deliverable_forms("openvino")[0]] == ["ov_fp32", "ov_int8"]
    assert [f.name for f in deliverable_forms("onnxruntime")[0]] == ["ort_fp32", "ort_dynamic"]
    assert len(deliverable_forms("auto")[0]) == 4 and deliverable_forms("torch") == ([], [])
    groups = [dataclasses.asdict(g) for g in adapter_for(tiny_vit).prunable_groups(tiny_vit)]
    out = profile_backends(tiny_vit, torch.randn(1, 1, 16, 16), groups, OV_PROFILE_FORMS, repeats=3)
    for name in ("ov_fp32", "ov_int8"):
        row = out["forms"][name]
        assert "error" not in row, row
        assert row["backend"] == "openvino" and row["total_ms"] > 0
        assert set(row["group_latency_share"]) == {g["name"] for g in groups}
        modules = {layer["name"] for layer in row["layers"]}  # the module paths survive NNCF and fusion
        for i in (0, 1):
            assert {f"vit.layers.{i}.mlp.fc1", f"vit.layers.{i}.attention.q_proj"} <= modules, modules
    assert planned_form(out, "openvino", torch_ms=1e9) in ("ov_fp32", "ov_int8")
    assert planned_form(out, "onnxruntime", torch_ms=1e9) == "torch"  # no ONNX Runtime form was profiled


def test_measured_savings_never_go_negative_or_backwards():
    from profiling_agent.tools.profiling.backend_profile import monotone_savings

    # a noisy table: the group looked slower at 25% and at 75% than at lower ratios
    assert monotone_savings([1.0, 1.1, 0.6, 0.8], base=10.0) == pytest.approx([0.0, 0.0, 0.04, 0.04])


def test_a_fast_form_averages_more_calls_per_sample():
    from profiling_agent.tools.profiling.node_samples import MAX_CALLS, SAMPLE_S, node_medians, sample_calls

    assert sample_calls(0.08) == 1  # a full-size ViT: one call a sample
    assert sample_calls(SAMPLE_S / 50) == 50  # a faster model: a sample still lasts SAMPLE_S
    assert sample_calls(0.05e-3) == MAX_CALLS == sample_calls(0.0)  # a 0.05 ms ResNet: capped
    # a 1.5 us node read by a microsecond timer (1 or 2), one call in eight preempted (50): the interquartile means
    # of 8 calls read 1.5; the old rule (the median of single calls) read 2
    runs = {"n": [9.0] * 3 + [1.0, 2.0, 1.0, 2.0, 1.0, 2.0, 1.0, 50.0] * 4}  # three warm-up runs, 4 samples of 8
    assert node_medians(runs, calls=8, samples=4) == {"n": pytest.approx(1.5)}
    assert node_medians(runs, calls=1, samples=5) == {"n": 2.0}
