"""The profile builds and compiles each file once: the profiled form is ratio 0 and rate 0; a file compiles once."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
from helpers.tiny import seeded, vit_config

from profiling_agent.tools.profiling.openvino_profile import OV_PROFILE_FORMS
from profiling_agent.tools.runtimes.kept_compiled import compile_file, kept_compiled
from profiling_agent.tools.runtimes.openvino_model import compile_config


def _vit():
    from transformers import ViTForImageClassification

    return seeded(ViTForImageClassification, vit_config(num_channels=3, image_size=32, num_hidden_layers=1))


def _counting(form, built: list[str]):
    """`form` whose builds are counted by folder name."""

    def build(model, example, folder: Path) -> Path:
        built.append(folder.name)
        return form.build(model, example, folder)

    return dataclasses.replace(form, build=build)


def test_the_table_and_the_token_rates_time_the_profiled_build_as_ratio_0_and_rate_0(tmp_path):
    from profiling_agent.tools.profiling.latency_model import measure_table
    from profiling_agent.tools.profiling.token_latency import measure_token_latency

    model, example = _vit().eval(), torch.randn(1, 3, 32, 32)
    fp32 = next(f for f in OV_PROFILE_FORMS if f.name == "ov_fp32")
    base = fp32.build(model, example, tmp_path / "profiled")
    built: list[str] = []
    with kept_compiled():
        table = measure_table(
            model, example, _counting(fp32, built), ratios=(0.0, 0.5), folder=tmp_path, base_path=base
        )
        tokens = measure_token_latency(model, example, _counting(fp32, built), tmp_path, rates=[8], base_path=base)
    assert built == ["r50", "tokens1", "tokens2"]  # neither ratio 0 nor rate 0 built again
    assert len(table["total_ms"]) == 2 and all(t > 0 for t in table["total_ms"])
    assert [r["rate"] for r in tokens["rates"]] == [0, 8, None] and tokens["base_ms"] > 0
    built.clear()  # without the profiled build, both are built as before
    measure_table(model, example, _counting(fp32, built), ratios=(0.0, 0.5), folder=tmp_path / "again")
    assert built == ["r00", "r50"]


def test_a_file_compiles_once_inside_the_block_within_its_weight_limit_and_again_when_it_changes(tmp_path):
    model, example = _vit().eval(), torch.randn(1, 3, 32, 32)
    fp32 = next(f for f in OV_PROFILE_FORMS if f.name == "ov_fp32")
    path = fp32.build(model, example, tmp_path / "a")
    config = compile_config("f32", 1)
    assert compile_file(path, (1, 3, 32, 32), config) is not compile_file(path, (1, 3, 32, 32), config)
    with kept_compiled():
        first = compile_file(path, (1, 3, 32, 32), config)
        assert compile_file(path, (1, 3, 32, 32), config) is first
        assert compile_file(path, (1, 3, 32, 32), {**config, "PERF_COUNT": "YES"}) is not first  # other settings
        with kept_compiled():  # a nested block shares the outer one
            assert compile_file(path, (1, 3, 32, 32), config) is first
        fp32.build(model.train(False), example, tmp_path / "a")  # the file rewritten: compiled anew
        assert compile_file(path, (1, 3, 32, 32), config) is not first
    with kept_compiled(limit_bytes=0):  # over the limit: compiled per call, as outside a block
        assert compile_file(path, (1, 3, 32, 32), config) is not compile_file(path, (1, 3, 32, 32), config)
    out = compile_file(path, (1, 3, 32, 32), config).create_infer_request().infer({0: example.numpy()})
    assert torch.allclose(torch.from_numpy(next(iter(out.values()))), model(pixel_values=example).logits, atol=1e-3)
