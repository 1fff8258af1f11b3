"""Recovery sized to the damage: distillation stops when the held-out trial slice stops improving.

Automatic recovery distils every plan kind, width or depth, up to a cap set by the model's size and the training
images (`policy.auto_cap_steps`) and by the wall-clock cap (`--recover-minutes`); every `every` steps the student
is scored on the trial slice (validation images the model never trained on) and the run stops once `patience`
checks in a row gained less than one image over the best so far (`PlateauMonitor`). An explicit --recover-steps
runs in full (only the time cap cuts it): no monitor stops it. After recovery, a candidate whose trial-slice loss
interval lies wholly beyond the budget is rejected before the full evaluation (`error_model.beyond_budget`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torch import nn

PATIENCE = 3  # checks in a row without a gain of one image before a plateau stops distillation
CHECKS = 20  # about this many checks over the cap's steps...
MIN_EVERY, MAX_EVERY = 25, 100  # ...every this many steps at least and at most
MIN_CHECKED_STEPS = 100  # no plateau stop before this many steps


def check_every(cap_steps: int) -> int:
    """Return the steps between two trial-slice checks of a distillation of `cap_steps` steps at most."""
    return max(MIN_EVERY, min(MAX_EVERY, cap_steps // CHECKS))


@dataclass
class PlateauMonitor:
    """distill's monitor: score the student on the trial slice every `every` steps; "stop" on a plateau.

    Attributes:
        score: Returns the student's top-1 on the trial slice, % (the student is left in eval mode).
        every: Steps between two checks.
        min_gain: The gain that counts as an improvement, pp (one image of the slice).
        patience: Checks in a row without such a gain that stop the run.
        min_steps: No stop before this step.
        baseline: The baseline's top-1 on the same slice, % (the curve's loss column).
        curve: [step, top-1 %, loss vs the baseline pp] per check.
        stopped_at: The step a plateau stopped the run at (None: it did not).
    """

    score: Callable[[nn.Module], float]
    every: int
    min_gain: float
    patience: int = PATIENCE
    min_steps: int = MIN_CHECKED_STEPS
    baseline: float = 0.0
    curve: list[list[float]] = field(default_factory=list)
    stopped_at: int | None = None
    _best: float = field(default=float("-inf"), init=False)
    _waits: int = field(default=0, init=False)

    def check(self, step: int, model: nn.Module) -> float:
        """Score the model now and add the point to the curve; return its top-1 %."""
        acc = float(self.score(model))
        self.curve.append([int(step), round(acc, 3), round(self.baseline - acc, 3)])
        return acc

    def __call__(self, step: int, model: nn.Module) -> str | None:
        """Check every `every` steps (distill calls it after each step); return "stop" on a plateau."""
        if step % self.every:
            return None
        acc = self.check(step, model)
        if acc >= self._best + self.min_gain - 1e-9:
            self._best, self._waits = acc, 0
        else:
            self._waits += 1
        if self._waits >= self.patience and step >= self.min_steps:
            self.stopped_at = step
            return "stop"
        return None


def plateau_monitor(
    score: Callable[[nn.Module], float], images: int, baseline: float, cap_steps: int
) -> PlateauMonitor:
    """Return the monitor of one auto distillation of at most `cap_steps` steps, judged on a slice of `images`.

    Args:
        score: The student's top-1 on the trial slice, % (`evaluation.metrics`, bound by the recover step).
        images: Images of the slice (one of them is the gain that counts).
        baseline: The baseline's top-1 on the same slice, %.
        cap_steps: The distillation's step cap (sets how often it is checked).
    """
    return PlateauMonitor(score, check_every(cap_steps), 100.0 / max(1, images), baseline=baseline)


def stop_reason(info: dict[str, Any], auto: bool) -> str:
    """Return why a distillation stopped: plateau, time (the wall-clock cap), cap (auto's steps) or steps (asked)."""
    if info.get("stopped") == "plateau":
        return "plateau"
    if info.get("capped"):
        return "time"
    return "cap" if auto else "steps"
