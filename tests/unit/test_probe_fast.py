"""The fast sensitivity probe measures what the full probe measures, from the pruned block onward only."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from profiling_agent.tools.compression.families import adapter_for
from profiling_agent.tools.profiling.probe_fast import FastProbeConfig, probe_groups
from profiling_agent.tools.profiling.sensitivity import ProbeRun, probe_groups_full

EXACT = FastProbeConfig(eval_images=0, max_rows=4096, float32_gram=False)  # the full probe's images and rows


def _pixels(model, n=48):
    channels = model.config.num_channels
    return torch.randn(n, channels, 16, 16, generator=torch.Generator().manual_seed(3))


def _ranks(values):
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0] * len(values)
    for r, i in enumerate(order):
        ranks[i] = r
    return ranks


def _spearman(a, b):
    ra, rb = _ranks(a), _ranks(b)
    n = len(a)
    return 1 - 6 * sum((x - y) ** 2 for x, y in zip(ra, rb, strict=True)) / (n * (n * n - 1))


@pytest.mark.parametrize("fixture", ["tiny_vit", "tiny_resnet"])
@pytest.mark.parametrize("recover", [False, True])
def test_fast_probe_matches_the_full_probe_group_by_group(fixture, recover, request):
    model = request.getfixturevalue(fixture)
    groups = adapter_for(model).prunable_groups(model)
    pixels = _pixels(model)
    labels = torch.randint(0, 10, (len(pixels),), generator=torch.Generator().manual_seed(4))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    full = probe_groups_full(model, groups, pixels, labels, ratio=0.5, recover=recover)
    fast = probe_groups(model, groups, pixels, labels, ratio=0.5, recover=recover, config=EXACT)
    assert list(fast) == list(full)
    for name, row in full.items():
        got = fast[name]
        assert got["fast"] is True and "error" not in got, got
        # tolerance: float32 rounding of masked-vs-removed channels and of the refit (relative 1e-3 of the damage)
        assert got["damage"] == pytest.approx(row["damage"], rel=1e-3, abs=1e-7), name
        assert got["kl"] == pytest.approx(row["kl"], rel=1e-3, abs=1e-7), name
        assert got["agreement"] == row["agreement"] and got["acc_drop"] == row["acc_drop"], name
        assert got["units_removed"] == row["units_removed"] and got["ratio"] == row["ratio"]
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())  # the baseline is untouched


@pytest.mark.parametrize("fixture", ["tiny_vit", "tiny_resnet"])
def test_fast_probe_defaults_rank_groups_like_the_full_probe(fixture, request):
    model = request.getfixturevalue(fixture)
    groups = adapter_for(model).prunable_groups(model)
    pixels = _pixels(model, 64)
    full = probe_groups_full(model, groups, pixels, ratio=0.5, recover=True)
    fast = probe_groups(model, groups, pixels, ratio=0.5, recover=True)  # 16 images, 2048 rows, float32
    a = [full[g.name]["damage"] for g in groups]
    b = [fast[g.name]["damage"] for g in groups]
    assert _spearman(a, b) >= 0.8, (a, b)
    assert max(a) == pytest.approx(max(b), rel=0.5)


def test_groups_without_a_block_go_through_the_full_probe(tiny_vit):
    groups = adapter_for(tiny_vit).prunable_groups(tiny_vit)
    loose = [dataclasses.replace(groups[0], block=""), *groups[1:]]
    pixels = _pixels(tiny_vit, 16)
    out = probe_groups(tiny_vit, loose, pixels, ratio=0.5, config=EXACT)
    full = probe_groups_full(tiny_vit, loose[:1], pixels, ratio=0.5)
    assert out[groups[0].name]["fast"] is False
    assert out[groups[0].name]["damage"] == pytest.approx(full[groups[0].name]["damage"])
    assert all(out[g.name]["fast"] for g in groups[1:])


def test_progress_reports_every_group(tiny_resnet):
    groups = adapter_for(tiny_resnet).prunable_groups(tiny_resnet)
    seen = []
    probe_groups(
        tiny_resnet, groups, _pixels(tiny_resnet, 8), run=ProbeRun(progress=lambda d, t, n: seen.append((d, t, n)))
    )
    assert seen == [(i + 1, len(groups), g.name) for i, g in enumerate(groups)]


def test_the_probes_refit_is_the_recovery_refit_on_the_same_activations(tiny_vit):
    """One ridge refit (`recovery.ridge`): the probe predicts exactly the weights the recover step will write."""
    import copy

    from profiling_agent.tools.compression.pruning import prune_model
    from profiling_agent.tools.profiling.probe_fast import GramStats, refit_masked
    from profiling_agent.tools.recovery.reconstruct import RefitSettings, find_consumers, reconstruct

    group = next(g for g in adapter_for(tiny_vit).prunable_groups(tiny_vit) if g.kind == "structured")
    pixels = _pixels(tiny_vit, 24)
    pruned = copy.deepcopy(tiny_vit)
    report = prune_model(pruned, [{"layer": f"^{group.module}$", "type": group.kind, "ratio": 0.5}], pixels[:1])
    (row,) = [r for r in report.applied if r.removed]
    (consumer,) = find_consumers(tiny_vit, pruned, [row])
    reconstruct(tiny_vit, pruned, pixels, report.applied, refit=RefitSettings(max_rows=10**6), by_blocks=False)

    stats = GramStats(tiny_vit.get_submodule(consumer.name), 0, FastProbeConfig(max_rows=10**6))
    hook = tiny_vit.get_submodule(consumer.name).register_forward_hook(lambda m, a, out: stats.add(a[0], out))
    with torch.inference_mode():
        tiny_vit(pixel_values=pixels)
    hook.remove()
    probed = copy.deepcopy(tiny_vit)
    channels = [u * group.unit_size + j for u in row.removed for j in range(group.unit_size)]
    before, after = refit_masked(probed, consumer.name, stats, channels)
    assert after < before

    kept = [c for c in range(group.units * group.unit_size) if c not in set(channels)]
    mine, theirs = probed.get_submodule(consumer.name), pruned.get_submodule(consumer.name)
    assert torch.allclose(mine.weight[:, kept], theirs.weight, rtol=1e-4, atol=1e-5)
    assert torch.allclose(mine.bias, theirs.bias, rtol=1e-4, atol=1e-5)
    assert not mine.weight[:, channels].any()  # the removed columns stay zero
