"""Least-squares reconstruction: hard-pruned tiny models win back most of the damage on held-out inputs."""

from __future__ import annotations

import copy

import pytest
import torch

from profiling_agent.tools.compression.pruning import prune_model
from profiling_agent.tools.compression.self_check import self_check
from profiling_agent.tools.recovery.reconstruct import find_consumers, reconstruct


def _mse(model, reference, pixels) -> float:
    with torch.inference_mode():
        return float((model(pixel_values=pixels).logits - reference(pixel_values=pixels).logits).pow(2).mean())


def _warm_batchnorm(model, shape):
    """Give BatchNorm layers non-trivial running statistics (a random-init model has mean 0, var 1)."""
    model.train()
    with torch.no_grad():
        model(pixel_values=torch.randn(64, *shape, generator=torch.Generator().manual_seed(5)))
    model.eval()


MLP_HARD = {"layer": "mlp", "type": "structured", "ratio": 0.7}
HEADS_HALF = {"layer": "attention", "type": "head", "ratio": 0.5}


@pytest.mark.parametrize(
    ("fixture", "entries"),
    [
        ("tiny_vit", [MLP_HARD, HEADS_HALF]),
        ("tiny_resnet", [{"layer": "conv", "type": "structured", "ratio": 0.6}]),
    ],
)  # fmt: skip
def test_reconstruction_wins_back_at_least_half_of_the_logit_damage(request, fixture, entries):
    baseline = request.getfixturevalue(fixture)
    shape = (1, 16, 16)
    if fixture == "tiny_resnet":
        _warm_batchnorm(baseline, shape)
    gen = torch.Generator().manual_seed(1)
    calib, held_out = torch.randn(64, *shape, generator=gen), torch.randn(64, *shape, generator=gen)
    pruned = copy.deepcopy(baseline)
    report = prune_model(pruned, entries, calib[:1])
    damage = _mse(pruned, baseline, held_out)
    info = reconstruct(baseline, pruned, calib, report.applied)
    recovered = _mse(pruned, baseline, held_out)
    assert damage > 0 and recovered <= 0.5 * damage, (damage, recovered)
    assert all(c["error_after"] <= c["error_before"] for c in info["consumers"])
    assert len(info["consumers"]) == sum(1 for row in report.applied if row.removed)
    self_check(pruned, calib[:2], 10)  # shapes unchanged, finite logits


def test_reconstruction_changes_only_consumers_and_leaves_the_baseline_alone(tiny_vit):
    baseline = tiny_vit
    before = {k: v.clone() for k, v in baseline.state_dict().items()}
    pruned = copy.deepcopy(baseline)
    report = prune_model(pruned, [{"layer": "mlp", "type": "structured", "ratio": 0.5}], torch.zeros(1, 1, 16, 16))
    pruned_state = {k: v.clone() for k, v in pruned.state_dict().items()}
    reconstruct(
        baseline, pruned, torch.randn(16, 1, 16, 16, generator=torch.Generator().manual_seed(0)), report.applied
    )
    assert all(torch.equal(before[k], v) for k, v in baseline.state_dict().items())
    consumers = {c.name for c in find_consumers(baseline, pruned, report.applied)}
    assert consumers == {"vit.layers.0.mlp.fc2", "vit.layers.1.mlp.fc2"}
    changed = {k.rsplit(".", 1)[0] for k, v in pruned.state_dict().items() if not torch.equal(pruned_state[k], v)}
    assert changed == consumers


def test_reconstruction_on_a_trained_resnet_wins_back_accuracy_on_held_out_digits(quick_resnet):
    """Real digits: calibration images from the train split, accuracy measured on test images none of them saw."""
    from datasets import load_from_disk
    from transformers import AutoModelForImageClassification

    from profiling_agent.tools.models.embedded import accuracy, digits_processor, split_pixels

    model_dir, dataset, _ = quick_resnet
    splits = load_from_disk(str(dataset))
    processor = digits_processor()
    train_x, _ = split_pixels(splits["train"], processor)
    test_x, test_y = split_pixels(splits["test"], processor)
    baseline = AutoModelForImageClassification.from_pretrained(model_dir).eval()
    pruned = copy.deepcopy(baseline)
    report = prune_model(pruned, [{"layer": "conv", "type": "structured", "ratio": 0.75}], train_x[:1])
    base_acc, pruned_acc = accuracy(baseline, test_x, test_y), accuracy(pruned, test_x, test_y)
    reconstruct(baseline, pruned, train_x[:128], report.applied)
    recovered_acc = accuracy(pruned, test_x, test_y)
    lost = base_acc - pruned_acc
    assert lost > 2.0, (base_acc, pruned_acc)  # the plan must hurt for the test to mean anything
    print(f"digits ResNet: baseline {base_acc:.2f}%, pruned {pruned_acc:.2f}%, reconstructed {recovered_acc:.2f}%")
    assert recovered_acc >= pruned_acc + 0.5 * lost, (base_acc, pruned_acc, recovered_acc)


@pytest.mark.parametrize("family", ["deit_teacher", "swin"])
def test_reconstruction_on_deit_with_teacher_and_swin(family):
    from helpers.tiny import random_deit as _deit
    from helpers.tiny import random_swin as _swin
    from transformers import DeiTForImageClassificationWithTeacher

    baseline = _deit(DeiTForImageClassificationWithTeacher) if family == "deit_teacher" else _swin()
    size = 16 if family == "deit_teacher" else 32
    gen = torch.Generator().manual_seed(3)
    calib, held_out = torch.randn(64, 3, size, size, generator=gen), torch.randn(64, 3, size, size, generator=gen)
    pruned = copy.deepcopy(baseline)
    report = prune_model(pruned, [MLP_HARD, HEADS_HALF], calib[:1])
    damage = _mse(pruned, baseline, held_out)
    reconstruct(baseline, pruned, calib, report.applied)
    recovered = _mse(pruned, baseline, held_out)
    print(f"{family}: logit MSE pruned {damage:.4g}, reconstructed {recovered:.4g}")
    assert damage > 0 and recovered <= 0.5 * damage, (damage, recovered)


def test_the_sensitivity_probe_measures_damage_after_reconstruction_when_asked(tiny_vit):
    from profiling_agent.tools.compression.families import adapter_for
    from profiling_agent.tools.profiling.sensitivity import probe_groups_full

    pixels = torch.randn(32, 1, 16, 16, generator=torch.Generator().manual_seed(2))
    groups = adapter_for(tiny_vit).prunable_groups(tiny_vit)
    plain = probe_groups_full(tiny_vit, groups, pixels, ratio=0.5)
    refit = probe_groups_full(tiny_vit, groups, pixels, ratio=0.5, recover=True)
    assert plain.keys() == refit.keys()
    assert sum(r["kl"] for r in refit.values()) < 0.5 * sum(r["kl"] for r in plain.values())


@pytest.mark.parametrize(
    ("fixture", "entries", "replays"),
    [
        ("tiny_vit", [MLP_HARD, HEADS_HALF], True),
        ("tiny_resnet", [{"layer": "conv", "type": "structured", "ratio": 0.6}], True),
        ("swin", [MLP_HARD], True),  # blocks return (hidden, attention), stages downsample between: still replayed
    ],
)  # fmt: skip
def test_the_refit_from_cached_block_inputs_is_the_refit_from_the_stem(request, fixture, entries, replays):
    """Replaying each consumer's block from cached inputs gives the same fits as running both models from the stem."""
    if fixture == "swin":
        from helpers.tiny import random_swin as _swin

        baseline, shape = _swin(), (3, 32, 32)
    else:
        baseline, shape = request.getfixturevalue(fixture), (1, 16, 16)
    if fixture == "tiny_resnet":
        _warm_batchnorm(baseline, shape)
    calib = torch.randn(40, *shape, generator=torch.Generator().manual_seed(2))  # two batches of 32: one partial
    pruned = copy.deepcopy(baseline)
    report = prune_model(pruned, entries, calib[:1])
    twin = copy.deepcopy(pruned)
    fast = reconstruct(baseline, pruned, calib, report.applied)
    slow = reconstruct(baseline, twin, calib, report.applied, by_blocks=False)
    assert fast["by_blocks"] is replays
    assert slow["by_blocks"] is False and len(fast["consumers"]) == len(slow["consumers"]) > 0
    for a, b in zip(fast["consumers"], slow["consumers"], strict=True):
        assert a["name"] == b["name"] and a["rows"] == b["rows"]
        assert a["error_after"] == pytest.approx(b["error_after"], rel=1e-4, abs=1e-7)
    for (name, x), (_, y) in zip(pruned.state_dict().items(), twin.state_dict().items(), strict=True):
        assert torch.allclose(x, y, rtol=1e-4, atol=1e-6), name


def test_the_planning_trials_refit_is_handed_to_the_recover_step_only_for_the_same_units_images_and_seed(
    tiny_vit, tmp_path
):
    from profiling_agent.tools.recovery import refit_cache

    gen = torch.Generator().manual_seed(3)
    calib = torch.randn(16, 1, 16, 16, generator=gen)
    plan = [{"layer": "mlp", "type": "structured", "ratio": 0.5}]

    def pruned_by(entries):
        model = copy.deepcopy(tiny_vit)
        return model, prune_model(model, entries, calib[:1]).applied

    trial, applied = pruned_by(plan)  # the analyze step's trial: pruned, refitted, remembered
    info = reconstruct(tiny_vit, trial, calib, applied)
    refits = refit_cache.TrialRefits()
    refits.remember(plan, refit_cache.refit_key(applied, calib, 0, "base"), trial, info)
    trial_state = {k: v.clone() for k, v in trial.state_dict().items()}
    torch.nn.init.zeros_(trial.vit.layers[0].mlp.fc2.weight)  # what happens to the trial later (quantization) stays out
    assert not refits.save([{"layer": "attention", "type": "head", "ratio": 0.5}], tmp_path)  # another plan: none held
    assert refits.save(plan, tmp_path)

    student, same = pruned_by(plan)  # the recover step: the same plan pruned again
    key = refit_cache.refit_key(same, calib, 0, "base")
    assert refit_cache.load(tmp_path, key, student) == info
    assert all(torch.equal(trial_state[k], v) for k, v in student.state_dict().items())
    redone, _ = pruned_by(plan)  # and it is what the recover step's own refit gives
    reconstruct(tiny_vit, redone, calib, same)
    assert all(torch.allclose(trial_state[k], v, atol=1e-5) for k, v in redone.state_dict().items())
    # other images, another seed, another baseline or other units: the key differs and the refit runs
    other, other_applied = pruned_by([{"layer": "mlp", "type": "structured", "ratio": 0.25}])
    for applied_, images, seed, base in ((same, calib[:8], 0, "base"), (same, calib, 1, "base"),
                                         (same, calib, 0, "other"), (other_applied, calib, 0, "base")):  # fmt: skip
        wrong = refit_cache.refit_key(applied_, images, seed, base)
        assert wrong != key and refit_cache.load(tmp_path, wrong, other) is None
    (tmp_path / refit_cache.FOLDER / "weights.safetensors").write_bytes(b"torn")  # a torn file: refit
    assert refit_cache.load(tmp_path, key, student) is None
    refit_cache.discard(tmp_path)
    assert not (tmp_path / refit_cache.FOLDER).exists()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
def test_the_refit_runs_on_cuda_with_calibration_images_on_the_cpu(tiny_vit):  # pragma: no cover - GPU only
    calib = torch.randn(32, 1, 16, 16, generator=torch.Generator().manual_seed(2))
    plan = [{"layer": "mlp", "type": "structured", "ratio": 0.5}]
    on_cpu = copy.deepcopy(tiny_vit)
    applied = prune_model(on_cpu, plan, calib[:1]).applied
    on_gpu = copy.deepcopy(on_cpu).cuda()
    reconstruct(tiny_vit, on_cpu, calib, applied)
    info = reconstruct(copy.deepcopy(tiny_vit).cuda(), on_gpu, calib, applied)  # the recover step's case
    assert info["by_blocks"]
    for key, value in on_cpu.state_dict().items():
        assert torch.allclose(value, on_gpu.state_dict()[key].cpu(), atol=1e-3), key
