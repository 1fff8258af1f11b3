"""Per family: prune (0, 0.1, 0.3), quantize, save, reload, compare; generic fallback and its safety checks."""

from __future__ import annotations

import copy
import logging
import math

import pytest
import torch
from estimate import estimate_pruning
from helpers.tiny import beit_config, deit_config, resnet_config, swin_config, vit_config
from helpers.toy_models import all_logits
from torch import nn

from profiling_agent.tools.compression.families import adapter_for
from profiling_agent.tools.compression.pruning import PruneGuard, prune_model
from profiling_agent.tools.compression.quantization import quantize_model
from profiling_agent.tools.compression.self_check import self_check
from profiling_agent.tools.compression.units import PruneError
from profiling_agent.tools.models.artifact_load import load_artifact
from profiling_agent.tools.models.artifacts import WEIGHTS_FILE, save_artifact
from profiling_agent.tools.models.dynamic_quant import dynamic_linear_type

# ---------------------------------------------------------------- tiny models with enough heads for 10%


def _randomize(model: nn.Module, seed: int = 1) -> nn.Module:
    """Unit-scale random weights everywhere (HF zero-inits tokens and bias tables, which would hide mistakes)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            for name, param in module.named_parameters(recurse=False):
                noise = torch.randn(param.shape, generator=gen)
                if isinstance(module, (nn.LayerNorm, nn.BatchNorm2d)):
                    param.copy_((1.0 if name == "weight" else 0.0) + 0.1 * noise)
                elif param.ndim >= 2 and name == "weight":
                    param.copy_(noise * param[0].numel() ** -0.5)
                else:
                    param.copy_(0.5 * noise)
        for module in model.modules():
            if isinstance(module, nn.BatchNorm2d):
                module.running_mean.copy_(0.1 * torch.randn(module.num_features, generator=gen))
                module.running_var.copy_(1.0 + 0.1 * torch.rand(module.num_features, generator=gen))
    return model.eval()


# ten heads a layer (four channels each), so that 10% of the heads is one whole head
TEN_HEADS = {"hidden_size": 40, "num_attention_heads": 10, "intermediate_size": 80, "num_labels": 7}


def _vit():
    from transformers import ViTForImageClassification

    return ViTForImageClassification(vit_config(**TEN_HEADS))


def _deit():
    from transformers import DeiTForImageClassificationWithTeacher

    return DeiTForImageClassificationWithTeacher(deit_config(**TEN_HEADS))


def _swin():
    from transformers import SwinForImageClassification

    # 8x8 patches, 4x4 windows: stage 0 uses shifted windows, stage 1 (4x4) one window; 10 and 20 heads
    config = swin_config(embed_dim=40, depths=[2, 2], num_heads=[10, 20], mlp_ratio=1.0, num_labels=7)
    return SwinForImageClassification(config)


def _resnet(layer_type: str):
    from transformers import ResNetForImageClassification

    return ResNetForImageClassification(
        resnet_config(num_channels=3, hidden_sizes=[20, 40], layer_type=layer_type, num_labels=7)
    )


# name -> (builder, input shape, adapter name, kinds the family prunes)
FAMILIES = {
    "vit": (_vit, (2, 1, 16, 16), "vit", ("structured", "head")),
    "deit_teacher": (_deit, (2, 3, 16, 16), "deit", ("structured", "head")),
    "swin": (_swin, (2, 3, 16, 16), "swin", ("structured", "head")),
    "resnet_bottleneck": (lambda: _resnet("bottleneck"), (2, 3, 32, 32), "resnet", ("structured",)),
    "resnet_basic": (lambda: _resnet("basic"), (2, 3, 32, 32), "resnet", ("structured",)),
}
NUM_LABELS = 7
VERIFY = PruneGuard(verify=True)  # the pruned logits must equal the masked unpruned model's


def _build(family: str) -> nn.Module:
    torch.manual_seed(0)
    return _randomize(FAMILIES[family][0]())


def _pixels(family: str, seed: int = 3) -> torch.Tensor:
    return torch.randn(FAMILIES[family][1], generator=torch.Generator().manual_seed(seed))


_outputs = all_logits


def _equal(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def _entries(kinds, ratio: float) -> list[dict]:
    return [{"layer": ".", "type": kind, "ratio": ratio} for kind in kinds]


def _cases() -> list[tuple[str, tuple[str, ...], float]]:
    """Ratio 0 once per family (all kinds), then each kind alone at 0.1 and 0.3, then all kinds at 0.3."""
    cases = []
    for family, (_, _, _, kinds) in FAMILIES.items():
        cases.append((family, kinds, 0.0))
        cases += [(family, (kind,), ratio) for kind in kinds for ratio in (0.1, 0.3)]
        if len(kinds) > 1:
            cases.append((family, kinds, 0.3))
    return cases


# ---------------------------------------------------------------- per family: prune, quantize, save, reload


@pytest.mark.parametrize(
    ("family", "kinds", "ratio"), _cases(), ids=lambda v: "+".join(v) if isinstance(v, tuple) else str(v)
)
def test_prune_quantize_save_reload(family, kinds, ratio, tmp_path):
    model, pixels = _build(family), _pixels(family)
    original = copy.deepcopy(model)
    want_original = _outputs(model, pixels)
    assert adapter_for(model).name == FAMILIES[family][2]
    groups = {g.name: g for g in adapter_for(model).prunable_groups(model)}
    entries = _entries(kinds, ratio)
    estimate = estimate_pruning(model, entries, pixels)

    # verified: the pruned logits must equal the unpruned model's with the removed units masked
    report = prune_model(model, entries, pixels, guard=VERIFY)
    self_check(model, pixels, NUM_LABELS)
    assert {row.group for row in report.applied} == {n for n, g in groups.items() if g.kind in kinds}
    for row in report.applied:  # floor(units * ratio) units go per group, at least one stays
        units = groups[row.group].units
        assert len(row.removed) == min(math.floor(units * ratio + 1e-9), units - 1)
        assert row.units_after == units - len(row.removed)
    removed = report.params_before - report.params_after
    assert removed == estimate["params_removed"]
    live = {g.name: g.units for g in adapter_for(model).prunable_groups(model)}
    assert live == {n: g.units for n, g in groups.items()} | {r.group: r.units_after for r in report.applied}
    pruned_out = _outputs(model, pixels)
    if ratio == 0.0:
        assert removed == 0 and _equal(pruned_out, want_original)
    else:
        assert removed > 0 and not _equal(pruned_out, want_original)

    # the pruned model reloads exactly, with its sizes and fix-up attributes
    save_artifact(model, tmp_path / "pruned", attrs=report.attrs)
    reloaded = load_artifact(tmp_path / "pruned")
    assert _equal(_outputs(reloaded.model, pixels), pruned_out)
    assert {g.name: g.units for g in adapter_for(reloaded.model).prunable_groups(reloaded.model)} == live
    for module, attrs in report.attrs.items():
        for attr, value in attrs.items():
            assert getattr(reloaded.model.get_submodule(module), attr) == value

    # dynamic qint8 of every Linear: saved and reloaded bit for bit, and saving the reload gives the same file
    quantized, done = quantize_model(reloaded.model, [{"layer": "all", "dtype": "qint8"}])
    assert done and all(isinstance(quantized.get_submodule(n), dynamic_linear_type()) for n in done)
    quant_out = _outputs(quantized, pixels)
    save_artifact(quantized, tmp_path / "quantized", attrs=report.attrs, quantized=done)
    requant = load_artifact(tmp_path / "quantized")
    assert requant.recipe["quantized"] == done
    assert _equal(_outputs(requant.model, pixels), quant_out)
    save_artifact(requant.model, tmp_path / "again", attrs=requant.recipe["attrs"], quantized=done)
    assert (tmp_path / "again" / WEIGHTS_FILE).read_bytes() == (tmp_path / "quantized" / WEIGHTS_FILE).read_bytes()
    if ratio == 0.0:  # pruning nothing then quantizing == quantizing the original
        assert _equal(quant_out, _outputs(quantize_model(original, [{"layer": "all"}])[0], pixels))


@pytest.mark.parametrize("family", ["deit_teacher", "swin"])
def test_pruned_float16_round_trip(family, tmp_path):
    model, pixels = _build(family), _pixels(family)
    report = prune_model(model, _entries(("structured", "head"), 0.3), pixels)
    quantized, done = quantize_model(model, [{"layer": "all", "dtype": "float16"}])
    assert set(done.values()) == {"float16"}
    save_artifact(quantized, tmp_path / "fp16", attrs=report.attrs, quantized=done)
    assert _equal(_outputs(load_artifact(tmp_path / "fp16").model, pixels), _outputs(quantized, pixels))


@pytest.mark.parametrize("family", ["vit", "deit_teacher", "swin", "resnet_bottleneck"])
def test_reloaded_pruned_artifact_prunes_again(family, tmp_path):
    """Compressing a saved candidate again (e.g. `run --model RUN/best`) prunes live sizes and still round-trips."""
    model, pixels = _build(family), _pixels(family)
    entries = _entries(FAMILIES[family][3], 0.3)
    first = prune_model(model, entries, pixels)
    save_artifact(model, tmp_path / "first", attrs=first.attrs)
    again = load_artifact(tmp_path / "first").model
    estimate = estimate_pruning(again, entries, pixels)
    second = prune_model(again, entries, pixels, guard=VERIFY)
    assert second.params_before == first.params_after > second.params_after
    assert second.params_before - second.params_after == estimate["params_removed"]
    for row in second.applied:
        units = next(r for r in first.applied if r.group == row.group).units_after
        assert row.units_before == units
    self_check(again, pixels, NUM_LABELS)
    save_artifact(again, tmp_path / "second", attrs=second.attrs)
    assert _equal(_outputs(load_artifact(tmp_path / "second").model, pixels), _outputs(again, pixels))


# ---------------------------------------------------------------- verification catches silent mistakes


def test_verify_catches_an_adapter_that_prunes_the_wrong_bias_columns(monkeypatch):
    """Swin with a broken before_head_prune still has consistent shapes; only the numerical check sees it."""
    from profiling_agent.tools.compression.families.swin import SwinAdapter

    def off_by_one(self, model, group, head_idxs):
        original(self, model, group, [(h + 1) % group.units for h in head_idxs])

    original = SwinAdapter.before_head_prune
    entries = _entries(("head",), 0.3)
    pixels = _pixels("swin")
    prune_model(_build("swin"), entries, pixels, guard=VERIFY)  # the real adapter passes
    monkeypatch.setattr(SwinAdapter, "before_head_prune", off_by_one)
    broken = _build("swin")
    prune_model(copy.deepcopy(broken), entries, pixels)  # unverified, the broken adapter goes unnoticed
    unsafe = r"pruning is unsafe for this model \(swin adapter on SwinForImageClassification\): outputs differ"
    with pytest.raises(PruneError, match=unsafe):
        prune_model(broken, entries, pixels, guard=VERIFY)


class _Mixer(nn.Module):
    """A residual MLP whose hidden channels pass through `op` between fc1 and fc2."""

    def __init__(self, op):
        super().__init__()
        self.fc1, self.act, self.fc2, self.op = nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8), op

    def forward(self, x):
        return x + self.fc2(self.op(self.act(self.fc1(x))))


class _MixerNet(nn.Module):
    """An unknown (non-HF) architecture: stem, one _Mixer block, classifier."""

    def __init__(self, op):
        super().__init__()
        self.stem, self.block, self.classifier = nn.Linear(4, 8), _Mixer(op), nn.Linear(8, 3)

    def forward(self, x):
        return self.classifier(self.block(self.stem(x)))


OPS = {
    "identity": lambda h: h,
    "roll": lambda h: torch.roll(h, 1, dims=-1),  # the DependencyGraph maps channel i of fc1 to column i of fc2
    "flip": lambda h: h.flip(-1),
    "cumsum": lambda h: h.cumsum(-1),
    "regroup": lambda h: h.view(h.shape[0], 4, 4).transpose(1, 2).reshape(h.shape[0], 16),
}


@pytest.mark.parametrize("op", sorted(OPS))
def test_generic_fallback_refuses_channel_mixing_ops(op, caplog):
    torch.manual_seed(0)
    model = _MixerNet(OPS[op]).eval()
    entries = [{"layer": "fc1", "type": "structured", "ratio": 0.25}]
    x = torch.zeros(5, 4)  # a zero example (as the graph passes) must not hide the problem
    with caplog.at_level(logging.WARNING, logger="profiling_agent.tools.compression.families"):
        adapter = adapter_for(model)
    assert adapter.name == "generic" and "no family adapter matches _MixerNet" in caplog.text
    if op == "identity":
        report = prune_model(model, entries, x)
        assert report.applied[0].units_after == 12 and model.block.fc2.in_features == 12
        return
    with pytest.raises(PruneError) as err:
        prune_model(model, entries, x)
    message = str(err.value)
    assert message.startswith("pruning is unsafe for this model (generic adapter on _MixerNet)")
    assert "\n" not in message
    assert ("the pruned model fails" if op == "regroup" else "differ from masking the removed units") in message


def test_untraceable_model_gives_a_one_line_error():
    class NoAutograd(_MixerNet):
        def forward(self, x):
            if torch.is_grad_enabled():
                raise RuntimeError("this model only runs without autograd\nsecond line")
            return super().forward(x)

    model = NoAutograd(OPS["identity"]).eval()
    with pytest.raises(
        PruneError,
        match=r"^cannot trace NoAutograd for pruning: RuntimeError: this model only runs "
        r"without autograd$",
    ):
        prune_model(model, [{"layer": "fc1", "type": "structured", "ratio": 0.25}], torch.zeros(2, 4))


# ---------------------------------------------------------------- unknown Hugging Face architectures


def _convnext():
    from transformers import ConvNextConfig, ConvNextForImageClassification

    config = ConvNextConfig(num_channels=3, hidden_sizes=[16, 32], depths=[1, 1], num_stages=2, num_labels=5)
    return ConvNextForImageClassification(config)


def _beit():
    from transformers import BeitForImageClassification

    return BeitForImageClassification(beit_config(num_labels=5, use_relative_position_bias=True))


@pytest.mark.parametrize("build", [_convnext, _beit], ids=["convnext", "beit"])
def test_unknown_hf_model_uses_generic_fallback_and_round_trips(build, tmp_path, caplog):
    torch.manual_seed(0)
    model = _randomize(build())
    size = 32 if build is _convnext else 16
    pixels = torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(3))
    # BEiT caches its relative-position index in a class-level lru_cache; filled under inference mode, it used
    # to break the autograd trace ("Inference tensors cannot be saved for backward")
    before = _outputs(model, pixels)
    with caplog.at_level(logging.WARNING, logger="profiling_agent.tools.compression.families"):
        report = prune_model(model, _entries(("structured", "head"), 0.3), pixels)  # verified: generic is unsafe
    assert f"no family adapter matches {type(model).__name__}; using the 'generic' fallback" in caplog.text
    assert report.family == "generic" and report.applied and not report.skipped
    assert all(row.kind == "structured" for row in report.applied)  # the fallback never prunes heads
    assert report.params_after < report.params_before
    self_check(model, pixels, 5)
    assert not _equal(_outputs(model, pixels), before)
    quantized, done = quantize_model(model, [{"layer": "all"}])
    save_artifact(quantized, tmp_path / "generic", quantized=done)
    assert _equal(_outputs(load_artifact(tmp_path / "generic").model, pixels), _outputs(quantized, pixels))
