"""Tests of the DeiT and Swin family adapters: groups, protection, head-bias pruning, fix-ups, pruned == masked."""

from __future__ import annotations

import re

import pytest
import torch
from helpers.tiny import random_deit as _deit
from helpers.tiny import random_swin as _swin
from helpers.toy_models import all_logits
from torch import nn
from transformers import DeiTForImageClassification, DeiTForImageClassificationWithTeacher

from profiling_agent.tools.compression.families.base import PrunableGroup
from profiling_agent.tools.compression.families.deit import DeiTAdapter
from profiling_agent.tools.compression.families.swin import SwinAdapter

DEIT_SHAPE = (2, 3, 16, 16)
SWIN_SHAPE = (2, 3, 32, 32)


# ---------------------------------------------------------------- tiny models


@pytest.fixture
def deit_plain():
    return _deit(DeiTForImageClassification)


@pytest.fixture
def deit_teacher():
    return _deit(DeiTForImageClassificationWithTeacher)


@pytest.fixture
def swin():
    return _swin()


def _pixels(shape) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(3))


_outputs = all_logits


def _max_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max((x - y).abs().max().item() for x, y in zip(a, b, strict=True))


# ---------------------------------------------------------------- reference pruning and masking (by hand)


def _channels(group: PrunableGroup, units: list[int]) -> list[int]:
    return [u * group.unit_size + j for u in units for j in range(group.unit_size)]


def _consumers(model: nn.Module, group: PrunableGroup) -> list[str]:
    """Members that read the roots' outputs: o_proj for heads, fc2 for MLPs."""
    return [m for m in group.members if m not in group.roots and isinstance(model.get_submodule(m), nn.Linear)]


def _slice_linear(linear: nn.Linear, keep: list[int], dim: int) -> None:
    idx = torch.tensor(keep, dtype=torch.long)
    linear.weight = nn.Parameter(linear.weight.detach().index_select(dim, idx).clone())
    if dim == 0 and linear.bias is not None:
        linear.bias = nn.Parameter(linear.bias.detach()[idx].clone())
    if dim == 0:
        linear.out_features = len(keep)
    else:
        linear.in_features = len(keep)


def prune_by_hand(model, adapter, removals: dict[str, list[int]]) -> dict:
    """Remove the given units of each named group by slicing weights, the way the engine should."""
    for group in adapter.prunable_groups(model):
        remove = removals.get(group.name, [])
        keep = _channels(group, [u for u in range(group.units) if u not in remove])
        if group.kind == "head" and remove:
            adapter.before_head_prune(model, group, remove)
        for root in group.roots:
            _slice_linear(model.get_submodule(root), keep, dim=0)
        for consumer in _consumers(model, group):
            _slice_linear(model.get_submodule(consumer), keep, dim=1)
    return adapter.fix_up(model)


def mask_by_hand(model, adapter, removals: dict[str, list[int]]) -> None:
    """Zero the consumer's input columns of the given units: the unit contributes nothing downstream."""
    with torch.no_grad():
        for group in adapter.prunable_groups(model):
            cols = _channels(group, removals.get(group.name, []))
            for consumer in _consumers(model, group):
                model.get_submodule(consumer).weight[:, cols] = 0.0


def _removals(adapter, model, head_frac: float, mlp_frac: float, seed: int) -> dict[str, list[int]]:
    """Pick seeded random units per group: round(frac * units), always leaving at least one."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for group in adapter.prunable_groups(model):
        frac = head_frac if group.kind == "head" else mlp_frac
        count = min(round(frac * group.units), group.units - 1)
        out[group.name] = sorted(torch.randperm(group.units, generator=gen)[:count].tolist())
    return out


def _n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


# ---------------------------------------------------------------- matching, groups, protection


def test_matches_only_own_family(deit_plain, deit_teacher, swin, tiny_vit, tiny_resnet):
    deit, sw = DeiTAdapter(), SwinAdapter()
    assert deit.name == "deit" and sw.name == "swin"
    assert deit.matches(deit_plain) and deit.matches(deit_teacher)
    assert sw.matches(swin)
    for other in (swin, tiny_vit, tiny_resnet):
        assert not deit.matches(other)
    for other in (deit_plain, deit_teacher, tiny_vit, tiny_resnet):
        assert not sw.matches(other)


@pytest.mark.parametrize("cls", [DeiTForImageClassification, DeiTForImageClassificationWithTeacher])
def test_deit_groups_match_architecture(cls):
    model = _deit(cls)
    groups = DeiTAdapter().prunable_groups(model)
    assert [g.name for g in groups] == ["layers.0.heads", "layers.0.mlp", "layers.1.heads", "layers.1.mlp"]
    heads = groups[2]
    assert (heads.kind, heads.units, heads.unit_size, heads.min_units) == ("head", 4, 8, 1)
    assert heads.module == "deit.layers.1.attention"
    assert heads.roots == tuple(f"deit.layers.1.attention.{p}_proj" for p in "qkv")
    mlp = groups[3]
    assert (mlp.kind, mlp.units, mlp.unit_size, mlp.module) == ("structured", 64, 1, "deit.layers.1.mlp.fc1")
    assert mlp.members == ("deit.layers.1.mlp.fc1", "deit.layers.1.mlp.fc2")
    # A plan regex like the planner writes selects exactly one group.
    assert [g.name for g in groups if re.search(r"layers\.1\.mlp", g.module)] == ["layers.1.mlp"]
    for g in groups:
        for root in g.roots:
            assert model.get_submodule(root).out_features == g.units * g.unit_size


def test_swin_groups_match_architecture(swin):
    groups = SwinAdapter().prunable_groups(swin)
    names = [g.name for g in groups]
    assert names == [f"stages.{s}.blocks.{b}.{k}" for s in (0, 1) for b in (0, 1) for k in ("heads", "mlp")]
    by_name = {g.name: g for g in groups}
    # stage 0: dim 16, 2 heads of 8, MLP 4*16; stage 1: dim 32, 4 heads of 8, MLP 4*32.
    assert (by_name["stages.0.blocks.1.heads"].units, by_name["stages.0.blocks.1.heads"].unit_size) == (2, 8)
    assert (by_name["stages.1.blocks.0.heads"].units, by_name["stages.1.blocks.0.heads"].unit_size) == (4, 8)
    assert by_name["stages.0.blocks.0.mlp"].units == 64 and by_name["stages.1.blocks.1.mlp"].units == 128
    heads = by_name["stages.1.blocks.1.heads"]
    assert heads.module == "swin.encoder.layers.1.blocks.1.attention"
    table = swin.get_parameter(heads.extra["per_head_params"][0])
    assert table.shape == (7 * 7, 4)
    for g in groups:
        for name in g.members:
            swin.get_submodule(name)  # every member resolves
        for root in g.roots:
            assert swin.get_submodule(root).out_features == g.units * g.unit_size


def test_deit_protects_embeddings_norms_and_both_heads(deit_teacher):
    adapter = DeiTAdapter()
    protected = set(adapter.protected_modules(deit_teacher))
    expected = {
        "deit.embeddings",
        "deit.embeddings.patch_embeddings.projection",
        "deit.layernorm",
        "cls_classifier",
        "distillation_classifier",
    }
    assert expected <= protected
    norms = {n for n, m in deit_teacher.named_modules() if isinstance(m, nn.LayerNorm)}
    assert len(norms) == 5 and norms <= protected
    # cls and distillation tokens live directly in the protected embeddings module.
    assert {"cls_token", "distillation_token", "position_embeddings"} <= {
        n for n, _ in deit_teacher.get_submodule("deit.embeddings").named_parameters(recurse=False)
    }
    members = {m for g in adapter.prunable_groups(deit_teacher) for m in g.members}
    assert not members & protected
    assert "classifier" in adapter.protected_modules(_deit(DeiTForImageClassification))


def test_swin_protects_patch_merging_norms_and_classifier(swin):
    adapter = SwinAdapter()
    protected = set(adapter.protected_modules(swin))
    merging = {
        "swin.encoder.layers.0.downsample",
        "swin.encoder.layers.0.downsample.reduction",
        "swin.encoder.layers.0.downsample.norm",
    }
    assert merging <= protected
    assert swin.get_submodule("swin.encoder.layers.0.downsample.reduction").in_features == 4 * 16
    assert {"swin.embeddings.patch_embeddings.projection", "swin.layernorm", "classifier"} <= protected
    norms = {n for n, m in swin.named_modules() if isinstance(m, nn.LayerNorm)}
    assert norms <= protected
    roots_and_consumers = {
        m for g in adapter.prunable_groups(swin) for m in g.members if m.endswith(("proj", "fc1", "fc2"))
    }
    assert not roots_and_consumers & protected


# ---------------------------------------------------------------- reference pruning vs masking


MODELS = {
    "deit": lambda: (_deit(DeiTForImageClassification), DeiTAdapter(), DEIT_SHAPE),
    "deit_teacher": lambda: (_deit(DeiTForImageClassificationWithTeacher), DeiTAdapter(), DEIT_SHAPE),
    "deit_eager": lambda: (_deit(DeiTForImageClassification, attn="eager"), DeiTAdapter(), DEIT_SHAPE),
    "swin": lambda: (_swin(), SwinAdapter(), SWIN_SHAPE),
    "swin_eager": lambda: (_swin(attn="eager"), SwinAdapter(), SWIN_SHAPE),
    "swin_window2": lambda: (_swin(heads=(4, 8), depths=(1, 1), window=2), SwinAdapter(), SWIN_SHAPE),
}


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_removing_nothing_is_bit_identical(kind):
    model, adapter, shape = MODELS[kind]()
    pixels = _pixels(shape)
    before = _outputs(model, pixels)
    fixed = prune_by_hand(model, adapter, {})
    after = _outputs(model, pixels)
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
    assert len(fixed) == len([g for g in adapter.prunable_groups(model) if g.kind == "head"])


@pytest.mark.parametrize("kind", sorted(MODELS))
@pytest.mark.parametrize(("head_frac", "mlp_frac"), [(0.25, 0.1), (0.5, 0.3), (0.75, 0.6)])
def test_pruned_equals_masked(kind, head_frac, mlp_frac):
    pruned, adapter, shape = MODELS[kind]()
    masked, _, _ = MODELS[kind]()
    pixels = _pixels(shape)
    original = _outputs(pruned, pixels)
    removals = _removals(adapter, pruned, head_frac, mlp_frac, seed=4)
    groups = {g.name: g for g in adapter.prunable_groups(pruned)}
    assert any(removals.values())

    mask_by_hand(masked, adapter, removals)
    expected = _outputs(masked, pixels)
    fixed = prune_by_hand(pruned, adapter, removals)
    got = _outputs(pruned, pixels)

    assert _max_diff(expected, original) > 1e-3  # masking matters, so the comparison below can fail
    assert _max_diff(got, expected) < 1e-5
    # Shapes and cached head counts follow the removals exactly.
    for name, group in groups.items():
        left = group.units - len(removals[name])
        after = {g.name: g for g in adapter.prunable_groups(pruned)}[name]
        assert after.units == left
        if group.kind == "head":
            assert fixed[group.module]["num_attention_heads"] == left
            assert pruned.get_submodule(group.module).num_attention_heads == left
            assert pruned.get_submodule(group.module).scaling == pytest.approx(group.unit_size**-0.5)


def _expected_removed_params(model, adapter, removals) -> int:
    """Count the parameters the removals free, from the group sizes alone."""
    total = 0
    for g in adapter.prunable_groups(model):
        n = len(removals.get(g.name, []))
        channels = n * g.unit_size
        hidden = model.get_submodule(g.roots[0]).in_features
        if g.kind == "head":
            total += 3 * channels * (hidden + 1) + hidden * channels  # q/k/v rows (+bias), o_proj columns
            total += sum(model.get_parameter(p).shape[0] * n for p in g.extra.get("per_head_params", []))
        else:
            total += channels * (hidden + 1) + hidden * channels  # fc1 rows (+bias), fc2 columns
    return total


@pytest.mark.parametrize("kind", ["deit_teacher", "swin"])
def test_parameter_count_drops_by_expected_amount(kind):
    model, adapter, _ = MODELS[kind]()
    removals = _removals(adapter, model, 0.5, 0.3, seed=5)
    expected = _expected_removed_params(model, adapter, removals)
    before = _n_params(model)
    prune_by_hand(model, adapter, removals)
    assert before - _n_params(model) == expected > 0


# ---------------------------------------------------------------- Swin bias table


def test_swin_before_head_prune_drops_exact_table_columns(swin):
    adapter = SwinAdapter()
    group = {g.name: g for g in adapter.prunable_groups(swin)}["stages.1.blocks.1.heads"]
    table = swin.get_parameter(group.extra["per_head_params"][0])
    original = table.detach().clone()
    adapter.before_head_prune(swin, group, [3, 1])
    same = swin.get_parameter(group.extra["per_head_params"][0])
    assert same is table  # the Parameter object survives (a built DependencyGraph may hold it)
    assert torch.equal(same.detach(), original[:, [0, 2]])


def test_swin_wrong_table_columns_change_outputs(swin):
    adapter = SwinAdapter()
    pixels = _pixels(SWIN_SHAPE)
    removals = {"stages.1.blocks.0.heads": [1]}
    masked = _swin()
    mask_by_hand(masked, adapter, removals)
    expected = _outputs(masked, pixels)

    # Prune q/k/v/o for head 1 but drop the table column of head 0: outputs must no longer match.
    group = {g.name: g for g in adapter.prunable_groups(swin)}["stages.1.blocks.0.heads"]
    adapter.before_head_prune(swin, group, [0])
    keep = _channels(group, [0, 2, 3])
    for root in group.roots:
        _slice_linear(swin.get_submodule(root), keep, dim=0)
    _slice_linear(swin.get_submodule(f"{group.module}.o_proj"), keep, dim=1)
    adapter.fix_up(swin)
    assert _max_diff(_outputs(swin, pixels), expected) > 1e-3


def test_swin_fix_up_rejects_stale_bias_table(swin):
    adapter = SwinAdapter()
    group = adapter.prunable_groups(swin)[0]
    keep = _channels(group, [0])
    for root in group.roots:
        _slice_linear(swin.get_submodule(root), keep, dim=0)
    _slice_linear(swin.get_submodule(f"{group.module}.o_proj"), keep, dim=1)
    with pytest.raises(ValueError, match="bias table has 2 head columns"):
        adapter.fix_up(swin)


@pytest.mark.parametrize("bad", [[0, 1], [2], [1, 1], [-1]])
def test_swin_before_head_prune_rejects_bad_indices(swin, bad):
    adapter = SwinAdapter()
    group = adapter.prunable_groups(swin)[0]  # 2 heads
    table = swin.get_parameter(group.extra["per_head_params"][0]).detach().clone()
    with pytest.raises(ValueError):
        adapter.before_head_prune(swin, group, bad)
    assert torch.equal(swin.get_parameter(group.extra["per_head_params"][0]).detach(), table)


def test_deit_fix_up_rejects_inconsistent_projections(deit_plain):
    adapter = DeiTAdapter()
    _slice_linear(deit_plain.get_submodule("deit.layers.0.attention.q_proj"), list(range(24)), dim=0)
    with pytest.raises(ValueError, match="inconsistent attention widths"):
        adapter.fix_up(deit_plain)


# ---------------------------------------------------------------- with torch-pruning's DependencyGraph directly


def _dg_prune(model, adapter, removals, shape, ignore_per_head: bool = True) -> dict:
    """Prune like the engine: DG propagates each root's channels; per-head tensors are the adapter's job."""
    import torch_pruning as tp

    groups = adapter.prunable_groups(model)
    per_head = [model.get_parameter(p) for g in groups for p in g.extra.get("per_head_params", [])]
    graph = tp.DependencyGraph().build_dependency(
        model,
        example_inputs=_pixels(shape),
        forward_fn=lambda m, x: m(pixel_values=x).logits,
        ignored_params=per_head if ignore_per_head else None,
        verbose=False,
    )
    for g in groups:
        remove = removals.get(g.name, [])
        if not remove:
            continue
        if g.kind == "head":
            adapter.before_head_prune(model, g, remove)
        root = model.get_submodule(g.roots[0])
        graph.get_pruning_group(root, tp.prune_linear_out_channels, idxs=_channels(g, remove)).prune()
    return adapter.fix_up(model)


@pytest.mark.parametrize("kind", ["deit_teacher", "swin"])
def test_dependency_graph_pruning_equals_masked(kind):
    model, adapter, shape = MODELS[kind]()
    masked, _, _ = MODELS[kind]()
    pixels = _pixels(shape)
    removals = _removals(adapter, model, 0.5, 0.3, seed=6)
    mask_by_hand(masked, adapter, removals)
    _dg_prune(model, adapter, removals, shape)
    for g in adapter.prunable_groups(model):  # q, k, v and o_proj all shrank together
        attn_or_mlp = model.get_submodule(g.roots[0])
        assert attn_or_mlp.out_features == g.units * g.unit_size
    assert _max_diff(_outputs(model, pixels), _outputs(masked, pixels)) < 1e-5


def test_dependency_graph_must_ignore_swin_bias_tables(swin):
    """The DG links q/k/v channels to the bias table (heads) and would prune its columns by channel index."""
    adapter = SwinAdapter()
    # Head 0 is channels 0..7: an unignored table loses columns 0..7 (all 3 left), which fix_up catches.
    with pytest.raises(ValueError, match="bias table has 0 head columns"):
        _dg_prune(swin, adapter, {"stages.1.blocks.0.heads": [0]}, SWIN_SHAPE, ignore_per_head=False)


# ---------------------------------------------------------------- the real engine (tools/compression/pruning.py)


ENGINE_MODELS = {
    "deit": lambda: (_deit(DeiTForImageClassification), DEIT_SHAPE),
    "deit_teacher": lambda: (_deit(DeiTForImageClassificationWithTeacher), DEIT_SHAPE),
    "swin": lambda: (_swin(), SWIN_SHAPE),
    "swin_4_8_heads": lambda: (_swin(heads=(4, 8), depths=(1, 1), window=2), SWIN_SHAPE),
}


def _engine_entries(ratio: float) -> list[dict]:
    return [{"layer": ".", "type": "head", "ratio": ratio}, {"layer": ".", "type": "structured", "ratio": ratio}]


@pytest.mark.parametrize("kind", sorted(ENGINE_MODELS))
def test_engine_picks_our_adapter(kind):
    from profiling_agent.tools.compression.families import adapter_for

    model, _ = ENGINE_MODELS[kind]()
    assert adapter_for(model).name == kind.split("_")[0]


@pytest.mark.parametrize("kind", sorted(ENGINE_MODELS))
@pytest.mark.parametrize("ratio", [0.0, 0.005])  # floor(128 * 0.005) == 0
def test_engine_zero_removal_is_bit_identical(kind, ratio):
    from profiling_agent.tools.compression.pruning import prune_model

    model, shape = ENGINE_MODELS[kind]()
    pixels = _pixels(shape)
    before, n_params = _outputs(model, pixels), _n_params(model)
    report = prune_model(model, _engine_entries(ratio), _pixels(shape))
    assert all(row.removed == [] for row in report.applied)
    assert _n_params(model) == n_params
    assert all(torch.equal(a, b) for a, b in zip(before, _outputs(model, pixels), strict=True))


@pytest.mark.parametrize("kind", sorted(ENGINE_MODELS))
@pytest.mark.parametrize("ratio", [0.1, 0.3])
def test_engine_pruning_equals_masked(kind, ratio):
    from profiling_agent.tools.compression.pruning import prune_model
    from profiling_agent.tools.compression.self_check import self_check

    model, shape = ENGINE_MODELS[kind]()
    masked, _ = ENGINE_MODELS[kind]()
    pixels = _pixels(shape)
    original = _outputs(model, pixels)
    adapter = DeiTAdapter() if kind.startswith("deit") else SwinAdapter()
    groups = {g.name: g for g in adapter.prunable_groups(model)}

    report = prune_model(model, _engine_entries(ratio), _pixels(shape))
    removals = {row.group: row.removed for row in report.applied}
    assert set(removals) == set(groups)
    for name, group in groups.items():  # floor(units * ratio) units go, at least one stays
        assert len(removals[name]) == min(int(group.units * ratio + 1e-9), group.units - 1)
    assert sum(map(len, removals.values())) > 0
    assert report.params_before - report.params_after == _expected_removed_params(masked, adapter, removals)

    mask_by_hand(masked, adapter, removals)
    expected = _outputs(masked, pixels)
    assert _max_diff(expected, original) > 1e-3
    assert _max_diff(_outputs(model, pixels), expected) < 1e-5
    for name, group in groups.items():
        if group.kind == "head":
            heads = group.units - len(removals[name])
            assert report.attrs[group.module]["num_attention_heads"] == heads
            if kind.startswith("swin"):
                table = model.get_parameter(group.extra["per_head_params"][0])
                keep = [h for h in range(group.units) if h not in removals[name]]
                assert torch.equal(table.detach(), masked.get_parameter(group.extra["per_head_params"][0])[:, keep])
    self_check(model, pixels, num_labels=5)


@pytest.mark.parametrize("kind", ["deit_teacher", "swin"])
def test_engine_pruned_model_round_trips_through_artifact(kind, tmp_path):
    """fix_up's attrs plus the stored shapes (incl. Swin's narrowed bias tables) rebuild the same model."""
    from profiling_agent.tools.compression.pruning import prune_model
    from profiling_agent.tools.models.artifact_load import load_artifact
    from profiling_agent.tools.models.artifacts import save_artifact

    model, shape = ENGINE_MODELS[kind]()
    report = prune_model(model, _engine_entries(0.3), _pixels(shape))
    save_artifact(model, tmp_path / "pruned", attrs=report.attrs)
    loaded = load_artifact(tmp_path / "pruned").model
    for module, attrs in report.attrs.items():
        for attr, value in attrs.items():
            assert getattr(loaded.get_submodule(module), attr) == value
    pixels = _pixels(shape)
    assert _max_diff(_outputs(loaded, pixels), _outputs(model, pixels)) < 1e-6
