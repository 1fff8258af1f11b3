"""Which recovery steps run for a setting, and how many distillation steps fit the training images and the model."""

from __future__ import annotations

import math
from typing import get_args

from profiling_agent.schemas.settings import RecoverChoice

METHODS: tuple[str, ...] = get_args(RecoverChoice)
EPOCHS = 2.0  # auto: passes over the training images
# auto after removing whole blocks: the blocks left must take over a removed block's work, not only re-align to the
# teacher, and that takes many passes. The zoo ViT without its last two layers (ONNX Runtime dynamic QInt8, 512
# validation images) lost 1.37 pp after 125 distillation steps and 0.00 pp after 300; the zoo ResNet without its
# identity block and with stage 2's first block replaced by its shortcut lost 3.60 pp of held-out top-1 after 300
# steps of 64 images and 1.20 pp after 1,000 (2,000 training images, `bench/resnet_depth.py --steps 1000`), with
# stage 1's instead -0.90 and -0.10 pp. Three changes (the identity block, stages 0 and 1's first blocks) gained 0.35 pp
# after 3,000 steps where 1,000 lost 0.95 pp (held-out, the same images, lr 1e-3, batch 64: docs/benchmarks.md,
# 2026-11-26, 4046c50). The wall-clock cap (`recover_minutes`) still bounds every candidate.
DEPTH_EPOCHS = 96.0
MIN_STEPS, MAX_STEPS = 20, 300  # auto: bounds on the steps of one candidate
DEPTH_MAX_STEPS = 3000  # auto: the bound after removing whole blocks
# auto's learning rate and batch, and after removing blocks: on the zoo ResNet without three of its four blocks
# (2,000 training images, 3,000 steps, held-out change) lr 1e-3 gained 0.15-0.25 pp where 3e-4 lost 0.85-1.20 pp at
# batch 32, and batch 64 beat 32 at lr 1e-3 (+0.35 against +0.15 pp, the identity block and stages 0 and 1)
LR, DEPTH_LR = 3e-4, 1e-3
BATCH, DEPTH_BATCH = 32, 64
LARGE_MODEL = 20_000_000  # parameters above which auto halves its steps (a step costs more than it returns)
# a student of at least this many MACs per image distills in bf16 autocast on a CPU with native bf16: measured here
# (Zen 5, AVX-512 BF16) a training step of ViT-B/16 took 1.8x and of ResNet-50 2.0x less CPU time than in fp32,
# while the zoo's small ViT (a few MMACs) took 2x more
BF16_MIN_MACS = 1_000_000_000
# auto's step cap scales with the damage of a width plan: the share of parameters or MACs it removed (the larger)
# and the refitted student's loss on the trial slice before distillation. A plan removing FULL_CAP_SHARE or more
# and losing FULL_CAP_LOSS pp or more gets the whole cap; otherwise the smaller of the two ratios of it, never fewer
# than two passes over the training images (`auto_steps`' width rule). A plan that removed whole blocks keeps the
# whole cap (what is left must learn the removed blocks' work). Before (commit 34ed52d) every plan got the whole cap
# and early stopping alone ended it: docs/recovery.md, "Distillation sized to the damage", has the measured runs.
FULL_CAP_SHARE = 0.5
FULL_CAP_LOSS = 10.0


def recovery_steps(requested: str, has_training_images: bool) -> tuple[list[str], str]:
    """Return the steps a `recover` setting runs ("reconstruct", "distill") and a note on what was skipped.

    auto reconstructs, then distills when training images exist; distill without training images does nothing.

    Raises:
        ValueError: An unknown setting.
    """
    if requested not in METHODS:
        raise ValueError(f"unknown recover setting {requested!r}: use one of {', '.join(METHODS)}")
    if requested == "none":
        return [], "recovery off"
    steps = ["reconstruct"] if requested in ("reconstruct", "auto") else []
    if requested in ("distill", "auto"):
        if has_training_images:
            steps.append("distill")
        else:
            return steps, "no training images: distillation skipped"
    return steps, ""


def auto_steps(train_images: int, batch: int, params: int, removed_blocks: int = 0) -> int:
    """Return distillation steps: EPOCHS passes over the images, within MIN_STEPS..MAX_STEPS (halved for big models).

    A plan that removed whole blocks (`removed_blocks` > 0) gets DEPTH_EPOCHS passes, up to DEPTH_MAX_STEPS, on a
    model below LARGE_MODEL parameters (a big model's steps cost minutes each on a CPU: it keeps MAX_STEPS / 2).
    """
    epochs = DEPTH_EPOCHS if removed_blocks else EPOCHS
    steps = math.ceil(epochs * train_images / max(1, batch))
    high = MAX_STEPS // 2 if params > LARGE_MODEL else DEPTH_MAX_STEPS if removed_blocks else MAX_STEPS
    return max(MIN_STEPS, min(high, steps))


def auto_cap_steps(train_images: int, batch: int, params: int) -> int:
    """Return the automatic step cap of any plan kind, width or depth: early stopping ends it sooner.

    Every plan gets the cap a plan that removed blocks gets (`auto_steps` with DEPTH_EPOCHS, up to DEPTH_MAX_STEPS;
    MAX_STEPS / 2 above LARGE_MODEL parameters); the held-out trial slice decides when it has recovered enough
    (`early_stop.PlateauMonitor`), and the wall-clock cap (`recover_minutes`) still bounds it.
    """
    return auto_steps(train_images, batch, params, removed_blocks=1)


def removed_share(
    params_before: int | None, params_after: int | None, macs_before: int | None, macs_after: int | None
) -> float | None:
    """Return the larger share (0..1) of parameters or MACs per image a plan removed; None when neither is known.

    Token merging removes MACs and no parameters, channel pruning both: the larger share is the damage to size.
    """
    shares = [
        1.0 - after / before
        for before, after in ((params_before, params_after), (macs_before, macs_after))
        if before and after is not None
    ]
    return min(1.0, max(0.0, *shares)) if shares else None


def cap_share(removed: float | None, loss_before: float | None) -> float:
    """Return the share (0..1) of auto's step cap a width plan gets: the smaller of what it removed and what it lost.

    `removed` / FULL_CAP_SHARE (`removed_share`) and `loss_before` / FULL_CAP_LOSS (the refitted student's loss on
    the trial slice before distillation, pp); either alone when the other is unknown, 1 when both are.
    """
    shares = [x / full for x, full in ((removed, FULL_CAP_SHARE), (loss_before, FULL_CAP_LOSS)) if x is not None]
    return min(1.0, max(0.0, min(shares))) if shares else 1.0


def scaled_cap_steps(
    cap: int, floor: int, removed: float | None, loss_before: float | None = None, removed_blocks: int = 0
) -> int:
    """Return auto's step cap for a plan that removed `removed` of the model and lost `loss_before` pp before it.

    The cap is `cap` x `cap_share`, within `floor`..`cap`; a plan that removed whole blocks keeps `cap`.
    """
    if removed_blocks:
        return cap
    return max(min(floor, cap), min(cap, math.ceil(cap * cap_share(removed, loss_before))))


def cap_steps_note(steps: int, cap: int, removed: float | None, loss_before: float | None = None) -> str:
    """Say that auto's step cap was scaled to what the plan removed and lost ('' when it was not scaled)."""
    if steps >= cap:
        return ""
    said = [] if removed is None else [f"removed {removed:.1%}"]
    said += [] if loss_before is None else [f"lost {loss_before:.2f} pp on the trial slice before distillation"]
    full = f"{cap} for {FULL_CAP_SHARE:.0%} or {FULL_CAP_LOSS:g} pp"
    return f"distillation capped at {steps} steps: the plan {' and '.join(said)} ({full})"


def auto_recipe(lr: float, batch: int, params: int, removed_blocks: int = 0) -> tuple[float, int]:
    """Return the distillation's (peak learning rate, batch): `lr` and `batch` where set (non-zero), else auto's.

    Auto is LR and BATCH, or DEPTH_LR and DEPTH_BATCH for a plan that removed whole blocks from a model below
    LARGE_MODEL parameters (what is left must learn the removed blocks' work, not only re-align).
    """
    depth = removed_blocks > 0 and params <= LARGE_MODEL
    return lr or (DEPTH_LR if depth else LR), batch or (DEPTH_BATCH if depth else BATCH)


def distill_precision(device: str, macs: int | None) -> str:
    """Return the distillation's precision: "bf16" on a CPU with native bf16 for a big student, else "auto".

    "auto" is bf16 autocast on CUDA and fp32 elsewhere (`distill.train_step`).
    """
    from profiling_agent.tools.device import native_bf16_cpu  # lazy: torch; nodes.recover loads this module without it

    if str(device).startswith("cpu") and (macs or 0) >= BF16_MIN_MACS and native_bf16_cpu():
        return "bf16"
    return "auto"


def method_name(steps: list[str]) -> str:
    """Return the record's method: none, reconstruct, distill or reconstruct+distill."""
    return "+".join(steps) or "none"
