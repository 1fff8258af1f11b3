"""Recovery sized to the damage: distillation stops when the held-out trial slice stops improving.

Automatic recovery distils every plan kind, width or depth, up to a cap set by the model's size and the training
images (`policy.auto_cap_steps`) and by the wall-clock cap (`--recover-minutes`); every `every` steps the student
is scored on the trial slice (validation images the model never trained on) and the run stops once `patience`
checks in a row gained less than one image over the best so far (`PlateauMonitor`). The student before the first
step (pruned and refitted) is the first point, and the run keeps the weights of its best point when they beat the
last step's by at least one image: distillation can lower a barely damaged student's accuracy for hundreds of steps
before it climbs back, and a plateau stop there delivered a student worse than it was before recovery. An explicit
--recover-steps runs in full (only the time cap cuts it): no monitor stops it. After recovery, a candidate whose
trial-slice loss interval lies wholly beyond the budget is rejected before the full evaluation
(`error_model.beyond_budget`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from profiling_agent.tools.io import atomic_dir, read_json, write_json_atomic

PATIENCE = 3  # checks in a row without a gain of one image before a plateau stops distillation
CHECKS = 20  # about this many checks over the cap's steps...
MIN_EVERY, MAX_EVERY = 25, 100  # ...every this many steps at least and at most
MIN_CHECKED_STEPS = 100  # no plateau stop before this many steps
BEST = "best"  # in the distillation's checkpoint folder: the best checked student (weights.safetensors, best.json)


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
        folder: Where the best checked student is kept for a resumed run (the distillation's checkpoint folder,
            which distill clears when its saved steps belong to another plan); None: in memory only.
        curve: [step, top-1 %, loss vs the baseline pp] per check.
        stopped_at: The step a plateau stopped the run at (None: it did not).
        best_step: The step of the best point so far (0: the student before distillation), or None.
    """

    score: Callable[[nn.Module], float]
    every: int
    min_gain: float
    patience: int = PATIENCE
    min_steps: int = MIN_CHECKED_STEPS
    baseline: float = 0.0
    folder: Path | None = None
    curve: list[list[float]] = field(default_factory=list)
    stopped_at: int | None = None
    best_step: int | None = None
    _best: float = field(default=float("-inf"), init=False)
    _waits: int = field(default=0, init=False)
    _start: dict[str, torch.Tensor] | None = field(default=None, init=False)
    _synced: bool = field(default=False, init=False)

    def check(self, step: int, model: nn.Module) -> float:
        """Score the model now and add the point to the curve; return its top-1 %."""
        acc = float(self.score(model))
        self.curve.append([int(step), round(acc, 3), round(self.baseline - acc, 3)])
        return acc

    def start(self, model: nn.Module) -> None:
        """Score the student before distillation (step 0, the first best) and hold its weights in memory."""
        self._best, self.best_step = self.check(0, model), 0
        self._start = {k: v.detach().clone() for k, v in model.state_dict().items()}

    def __call__(self, step: int, model: nn.Module) -> str | None:
        """Check every `every` steps (distill calls it after each step); return "stop" on a plateau."""
        if step % self.every:
            return None
        self._sync()
        acc = self.check(step, model)
        if acc >= self._best + self.min_gain - 1e-9:
            self._best, self._waits, self.best_step = acc, 0, step
            self._save(step, acc, model)
        else:
            self._waits += 1
        if self._waits >= self.patience and step >= self.min_steps:
            self.stopped_at = step
            return "stop"
        return None

    def finish(self, model: nn.Module, step: int) -> tuple[int, float, float] | None:
        """Keep the best point's weights in `model` when they beat the last step's by one image or more.

        Returns (best step, its top-1 %, the last step's top-1 %) when the weights were replaced, else None.
        """
        self._sync()
        last = next((p[1] for p in reversed(self.curve) if p[0] == step), None)
        if last is None:
            last = self.check(step, model)
        if self.best_step is None or self.best_step == step or self._best < last + self.min_gain - 1e-9:
            return None
        state = self._start if self.best_step == 0 else self._load()
        if state is None:  # the kept weights are gone (a foreign folder): the last step's stay
            return None
        model.load_state_dict(state)
        return self.best_step, self._best, last

    def _save(self, step: int, acc: float, model: nn.Module) -> None:
        """Keep the best checked student on disk, for a resumed run to compare against and restore."""
        if self.folder is None:
            return

        state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
        with atomic_dir(self.folder / BEST) as tmp:
            save_file(state, str(tmp / "weights.safetensors"))
            write_json_atomic(tmp / "best.json", {"step": int(step), "top1": acc})

    def _load(self) -> dict[str, torch.Tensor] | None:
        """Return the kept weights of the best checked student, or None."""
        if self.folder is None or not (self.folder / BEST / "weights.safetensors").exists():
            return None

        return load_file(str(self.folder / BEST / "weights.safetensors"))

    def _sync(self) -> None:
        """Adopt the best point an earlier attempt of this distillation kept (once, after distill's restore)."""
        if self._synced or self.folder is None:
            return
        self._synced = True

        try:
            kept = read_json(self.folder / BEST / "best.json")
        except (OSError, ValueError):
            return
        if float(kept["top1"]) > self._best:
            self._best, self.best_step = float(kept["top1"]), int(kept["step"])


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
