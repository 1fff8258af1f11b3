"""Tests of the pruning engine: plan matching, unit selection, DependencyGraph pruning, checks and estimates."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from estimate import estimate_pruning
from helpers.toy_models import ToyBlockNet
from torch import nn

from profiling_agent.state import PruneEntry
from profiling_agent.tools.compression.families.base import PrunableGroup
from profiling_agent.tools.compression.families.generic import GenericAdapter
from profiling_agent.tools.compression.families.resnet import ResNetAdapter
from profiling_agent.tools.compression.families.vit import ViTAdapter
from profiling_agent.tools.compression.pruning import PruneGuard, prune_model
from profiling_agent.tools.compression.self_check import self_check
from profiling_agent.tools.compression.units import (
    PruneCheckError,
    PrunedGroup,
    PruneError,
    match_groups,
    select_units,
    unit_scores,
    units_to_remove,
)

ALL = [{"layer": ".", "type": "structured", "ratio": 0.5}, {"layer": ".", "type": "head", "ratio": 0.5}]


def _randomize(model: nn.Module, seed: int = 1) -> nn.Module:
    """Give every weight a non-trivial scale (HF init is tiny) and BatchNorms non-identity statistics."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, (nn.Linear, nn.Conv2d)):
                fan_in = module.weight[0].numel()
                module.weight.copy_(torch.randn(module.weight.shape, generator=gen) / math.sqrt(fan_in))
                if module.bias is not None:
                    module.bias.copy_(0.1 * torch.randn(module.bias.shape, generator=gen))
            elif isinstance(module, nn.BatchNorm2d):
                n = module.num_features
                module.weight.copy_(0.5 + torch.rand(n, generator=gen))
                module.bias.copy_(0.1 * torch.randn(n, generator=gen))
                module.running_mean.copy_(0.1 * torch.randn(n, generator=gen))
                module.running_var.copy_(0.5 + torch.rand(n, generator=gen))
    return model.eval()


def _pixels(model: nn.Module, batch: int = 2) -> torch.Tensor:
    channels = model.config.num_channels if hasattr(model, "config") else 1
    return torch.randn(batch, channels, 16, 16, generator=torch.Generator().manual_seed(7))


def _logits(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    model.eval()
    with torch.inference_mode():
        out = model(pixel_values=x) if hasattr(model, "config") else model(x)
    return out.logits if hasattr(out, "logits") else out


def _mask(model: nn.Module, applied: list[PrunedGroup]) -> None:
    """Zero the removed units so they contribute nothing, without changing any shape."""
    with torch.no_grad():
        for row in applied:
            idx = torch.tensor(row.removed, dtype=torch.long)
            if not len(idx):
                continue
            module = model.get_submodule(row.module)
            if row.kind == "head":  # a head whose values are 0 adds 0 through o_proj, whatever q and k are
                rows = (idx[:, None] * module.head_dim + torch.arange(module.head_dim)).flatten()
                module.v_proj.weight[rows] = 0
                module.v_proj.bias[rows] = 0
            elif isinstance(module, nn.Linear):  # GELU(0) = 0: fc2 sees nothing from the channel
                module.weight[idx] = 0
                module.bias[idx] = 0
            else:  # conv -> BN(gamma=beta=0) -> ReLU gives exactly 0 on the channel
                norm = model.get_submodule(row.module.replace(".convolution", ".normalization"))
                norm.weight[idx] = 0
                norm.bias[idx] = 0


def _vit_eager():
    from helpers.tiny import seeded, vit_config
    from transformers import ViTForImageClassification

    return seeded(ViTForImageClassification, vit_config(attn_implementation="eager"))


# ---------------------------------------------------------------- match_groups


def test_match_groups_later_entries_override(tiny_vit):
    groups = ViTAdapter().prunable_groups(tiny_vit)
    entries = [
        {"layer": ".", "type": "structured", "ratio": 0.5},
        {"layer": r"layers\.1\.", "type": "structured", "ratio": 0.25},
        {"layer": "attention", "type": "head", "ratio": 0.5},
    ]
    assert match_groups(groups, entries) == {
        "layers.0.heads": 0.5,
        "layers.0.mlp": 0.5,
        "layers.1.heads": 0.5,
        "layers.1.mlp": 0.25,
    }
    assert match_groups(groups, [entries[1], entries[0]])["layers.1.mlp"] == 0.5


def test_match_groups_filters_by_kind_and_accepts_prune_entries(tiny_vit):
    groups = ViTAdapter().prunable_groups(tiny_vit)
    assert match_groups(groups, [{"layer": "attention", "type": "structured", "ratio": 0.5}]) == {}
    assert match_groups(groups, [{"layer": "mlp", "type": "head", "ratio": 0.5}]) == {}
    entry = PruneEntry(layer=r"layers\.0\.mlp", type="structured", ratio=0.3)
    assert match_groups(groups, [entry]) == {"layers.0.mlp": 0.3}
    assert match_groups(groups, []) == {}


def test_match_groups_rejects_bad_entries(tiny_vit):
    groups = ViTAdapter().prunable_groups(tiny_vit)
    with pytest.raises(ValueError, match=r"invalid layer regex 'layers\.\(': "):
        match_groups(groups, [{"layer": "layers.(", "type": "structured", "ratio": 0.5}])
    with pytest.raises(ValueError, match="unknown prune type"):
        match_groups(groups, [{"layer": ".", "type": "channels", "ratio": 0.5}])
    with pytest.raises(ValueError, match="must be in"):
        match_groups(groups, [{"layer": ".", "type": "head", "ratio": 1.0}])
    with pytest.raises(ValueError, match="lacks"):
        match_groups(groups, [{"layer": "."}])


def test_units_to_remove_floors_and_keeps_min_units():
    group = PrunableGroup("g", "head", "m", ("m",), ("m",), units=4, unit_size=8, min_units=1)
    assert [units_to_remove(group, r) for r in (0.0, 0.2, 0.25, 0.5, 0.74, 0.99)] == [0, 0, 1, 2, 2, 3]
    wide = PrunableGroup("w", "structured", "m", ("m",), ("m",), units=100, min_units=10)
    assert units_to_remove(wide, 0.29) == 29  # 0.29 * 100 == 28.999... in floats
    assert units_to_remove(wide, 0.95) == 90


# ---------------------------------------------------------------- importance


def test_unit_scores_mlp_and_heads_match_hand_computation(tiny_vit):
    _randomize(tiny_vit)
    mlp_group, head_group = ViTAdapter().prunable_groups(tiny_vit)[1], ViTAdapter().prunable_groups(tiny_vit)[0]
    mlp = tiny_vit.vit.layers[0].mlp
    w1, b1, w2 = (t.detach().double() for t in (mlp.fc1.weight, mlp.fc1.bias, mlp.fc2.weight))
    l2 = [math.sqrt((w1[c] ** 2).sum() + b1[c] ** 2 + (w2[:, c] ** 2).sum()) for c in range(64)]
    l1 = [float(w1[c].abs().sum() + b1[c].abs() + w2[:, c].abs().sum()) for c in range(64)]
    assert torch.allclose(unit_scores(tiny_vit, mlp_group, "l2"), torch.tensor(l2, dtype=torch.float64))
    assert torch.allclose(unit_scores(tiny_vit, mlp_group, "l1"), torch.tensor(l1, dtype=torch.float64))

    att = tiny_vit.vit.layers[0].attention
    expected = []
    for h in range(4):
        rows = slice(8 * h, 8 * h + 8)
        total = sum(
            (p.weight[rows].detach().double() ** 2).sum() + (p.bias[rows].detach().double() ** 2).sum()
            for p in (att.q_proj, att.k_proj, att.v_proj)
        )
        expected.append(math.sqrt(total + (att.o_proj.weight[:, rows].detach().double() ** 2).sum()))
    assert torch.allclose(unit_scores(tiny_vit, head_group, "l2"), torch.tensor(expected, dtype=torch.float64))


def test_unit_scores_conv_includes_bn_scale(tiny_resnet):
    _randomize(tiny_resnet)
    group = ResNetAdapter().prunable_groups(tiny_resnet)[0]
    conv, bn, nxt = (tiny_resnet.get_submodule(m) for m in group.members)
    w, gamma, nxt_w = conv.weight.detach().double(), bn.weight.detach().double(), nxt.weight.detach().double()
    expected = [math.sqrt((w[c] ** 2).sum() + gamma[c] ** 2 + (nxt_w[:, c] ** 2).sum()) for c in range(group.units)]
    assert torch.allclose(unit_scores(tiny_resnet, group), torch.tensor(expected, dtype=torch.float64))


def test_select_units_picks_least_important(tiny_vit):
    _randomize(tiny_vit)
    mlp_group, head_group = ViTAdapter().prunable_groups(tiny_vit)[1], ViTAdapter().prunable_groups(tiny_vit)[0]
    mlp, att = tiny_vit.vit.layers[0].mlp, tiny_vit.vit.layers[0].attention
    with torch.no_grad():
        for c in (5, 17, 40):
            mlp.fc1.weight[c] *= 1e-3
            mlp.fc1.bias[c] *= 1e-3
            mlp.fc2.weight[:, c] *= 1e-3
        for p in (att.q_proj, att.k_proj, att.v_proj):
            p.weight[16:24] *= 1e-3
            p.bias[16:24] *= 1e-3
        att.o_proj.weight[:, 16:24] *= 1e-3
    assert select_units(tiny_vit, mlp_group, 3) == [5, 17, 40]
    assert select_units(tiny_vit, mlp_group, 3, importance="l1") == [5, 17, 40]
    assert select_units(tiny_vit, head_group, 1) == [2]
    assert select_units(tiny_vit, mlp_group, 0) == []
    scores = unit_scores(tiny_vit, mlp_group).tolist()
    assert select_units(tiny_vit, mlp_group, 10) == sorted(sorted(range(64), key=lambda c: scores[c])[:10])
    with pytest.raises(ValueError):
        select_units(tiny_vit, mlp_group, 65)


def test_select_units_random_is_seeded(tiny_vit):
    mlp_group = ViTAdapter().prunable_groups(tiny_vit)[1]
    first = select_units(tiny_vit, mlp_group, 16, importance="random", seed=3)
    assert first == select_units(tiny_vit, mlp_group, 16, importance="random", seed=3)
    assert first != select_units(tiny_vit, mlp_group, 16, importance="random", seed=4)
    assert len(set(first)) == 16 and first == sorted(first) and all(0 <= c < 64 for c in first)


# ---------------------------------------------------------------- pruning == masking


def _assert_pruned_equals_masked(model, entries, **kwargs):
    x = _pixels(model)
    pruned = copy.deepcopy(model)
    report = prune_model(pruned, entries, x, **kwargs)
    assert any(row.removed for row in report.applied)
    masked = copy.deepcopy(model)
    _mask(masked, report.applied)
    original, got, want = _logits(model, x), _logits(pruned, x), _logits(masked, x)
    assert torch.allclose(got, want, atol=1e-5), (got - want).abs().max()
    assert not torch.allclose(got, original, atol=1e-3)  # the test would be vacuous if pruning changed nothing
    return pruned, report


@pytest.mark.parametrize("importance", ["l2", "random"])
def test_vit_pruned_equals_masked(tiny_vit, importance):
    _randomize(tiny_vit)
    pruned, report = _assert_pruned_equals_masked(tiny_vit, ALL, importance=importance, seed=5)
    assert [(r.group, r.units_after) for r in report.applied] == [
        ("layers.0.heads", 2),
        ("layers.0.mlp", 32),
        ("layers.1.heads", 2),
        ("layers.1.mlp", 32),
    ]
    att = pruned.vit.layers[1].attention
    assert (att.q_proj.out_features, att.o_proj.in_features, att.num_attention_heads) == (16, 16, 2)
    assert pruned.vit.layers[0].mlp.fc2.in_features == 32
    assert report.attrs["vit.layers.1.attention"] == {"num_attention_heads": 2}
    self_check(pruned, _pixels(pruned), 10)


def test_vit_eager_attention_pruned_equals_masked():
    model = _randomize(_vit_eager())
    entries = [
        {"layer": r"layers\.0", "type": "head", "ratio": 0.75},
        {"layer": ".", "type": "structured", "ratio": 0.3},
    ]
    pruned, report = _assert_pruned_equals_masked(model, entries)
    assert report.applied[0].units_after == 1 and len(report.applied[0].removed) == 3


@pytest.mark.parametrize("fixture", ["tiny_resnet", "tiny_resnet_basic"])
def test_resnet_pruned_equals_masked(fixture, request):
    model = _randomize(request.getfixturevalue(fixture))
    pruned, report = _assert_pruned_equals_masked(model, [{"layer": ".", "type": "structured", "ratio": 0.5}])
    for row in report.applied:
        conv = pruned.get_submodule(row.module)
        assert conv.out_channels == row.units_after == row.units_before - row.units_before // 2
    # stage widths are unchanged
    for stage, width in zip(pruned.resnet.encoder.stages, pruned.config.hidden_sizes, strict=True):
        assert all(block.layer[-1].convolution.out_channels == width for block in stage.layers)
    self_check(pruned, _pixels(pruned), 10)


def test_random_importance_reproducible(tiny_vit):
    _randomize(tiny_vit)
    x = _pixels(tiny_vit)
    a, b, c = (copy.deepcopy(tiny_vit) for _ in range(3))
    ra = prune_model(a, ALL, x, importance="random", seed=11)
    rb = prune_model(b, ALL, x, importance="random", seed=11)
    rc = prune_model(c, ALL, x, importance="random", seed=12)
    assert ra.applied == rb.applied
    assert torch.equal(_logits(a, x), _logits(b, x))
    assert [r.removed for r in ra.applied] != [r.removed for r in rc.applied]


@pytest.mark.parametrize("fixture", ["tiny_vit", "tiny_resnet"])
def test_removing_nothing_is_bit_identical(fixture, request):
    model = _randomize(request.getfixturevalue(fixture))
    x = _pixels(model)
    pruned = copy.deepcopy(model)
    # ratio 0 and ratios too small to remove one unit (4 heads * 0.2 < 1; 4 channels * 0.2 < 1)
    entries = [
        {"layer": ".", "type": "structured", "ratio": 0.0},
        {"layer": ".", "type": "head", "ratio": 0.2},
        {"layer": r"stages\.0", "type": "structured", "ratio": 0.2},
    ]
    report = prune_model(pruned, entries, x)
    assert report.applied and all(r.removed == [] for r in report.applied)
    assert report.params_before == report.params_after
    assert torch.equal(_logits(model, x), _logits(pruned, x))


def test_protected_modules_untouched(tiny_vit, tiny_resnet):
    for model in (_randomize(tiny_vit), _randomize(tiny_resnet)):
        adapter = ViTAdapter() if hasattr(model, "vit") else ResNetAdapter()
        protected = adapter.protected_modules(model)
        pruned = copy.deepcopy(model)
        report = prune_model(pruned, ALL, _pixels(model))
        before, after = model.state_dict(), pruned.state_dict()
        keys = [k for k in before if any(k.startswith(p + ".") for p in protected)]
        # a ResNet block's last conv consumes the pruned middle conv: it keeps exactly its other input columns
        consumers = {g.members[-1]: g for g in adapter.prunable_groups(model) if g.members[-1] in "".join(keys)}
        for key in keys:
            owner = key.rsplit(".", 1)[0]
            if owner in consumers:
                group = consumers[owner]
                removed = next(r.removed for r in report.applied if r.group == group.name)
                kept = [c for c in range(group.units) if c not in removed]
                assert torch.equal(before[key][:, kept], after[key])
            else:
                assert torch.equal(before[key], after[key]), key
        assert len(keys) > 10 and (hasattr(model, "vit") or consumers)


# ---------------------------------------------------------------- refusals


class _LastConvAdapter(ResNetAdapter):
    """A broken adapter exposing each block's last conv (which feeds the residual add)."""

    def prunable_groups(self, model):
        groups = []
        for g in super().prunable_groups(model):
            if not g.name.endswith("conv2"):
                continue
            last = g.members[-1]
            width = model.get_submodule(last).out_channels
            # every module but the classifier, so the only objection left is the protected classifier
            everything = tuple(n for n, _ in model.named_modules() if n and not n.startswith("classifier"))
            groups.append(PrunableGroup(f"{g.name}.last", "structured", last, (last,), everything, units=width))
        return groups

    def protected_modules(self, model):
        return ["classifier"]  # even without the adapter's full list, the residual path reaches the classifier


def test_group_reaching_protected_module_raises_before_any_change(tiny_resnet):
    model = copy.deepcopy(tiny_resnet)
    snapshot = copy.deepcopy(model.state_dict())
    with pytest.raises(PruneError, match="protected"):
        prune_model(
            model,
            [{"layer": r"stages\.1\.layers\.1", "type": "structured", "ratio": 0.5}],
            _pixels(model),
            adapter=_LastConvAdapter(),
        )
    assert all(torch.equal(snapshot[k], v) for k, v in model.state_dict().items())


def test_group_escaping_its_members_raises(tiny_vit):
    class Incomplete(ViTAdapter):
        def prunable_groups(self, model):
            return [
                PrunableGroup(g.name, g.kind, g.module, g.roots, g.roots, g.units, g.unit_size)
                for g in super().prunable_groups(model)
            ]

    with pytest.raises(PruneError, match="not one of its members"):
        prune_model(copy.deepcopy(tiny_vit), ALL, _pixels(tiny_vit), adapter=Incomplete())


def test_extra_protected_names_are_honoured(tiny_vit):
    with pytest.raises(PruneError, match=r"targets protected module vit\.layers\.1\.mlp\.fc1"):
        prune_model(copy.deepcopy(tiny_vit), ALL, _pixels(tiny_vit), guard=PruneGuard(protected=("vit.layers.1.mlp",)))
    # a protected consumer declared as a member may still lose input columns (as a ResNet block's last conv does)
    pruned = copy.deepcopy(tiny_vit)
    prune_model(pruned, ALL, _pixels(tiny_vit), guard=PruneGuard(protected=("vit.layers.1.mlp.fc2",)))
    assert pruned.vit.layers[1].mlp.fc2.in_features == 32


# ---------------------------------------------------------------- generic adapter


class LeakyToy(ToyBlockNet):
    """ToyBlockNet whose fc1 output also feeds the classifier input: fc1 is not safely inside a block."""

    def forward(self, x):
        x = torch.relu(self.embed(x))
        x = self.proj(x.mean((2, 3)))
        hidden = self.mlp.fc1(self.mlp.norm(x))
        return self.classifier(x + self.mlp.fc2(self.mlp.act(hidden)) + hidden[:, :16])


def test_generic_prunes_toy_like_masking():
    model = _randomize(ToyBlockNet())
    x = _pixels(model)
    pruned = copy.deepcopy(model)
    report = prune_model(pruned, [{"layer": ".", "type": "structured", "ratio": 0.5}], x)
    assert report.family == "generic" and not report.skipped
    assert [(r.group, r.units_after) for r in report.applied] == [("convblock.conv1", 6), ("mlp.fc1", 24)]
    masked = copy.deepcopy(model)
    with torch.no_grad():
        conv_idx, mlp_idx = (torch.tensor(r.removed) for r in report.applied)
        masked.convblock.bn1.weight[conv_idx] = 0
        masked.convblock.bn1.bias[conv_idx] = 0
        masked.mlp.fc1.weight[mlp_idx] = 0
        masked.mlp.fc1.bias[mlp_idx] = 0
    assert torch.allclose(_logits(pruned, x), _logits(masked, x), atol=1e-5)
    assert not torch.allclose(_logits(pruned, x), _logits(model, x), atol=1e-3)
    self_check(pruned, x, 10)


def test_generic_skips_groups_with_unsafe_coupling():
    model = _randomize(LeakyToy())
    assert [g.name for g in GenericAdapter().prunable_groups(model)] == ["convblock.conv1", "mlp.fc1"]
    pruned = copy.deepcopy(model)
    report = prune_model(pruned, [{"layer": "fc1", "type": "structured", "ratio": 0.5}], _pixels(model))
    assert report.applied == [] and [s["group"] for s in report.skipped] == ["mlp.fc1"]
    assert "would change" in report.skipped[0]["reason"]  # the coupling leaves the MLP
    assert pruned.mlp.fc1.out_features == 48


# ---------------------------------------------------------------- self_check


def test_self_check_catches_broken_models(tiny_vit):
    x = _pixels(tiny_vit)
    self_check(tiny_vit, x, 10)
    with pytest.raises(PruneCheckError, match="logits shape"):
        self_check(tiny_vit, x, 7)

    wrong_heads = copy.deepcopy(tiny_vit)
    wrong_heads.vit.layers[1].attention.num_attention_heads = 3
    with pytest.raises(PruneCheckError, match=r"vit\.layers\.1\.attention: 3 heads x head_dim 8 != q_proj"):
        self_check(wrong_heads, x, 10)

    nan = copy.deepcopy(tiny_vit)
    with torch.no_grad():
        nan.classifier.bias[0] = float("nan")
    with pytest.raises(PruneCheckError, match="NaN"):
        self_check(nan, x, 10)

    broken = copy.deepcopy(tiny_vit)
    broken.vit.layers[0].mlp.fc2 = nn.Linear(60, 32)  # fc1 still gives 64 channels
    with pytest.raises(PruneCheckError, match="forward pass failed"):
        self_check(broken, x, 10)


def test_self_check_catches_stale_o_proj(tiny_vit):
    broken = copy.deepcopy(tiny_vit)
    broken.vit.layers[0].attention.o_proj = nn.Linear(24, 32)
    with pytest.raises(PruneCheckError, match="o_proj in_features 24"):
        self_check(broken, _pixels(tiny_vit), 10)


# ---------------------------------------------------------------- sizes and estimates


def test_vit_param_drop_matches_hand_count(tiny_vit):
    pruned = copy.deepcopy(tiny_vit)
    entries = [
        {"layer": r"layers\.0", "type": "structured", "ratio": 0.25},
        {"layer": r"layers\.1", "type": "head", "ratio": 0.5},
    ]
    report = prune_model(pruned, entries, _pixels(tiny_vit))
    hidden, head_dim = 32, 8
    mlp = 16 * (hidden + 1) + 16 * hidden  # fc1 rows with bias + fc2 columns
    heads = 2 * head_dim * (3 * (hidden + 1) + hidden)  # q/k/v rows with bias + o_proj columns
    assert report.params_before - report.params_after == mlp + heads
    assert report.params_after == sum(p.numel() for p in pruned.parameters())
    assert estimate_pruning(tiny_vit, entries)["params_removed"] == mlp + heads


def _linear_conv_macs(model: nn.Module, x: torch.Tensor) -> int:
    """Count Linear/Conv multiply-accumulates per image with forward hooks (independent of the estimator)."""
    total = []

    def hook(module, _inputs, output):
        positions = output.numel() // (output.shape[0] * module.weight.shape[0])
        total.append(positions * module.weight.numel())

    handles = [m.register_forward_hook(hook) for m in model.modules() if isinstance(m, (nn.Linear, nn.Conv2d))]
    _logits(model, x)
    for h in handles:
        h.remove()
    return sum(total)


@pytest.mark.parametrize("fixture", ["tiny_vit", "tiny_resnet", "tiny_resnet_basic"])
def test_estimate_predicts_real_drop(fixture, request):
    model = request.getfixturevalue(fixture)
    x = _pixels(model, batch=1)
    entries = [
        {"layer": ".", "type": "structured", "ratio": 0.5},
        {"layer": r"stages\.1", "type": "structured", "ratio": 0.3},
        {"layer": r"layers\.1", "type": "head", "ratio": 0.5},
    ]
    estimate = estimate_pruning(model, entries, x)
    pruned = copy.deepcopy(model)
    report = prune_model(pruned, entries, x)
    assert estimate["params_removed"] == report.params_before - report.params_after > 0
    assert estimate["params_after"] == report.params_after
    assert [g["units_after"] for g in estimate["groups"]] == [r.units_after for r in report.applied]
    assert estimate["macs_removed"] == _linear_conv_macs(model, x) - _linear_conv_macs(pruned, x)


def test_prune_inside_inference_mode_with_frozen_params(tiny_resnet):
    model = copy.deepcopy(tiny_resnet).requires_grad_(False)
    with torch.inference_mode():
        x = _pixels(model)
        prune_model(model, [{"layer": ".", "type": "structured", "ratio": 0.5}], x)
    assert not any(p.requires_grad for p in model.parameters())
    assert not any(p.is_inference() for p in model.parameters())
    model.requires_grad_(True).train()
    model(pixel_values=torch.randn(2, 1, 16, 16)).logits.sum().backward()  # still trainable
