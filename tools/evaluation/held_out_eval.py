"""The held-out test: the delivered model chosen, then measured beside the baseline on images nothing else saw."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from profiling_agent.state import ArtifactRef, Best, EvalRecord, Objective, TestEval
from profiling_agent.tools.io import sha256_path


def delivered_best(
    best: Best | None,
    base_eval: EvalRecord | None,
    baseline: ArtifactRef | None,
    objective: Objective,
    root: Path,
    final: tuple[dict[str, Any], dict[str, Any]] | None = None,
) -> tuple[Best | None, str]:
    """Return what best/ holds and why, and say so in a phrase.

    The pruned best when it keeps the budget and pruning bought something, else the unpruned model's fastest form
    within the budget (quantization only). With the final side-by-side timing (`final_latency`), both the peer and
    the speed over it are read there.
    """
    from profiling_agent.tools.evaluation.delivery import (
        choose_delivery,
    )  # lazy: torch; nodes.held_out loads this module without it

    chosen, why = choose_delivery(best, base_eval, baseline, objective, final)
    if chosen and chosen.delivered and not chosen.delivered.sha256:  # the peer's form on disk
        chosen.delivered.sha256 = sha256_path(root / chosen.delivered.path)
    delivery = (
        f"delivered: {'iteration ' + str(chosen.iteration) if chosen and chosen.iteration else 'the unpruned model'}"
    )
    return chosen, delivery + (f" ({why})" if chosen else "")


def baseline_stand_in(base_eval: EvalRecord | None, root: Path, device: str, threads: int) -> tuple[Any, Path] | None:
    """Return the FP32 form that predicted for the baseline on validation (opened) and its folder, or None.

    `measure_baseline` chose it (`EvalRecord.predicted_by`: faster than torch, logits within the FP32 tolerance);
    on the CPU only, and None when its folder no longer opens (torch predicts).
    """
    from profiling_agent.tools.runtimes.forms import (
        load_form,
    )  # lazy: torch; nodes.held_out loads this module without it

    name = base_eval.predicted_by if base_eval is not None and str(device).startswith("cpu") else None
    path = next((v.path for v in base_eval.variants if v.name == name and v.path), None) if base_eval and name else None
    if path is None:
        return None
    folder = root / path
    try:
        return load_form(folder, threads), folder
    except Exception:  # noqa: BLE001 - a form that no longer opens: torch predicts the baseline
        return None


def held_out_result(
    preds: dict[str, Any], labels: Any, best: Best | None, *, split: str, device: str, seed: int, procs: int = 1
) -> tuple[TestEval, str]:
    """Score the baseline's and the best model's held-out predictions: accuracy, agreement, paired 95% CI."""
    from profiling_agent.tools.evaluation.bootstrap import (
        correct,
        paired_delta_ci,
    )  # lazy: torch; nodes.held_out loads this module without it
    from profiling_agent.tools.evaluation.metrics import (
        agreement,
        top1,
    )  # lazy: torch; nodes.held_out loads this module without it

    result = TestEval(
        split=split, n_samples=len(labels), device=device, baseline_accuracy=top1(preds["baseline"], labels)
    )
    message = f"held-out test ({result.n_samples} images): baseline {result.baseline_accuracy:.2f}%"
    if procs > 1:
        message = message.replace(" images)", f" images, {procs} processes)", 1)
    if "best" in preds and best:
        result.best_iteration = best.iteration
        result.best_accuracy = top1(preds["best"], labels)
        result.agreement = agreement(preds["best"], preds["baseline"])
        result.delta = round(result.best_accuracy - result.baseline_accuracy, 6)
        ci = paired_delta_ci(correct(preds["best"], labels), correct(preds["baseline"], labels), seed=seed)
        result.delta_ci = list(ci)
        message += (
            f", best (iteration {best.iteration}) {result.best_accuracy:.2f}% "
            f"({result.delta:+.2f} pp, 95% CI [{ci[0]:+.2f}, {ci[1]:+.2f}])"
        )
    return result, message
