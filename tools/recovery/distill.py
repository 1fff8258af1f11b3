"""Knowledge distillation from the untouched baseline into a pruned student, bounded, seeded and resumable."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from profiling_agent.tools.models.forward import forward_logits, model_device
from profiling_agent.tools.recovery import distill_state

PROBE_STEPS = 5  # steps timed (median) before the schedule is shrunk to fit the wall-clock cap
Batches = Callable[[int], tuple[torch.Tensor, torch.Tensor]]  # step -> (pixels, labels; -1 = no label)


@dataclass
class DistillConfig:
    """How the student is trained; every field is part of the resume fingerprint."""

    steps: int = 100  # optimizer steps (the wall-clock cap may end the run earlier)
    lr: float = 3e-4  # peak AdamW learning rate
    weight_decay: float = 0.0  # fine-tuning a trained model: no decay by default
    warmup: float = 0.1  # fraction of steps with a linear warm-up, then cosine decay to 0
    temperature: float = 2.0  # softens teacher and student logits in the KL term
    kl_weight: float = 1.0  # weight of T^2 * KL(teacher || student)
    ce_weight: float = 0.5  # weight of cross-entropy on labels, where labels exist
    clip: float = 1.0  # gradient-norm clipping
    seed: int = 0  # reseeds torch before every step (dropout), so a resumed run draws the same numbers
    minutes: float = 0.0  # wall-clock cap over all attempts (0: none); the schedule shrinks to fit it
    save_every: int = 0  # steps between checkpoints (0: about 20 per run)

    def fingerprint(self) -> dict[str, Any]:
        """Return what must match for a saved step to be resumed (the cap and save cadence may change)."""
        return {k: v for k, v in asdict(self).items() if k not in ("minutes", "save_every")}


def lr_at(step: int, total: int, peak: float, warmup: float) -> float:
    """Return the learning rate of `step` out of `total`: linear warm-up, then cosine decay to zero."""
    warm = max(1, int(total * warmup))
    if step < warm:
        return peak * (step + 1) / warm
    progress = (step - warm) / max(1, total - warm)
    return peak * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


def distill_loss(
    student: torch.Tensor, teacher: torch.Tensor, labels: torch.Tensor, config: DistillConfig
) -> tuple[torch.Tensor, dict[str, float]]:
    """Return the weighted loss: T^2 KL(softmax(teacher/T) || softmax(student/T)) and CE on labelled images."""
    t = config.temperature
    kl = F.kl_div(
        F.log_softmax(student / t, -1), F.log_softmax(teacher / t, -1), log_target=True, reduction="batchmean"
    )
    loss = config.kl_weight * kl * t * t
    parts = {"kl": float(kl.detach())}
    labelled = labels >= 0
    if config.ce_weight > 0 and bool(labelled.any()):
        ce = F.cross_entropy(student[labelled], labels[labelled])
        loss = loss + config.ce_weight * ce
        parts["ce"] = float(ce.detach())
    return loss, parts


def fresh_parameters(model: nn.Module) -> None:
    """Replace every parameter by a new one with the same values (tied parameters stay tied).

    Pruning that reassigns `param.data` in place (e.g. Swin's relative-position bias table) leaves autograd's
    cached shape of the old parameter behind, and the first backward pass then fails; new parameters do not.
    """
    fresh: dict[int, nn.Parameter] = {}
    for module in model.modules():
        for name, param in list(module.named_parameters(recurse=False)):
            if id(param) not in fresh:
                fresh[id(param)] = nn.Parameter(param.detach().clone(), requires_grad=param.requires_grad)
            setattr(module, name, fresh[id(param)])


def _train_mode(student: nn.Module) -> None:
    """Train mode with frozen BatchNorm statistics (small batches would spoil them; reconstruction set them)."""
    student.train()
    for module in student.modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            module.eval()


def _decide_total(total: int, step: int, spent: float, step_seconds: float, cap_s: float) -> int:
    """Shrink the planned steps so the rest fits the wall-clock cap."""
    if cap_s <= 0 or step_seconds <= 0:
        return total
    return max(step + 1, min(total, step + int((cap_s - spent) / step_seconds)))


def distill(
    student: nn.Module,
    teacher: nn.Module,
    batches: Batches,
    config: DistillConfig,
    *,
    checkpoint_dir: Path | None = None,
    fingerprint: dict[str, Any] | None = None,
    progress: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Fine-tune `student` in place to match `teacher`'s logits (and the labels), resuming from saved steps.

    AdamW with warm-up and cosine decay, gradient clipping, torch reseeded from (seed, step) before each step;
    batch s is `batches(s)`, so the data position is the step. With `checkpoint_dir`, the student, the optimizer
    state and the progress are saved every `save_every` steps (safetensors + JSON); a later call with the same
    config and `fingerprint` continues from the last saved step, so an interrupted run ends with the weights an
    uninterrupted one would have (up to floating-point nondeterminism of the device). On CUDA it runs in bfloat16
    autocast. The student is left in eval mode.

    Args:
        student: The pruned model; trained in place.
        teacher: The untouched baseline; never changed.
        batches: Returns (pixels, labels) of a step; labels of -1 are ignored by the cross-entropy.
        config: Steps, learning rate, loss weights, seed and the wall-clock cap.
        checkpoint_dir: Where steps are saved (None: not resumable).
        fingerprint: Facts that must match for saved steps to be reused (e.g. the student's starting weights).
        progress: Called after each step with {"step", "total", "loss", "agreement", "lr"}.

    Returns:
        {"steps_planned", "steps_done", "resumed_from", "seconds", "loss", "agreement", "curve", "capped"}.
    """
    device = model_device(student)
    teacher.eval()
    fresh_parameters(student)
    params = [p for p in student.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay)
    key = {"config": config.fingerprint(), **(fingerprint or {})}
    state: dict[str, Any] = {
        "total": config.steps,
        "spent": 0.0,
        "curve": [],
        "agreement": None,
        "loss": None,
        "fitted": False,
    }
    timings: list[float] = []
    start = 0
    if checkpoint_dir is not None:
        peeked = distill_state.peek(checkpoint_dir)
        if peeked is not None and peeked.get("key") == key:
            saved = distill_state.load_latest(checkpoint_dir, student, optimizer)
            assert saved is not None
            state = {k: saved[k] for k in state}
            start = int(saved["step"]) + 1
        elif peeked is not None:  # saved by another plan or config: start afresh
            distill_state.clear(checkpoint_dir)
    resumed_from = start
    every = config.save_every or max(1, config.steps // 20)
    cap_s = config.minutes * 60.0
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else None
    began = time.perf_counter()
    spent0 = float(state["spent"])
    step = start
    _train_mode(student)
    while step < state["total"]:
        tick = time.perf_counter()
        torch.manual_seed(config.seed * 1_000_003 + step)
        pixels, labels = batches(step)
        pixels, labels = pixels.to(device), labels.to(device)
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, state["total"], config.lr, config.warmup)
        with torch.no_grad():
            teacher_logits = forward_logits(teacher, pixels).float()
        if autocast is not None:
            with autocast:
                student_logits = forward_logits(student, pixels).float()
        else:
            student_logits = forward_logits(student, pixels).float()
        loss, _ = distill_loss(student_logits, teacher_logits, labels, config)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, config.clip)
        optimizer.step()
        agree = float((student_logits.argmax(-1) == teacher_logits.argmax(-1)).float().mean()) * 100
        ema = agree if state["agreement"] is None else 0.9 * state["agreement"] + 0.1 * agree
        state.update(loss=round(float(loss.detach()), 6), agreement=round(ema, 3))
        state["curve"].append([step, state["loss"], state["agreement"]])
        state["spent"] = spent0 + time.perf_counter() - began
        timings.append(time.perf_counter() - tick)
        if cap_s > 0 and not state["fitted"] and len(timings) == PROBE_STEPS:  # fit the rest into the cap, once
            state["total"] = _decide_total(state["total"], step, state["spent"], statistics.median(timings), cap_s)
            state["fitted"] = True
        last = step + 1 >= state["total"] or (cap_s > 0 and state["spent"] >= cap_s)
        if checkpoint_dir is not None and ((step + 1) % every == 0 or last):
            distill_state.save_step(checkpoint_dir, step, student, optimizer, {**state, "key": key})
        if progress is not None:
            progress(
                {"step": step + 1, "total": state["total"], "loss": state["loss"], "agreement": state["agreement"]}
            )
        step += 1
        if cap_s > 0 and state["spent"] >= cap_s:
            break
    student.eval()
    return {
        "steps_planned": config.steps,
        "steps_done": step,
        "resumed_from": resumed_from,
        "seconds": round(float(state["spent"]), 3),
        "loss": state["loss"],
        "agreement": state["agreement"],
        "curve": state["curve"],
        "capped": step < config.steps,
    }
