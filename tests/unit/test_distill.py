"""Distillation: recovers accuracy on a tiny training set, resumes to the same weights, never reads held-out rows."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from profiling_agent.tools.compression.pruning import prune_model
from profiling_agent.tools.data.train_stream import TrainBatches, batch_rows, find_train_source, usable_rows
from profiling_agent.tools.models.training import warmup_cosine_lr
from profiling_agent.tools.recovery.distill import DistillConfig, distill, distill_loss


def test_schedule_warms_up_then_decays_to_zero():
    lrs = [warmup_cosine_lr(s, 100, 1.0, 0.1) for s in range(100)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(lrs[9:], lrs[10:], strict=False)) and lrs[-1] < 0.01


def test_batch_rows_cover_every_row_once_per_epoch_and_depend_only_on_the_step():
    rows = np.arange(100, 137)
    epoch = np.concatenate([batch_rows(rows, s, 37, 3) for s in range(1)])
    assert sorted(epoch.tolist()) == rows.tolist()
    seen = np.concatenate([batch_rows(rows, s, 8, 3) for s in range(37)])  # 8 epochs of 37 rows in 37 steps
    assert np.bincount(seen - 100).tolist() == [8] * 37
    assert batch_rows(rows, 11, 8, 3).tolist() == batch_rows(rows, 11, 8, 3).tolist()


class _Spy:
    """A dataset that records every row it is asked for."""

    def __init__(self, ds):
        self.ds, self.read = ds, set()

    def select(self, idx):
        self.read.update(int(i) for i in idx)
        return self.ds.select(idx)

    def __len__(self):
        return len(self.ds)

    def __getattr__(self, name):
        return getattr(self.ds, name)


def _digits_like(n: int):
    from datasets import ClassLabel, Dataset, Features, Image

    rng = np.random.default_rng(0)
    images = [rng.integers(0, 255, (8, 8), dtype=np.uint8) for _ in range(n)]
    features = Features({"image": Image(), "label": ClassLabel(names=[str(i) for i in range(10)])})
    return Dataset.from_dict({"image": images, "label": [i % 10 for i in range(n)]}, features=features)


def test_recovery_never_reads_validation_test_or_calibration_rows():
    """Only one split: training images are its rows outside every subset, and no batch ever touches the others."""
    ds = _Spy(_digits_like(120))
    subsets = {
        "validation": {"split": "test", "indices": list(range(0, 120, 3))},
        "test": {"split": "test", "indices": list(range(1, 120, 3))},
        "calibration": {"split": "test", "indices": [2, 5, 8, 11]},
    }

    def loader(ref, split):
        if split != "test":
            raise ValueError(f"no split {split}")
        return ds

    source = find_train_source("x", "test", subsets, image_column="image", label_column="label", loader=loader)
    held = {i for role in subsets.values() for i in role["indices"]}
    assert source is not None and source.split == "test" and len(source.rows) == 120 - len(held)
    assert source.excluded == {"validation": 40, "test": 40, "calibration": 4}
    mapping = {"dataset_to_model": {str(i): i for i in range(10)}}
    batches = TrainBatches(source, None, {"channels": 1, "height": 8, "width": 8}, mapping, batch=16, seed=1)
    for step in range(12):  # several epochs of the 36 usable rows
        pixels, labels = batches(step)
        assert pixels.shape == (16, 1, 8, 8) and labels.min() >= 0
    assert ds.read and not ds.read & held
    assert ds.read == set(source.rows.tolist())


def test_a_train_split_is_preferred_and_too_few_spare_images_means_no_source():
    train, test = _digits_like(50), _digits_like(40)
    subsets = {
        "validation": {"split": "test", "indices": list(range(30))},
        "calibration": {"split": "train", "indices": [0, 1]},
    }

    def loader(ref, split):
        return {"train": train, "test": test}[split]

    source = find_train_source("x", "test", subsets, image_column="image", label_column="label", loader=loader)
    assert source.split == "train" and len(source.rows) == 48 and source.excluded == {"calibration": 2}
    rows, _ = usable_rows(40, "test", subsets)
    assert len(rows) == 10
    only_test = find_train_source(
        "x",
        "test",
        subsets,
        image_column="image",
        label_column="label",
        loader=lambda r, s: test if s == "test" else loader(r, "nope"),
    )
    assert only_test is None  # 10 spare images < MIN_TRAIN_IMAGES


def _synthetic(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(step)
    return torch.randn(8, 1, 16, 16, generator=gen), torch.randint(0, 10, (8,), generator=gen)


class _Stop(Exception):
    pass


@pytest.mark.parametrize("precision", ["auto", "bf16"])
def test_a_run_interrupted_mid_distillation_resumes_to_the_uninterrupted_weights(tiny_vit, tmp_path, precision):
    teacher = tiny_vit
    start = copy.deepcopy(teacher)
    prune_model(start, [{"layer": "mlp", "type": "structured", "ratio": 0.5}], torch.zeros(1, 1, 16, 16))
    config = DistillConfig(steps=12, lr=1e-3, save_every=3, seed=4, precision=precision)

    whole = copy.deepcopy(start)
    info = distill(whole, teacher, _synthetic, config, checkpoint_dir=tmp_path / "a")
    assert info["steps_done"] == 12 and info["resumed_from"] == 0

    def die_at_seven(p):
        if p["step"] == 7:
            raise _Stop

    broken = copy.deepcopy(start)
    with pytest.raises(_Stop):
        distill(broken, teacher, _synthetic, config, checkpoint_dir=tmp_path / "b", progress=die_at_seven)
    resumed = copy.deepcopy(start)  # a new process: the student starts from the pruned weights again
    info_b = distill(resumed, teacher, _synthetic, config, checkpoint_dir=tmp_path / "b")
    assert info_b["resumed_from"] == 6 and info_b["steps_done"] == 12  # steps 0..5 were saved, 6 is redone
    gap = max(
        (a - b).abs().max().item()
        for a, b in zip(whole.state_dict().values(), resumed.state_dict().values(), strict=True)
    )
    print(f"largest weight difference, resumed vs uninterrupted: {gap:.3g}")
    assert gap <= 1e-6, gap
    assert [c[0] for c in info_b["curve"]] == list(range(12))
    assert any((a != b).any() for a, b in zip(start.state_dict().values(), whole.state_dict().values(), strict=True))


def test_bf16_distillation_on_the_cpu_is_its_own_computation_and_is_chosen_for_big_students(tiny_vit, tmp_path,
                                                                                           monkeypatch):  # fmt: skip
    from profiling_agent.tools import device
    from profiling_agent.tools.recovery.policy import BF16_MIN_MACS, distill_precision

    start = copy.deepcopy(tiny_vit)
    runs = {}
    for precision in ("auto", "bf16"):
        runs[precision] = copy.deepcopy(start)
        distill(runs[precision], tiny_vit, _synthetic, DistillConfig(steps=3, lr=1e-3, precision=precision),
                checkpoint_dir=tmp_path / precision)  # fmt: skip
    assert any((a != b).any() for a, b in zip(runs["auto"].state_dict().values(), runs["bf16"].state_dict().values(),
                                              strict=True))  # fmt: skip
    # a fp32 checkpoint is not resumed in bf16 (and "auto" keeps the fingerprint of runs saved before the setting)
    again = copy.deepcopy(start)
    info = distill(again, tiny_vit, _synthetic, DistillConfig(steps=3, lr=1e-3, precision="bf16"),
                   checkpoint_dir=tmp_path / "auto")  # fmt: skip
    assert info["resumed_from"] == 0 and "precision" not in DistillConfig().fingerprint()
    monkeypatch.setattr(device, "native_bf16_cpu", lambda: True)
    assert distill_precision("cpu", BF16_MIN_MACS) == "bf16"
    assert distill_precision("cpu", BF16_MIN_MACS - 1) == distill_precision("cuda", BF16_MIN_MACS) == "auto"
    monkeypatch.setattr(device, "native_bf16_cpu", lambda: False)  # emulated bf16 is slower: fp32
    assert distill_precision("cpu", 10 * BF16_MIN_MACS) == "auto"


def test_a_checkpoint_of_another_config_is_not_resumed(tiny_vit, tmp_path):
    student = copy.deepcopy(tiny_vit)
    distill(student, tiny_vit, _synthetic, DistillConfig(steps=4, save_every=2), checkpoint_dir=tmp_path)
    again = copy.deepcopy(tiny_vit)
    info = distill(again, tiny_vit, _synthetic, DistillConfig(steps=4, lr=1e-3, save_every=2), checkpoint_dir=tmp_path)
    assert info["resumed_from"] == 0


def test_distillation_recovers_accuracy_of_a_hard_pruned_digits_resnet(quick_resnet):
    """A tiny training set (the train split), test images never trained on: accuracy comes back measurably."""
    from datasets import load_from_disk
    from transformers import AutoModelForImageClassification

    from profiling_agent.tools.models.embedded import accuracy, digits_processor, split_pixels

    model_dir, dataset, _ = quick_resnet
    splits = load_from_disk(str(dataset))
    processor = digits_processor()
    train_x, train_y = split_pixels(splits["train"].select(range(512)), processor)
    test_x, test_y = split_pixels(splits["test"], processor)
    teacher = AutoModelForImageClassification.from_pretrained(model_dir).eval()
    student = copy.deepcopy(teacher)
    prune_model(student, [{"layer": "conv", "type": "structured", "ratio": 0.75}], train_x[:1])
    pruned_acc = accuracy(student, test_x, test_y)

    def batches(step):
        idx = torch.as_tensor(batch_rows(np.arange(len(train_x)), step, 32, 0))
        return train_x[idx], train_y[idx]

    distill(student, teacher, batches, DistillConfig(steps=60, lr=3e-3))
    recovered = accuracy(student, test_x, test_y)
    base = accuracy(teacher, test_x, test_y)
    print(f"digits ResNet distillation: baseline {base:.2f}%, pruned {pruned_acc:.2f}%, distilled {recovered:.2f}%")
    assert recovered >= pruned_acc + 20.0, (pruned_acc, recovered)


@pytest.mark.parametrize("family", ["deit_teacher", "swin"])
def test_distillation_trains_pruned_deit_with_teacher_and_swin_heads(family):
    """Swin's bias table is pruned through param.data; DeiT-with-teacher predicts with the mean of its two heads."""
    from helpers.tiny import random_deit as _deit
    from helpers.tiny import random_swin as _swin
    from transformers import DeiTForImageClassificationWithTeacher

    teacher = _deit(DeiTForImageClassificationWithTeacher) if family == "deit_teacher" else _swin()
    size = 16 if family == "deit_teacher" else 32
    student = copy.deepcopy(teacher)
    entries = [{"layer": ".", "type": "head", "ratio": 0.5}, {"layer": ".", "type": "structured", "ratio": 0.5}]
    prune_model(student, entries, torch.zeros(1, 3, size, size))
    pixels = torch.randn(64, 3, size, size, generator=torch.Generator().manual_seed(0))

    def batches(step):
        return pixels[(step % 4) * 16 : (step % 4 + 1) * 16], torch.full((16,), -1)  # no labels: KL only

    config = DistillConfig(steps=30, lr=1e-3, ce_weight=0.0)

    def gap() -> float:  # the objective: T^2 KL(teacher || student) on the training images
        with torch.inference_mode():
            s, t = student(pixel_values=pixels).logits, teacher(pixel_values=pixels).logits
        return float(distill_loss(s, t, torch.full((64,), -1), config)[0])

    before = gap()
    distill(student, teacher, batches, config)
    after = gap()
    assert after < 0.8 * before, (before, after)
