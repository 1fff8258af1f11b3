"""Which recovery steps run for a setting, and how many distillation steps fit the training images and the model."""

from __future__ import annotations

import math

METHODS = ("none", "reconstruct", "distill", "auto")
EPOCHS = 2.0  # auto: passes over the training images
MIN_STEPS, MAX_STEPS = 20, 300  # auto: bounds on the steps of one candidate
LARGE_MODEL = 20_000_000  # parameters above which auto halves its steps (a step costs more than it returns)


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


def auto_steps(train_images: int, batch: int, params: int) -> int:
    """Return distillation steps: EPOCHS passes over the images, within MIN_STEPS..MAX_STEPS (halved for big models)."""
    steps = math.ceil(EPOCHS * train_images / max(1, batch))
    high = MAX_STEPS // 2 if params > LARGE_MODEL else MAX_STEPS
    return max(MIN_STEPS, min(high, steps))


def method_name(steps: list[str]) -> str:
    """Return the record's method: none, reconstruct, distill or reconstruct+distill."""
    return "+".join(steps) or "none"
