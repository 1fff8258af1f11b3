"""Train an image classifier on preprocessed pixels: AdamW, linear warm-up then cosine decay, seeded batches."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

from profiling_agent.tools import interrupt

Augment = Callable[[torch.Tensor, torch.Generator], torch.Tensor]
OnStep = Callable[[int, int, int, torch.Tensor], None]


def warmup_cosine_lr(step: int, total: int, peak: float, warmup: float) -> float:
    """Return the learning rate of `step` out of `total`: linear warm-up, then cosine decay to zero.

    Args:
        step: The step about to run (0-based).
        total: All steps of the schedule.
        peak: The learning rate at the end of the warm-up.
        warmup: Share of all steps spent warming up (at least one step).
    """
    warm = max(1, int(total * warmup))
    if step < warm:
        return peak * (step + 1) / warm
    progress = (step - warm) / max(1, total - warm)
    return peak * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


def train_classifier(
    model: torch.nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    schedule: tuple[int, int, float, float, float],
    seed: int = 0,
    augment: Augment | None = None,
    on_step: OnStep | None = None,
) -> None:
    """Train `model` in place with AdamW and a warm-up + cosine schedule, honouring a stop request between steps.

    Args:
        model: A Hugging Face image classifier (called with pixel_values, returns .logits).
        x: Preprocessed training pixels (N, C, H, W).
        y: Their labels (N,).
        schedule: (epochs, batch size, peak learning rate, weight decay, warm-up fraction).
        seed: Seed of the batch order and of `augment`'s draws.
        augment: Called on each batch with the seeded generator; None trains on the pixels as they are.
        on_step: Called after each step as on_step(steps done, total steps, epoch, loss).

    Raises:
        tools.interrupt.Interrupted: A stop was requested (Ctrl-C).
    """
    epochs, batch_size, lr, weight_decay, warmup = schedule
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    total, step = epochs * math.ceil(len(x) / batch_size), 0
    model.train()
    for epoch in range(epochs):
        order = torch.randperm(len(x), generator=gen)
        for start in range(0, len(x), batch_size):
            interrupt.check()
            batch = order[start : start + batch_size]
            xb = augment(x[batch], gen) if augment is not None else x[batch]
            for group in opt.param_groups:
                group["lr"] = warmup_cosine_lr(step, total, lr, warmup)
            loss = F.cross_entropy(model(pixel_values=xb).logits, y[batch])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step += 1
            if on_step is not None:
                on_step(step, total, epoch, loss)
    model.eval()
