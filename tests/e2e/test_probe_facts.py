"""A group the probe cannot prune and a model ptflops cannot count are recorded facts; the run goes on."""

from __future__ import annotations

import pytest
import torch
from helpers.quick_assets import FAST_LATENCY, cache_env
from helpers.tiny import digit_labels, vit_config

from profiling_agent.graph.builder import build_graph
from profiling_agent.state import Context, GroupSensitivity, ProfileSummary

FAST = {**FAST_LATENCY, "recover": "none", "backend": "torch"}  # the probe and the profile are under test


def _one_head_vit():
    """A 2-layer ViT with one attention head per layer: the probe cannot remove a head of a one-head layer."""
    from transformers import ViTForImageClassification

    return ViTForImageClassification(vit_config(image_size=32, patch_size=8, num_attention_heads=1, **digit_labels()))


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    """The digits dataset and the one-head ViT, trained one epoch (save_pretrained + processor)."""
    from profiling_agent.tools.models import embedded

    root = tmp_path_factory.mktemp("facts")
    with cache_env(root / "cache"):
        dataset = embedded.ensure_dataset()
        torch.manual_seed(0)
        embedded.train_model(_one_head_vit(), root / "vit", embedded.TrainConfig(epochs=1, lr=2e-3, threads=1))
    return dataset, root / "vit"


def _run(tmp_path, assets):
    dataset, model = assets
    inputs = {
        "model": str(model),
        "dataset": {"ref": str(dataset), "subset": 64, "test_subset": 32, "calibration": 16},
        "objective": {"planner": "deterministic", "iterations": 1, "quantize": "none"},
    }
    return build_graph().invoke(inputs, context=Context(run_root=str(tmp_path), **FAST))


@pytest.mark.slow
def test_a_group_the_probe_cannot_prune_is_recorded_and_left_out(tmp_path, assets, monkeypatch):
    import profiling_agent.tools.compression.pruning as pruning
    from profiling_agent.tools.compression.units import PruneError

    real = pruning.prune_model

    def engine(model, entries, example, **kwargs):  # the engine fails on layer 1's MLP, wherever it is asked
        if any("layers\\.1\\.mlp" in str(dict(e)["layer"]) for e in entries):
            raise PruneError("group layers.1.mlp: couples to a protected module")
        return real(model, entries, example, **kwargs)

    monkeypatch.setattr(pruning, "prune_model", engine)
    out = _run(tmp_path, assets)
    assert out["status"] == "done"
    probed = {name: GroupSensitivity.model_validate(row) for name, row in out["sensitivity"].items()}
    heads = [name for name in probed if name.endswith("heads")]
    assert heads and all("removes none of its 1 units" in (probed[h].error or "") for h in heads)
    mlp = probed["layers.1.mlp"]
    assert mlp.error == "PruneError: group layers.1.mlp: couples to a protected module" and mlp.kl is None
    assert probed["layers.0.mlp"].error is None and probed["layers.0.mlp"].kl is not None
    measured = max(r.damage for r in probed.values() if r.error is None)
    assert mlp.damage == pytest.approx(10 * measured, rel=0.1)  # the most sensitive, finite (state rounds)
    message = next(e["message"] for e in out["history"] if e["node"] == "probe_sensitivity")
    assert "3 unprunable" in message and "layers.1.mlp (PruneError" in message
    planned = [entry["layer"] for c in out["candidates"] for entry in c["plan"]["pruning"]]
    assert planned and not any("heads" in p or "layers\\.1\\.mlp" in p for p in planned)


@pytest.mark.slow
def test_a_model_ptflops_cannot_count_runs_with_macs_unknown(tmp_path, assets, monkeypatch):
    _ptflops_fails(monkeypatch)
    out = _run(tmp_path, assets)
    assert out["status"] == "done"
    profile = ProfileSummary.model_validate(out["profile"])
    assert profile.totals["macs"] is None and profile.error is not None and "boom" in profile.error
    message = next(e["message"] for e in out["history"] if e["node"] == "profile")
    assert "MACs unknown (ptflops failed" in message


def _ptflops_fails(monkeypatch):
    import ptflops

    def fails(*args, **kwargs):  # what ptflops does when a hook or the forward raises: print, return None
        print("Flops estimation was not finished successfully because of the following exception: boom")
        return None, None

    monkeypatch.setattr(ptflops, "get_model_complexity_info", fails)


def test_probe_rows_of_unprunable_groups_are_valid_state(tiny_vit, monkeypatch):
    import profiling_agent.tools.compression.pruning as pruning
    from profiling_agent.tools.compression.families import adapter_for
    from profiling_agent.tools.profiling.sensitivity import probe_groups_full

    def engine(model, entries, example, **kwargs):
        raise RuntimeError("traced graph has a cycle\nsecond line")

    groups = adapter_for(tiny_vit).prunable_groups(tiny_vit)
    monkeypatch.setattr(pruning, "prune_model", engine)
    rows = probe_groups_full(tiny_vit, groups[:2], torch.randn(4, 1, 16, 16))  # no labels: no acc_drop either
    for row in rows.values():
        fact = GroupSensitivity.model_validate(row)
        assert fact.error == "RuntimeError: traced graph has a cycle" and fact.kl is None
        assert fact.damage == 1.0  # nothing was measured: the cap falls back to 1 (finite JSON)


def test_uncountable_macs_make_a_valid_profile_summary(tiny_vit, monkeypatch):
    from profiling_agent.tools.profiling.summary import planner_profile, summarize_profile

    _ptflops_fails(monkeypatch)
    full = planner_profile(tiny_vit, (1, 16, 16))
    summary = ProfileSummary.model_validate(summarize_profile(full, full["groups"]))
    assert summary.totals["macs"] is None and summary.totals["params"] > 0
    assert summary.error and summary.error.startswith("ptflops failed: Flops estimation was not finished")
