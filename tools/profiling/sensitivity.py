"""The full sensitivity probe (`probe_groups_full`) and the measures every probe shares.

`probe_groups_full` prunes each group alone on a deep copy of the whole model (the pruning engine, a block removed
whole) and runs the whole model on all the calibration images. The graph's node `probe_sensitivity`
(`nodes/probe.py`) calls the block-local `probe_fast.probe_groups` instead, which falls back to this one for the
groups and models it cannot replay; tests and benchmarks use this one as the reference.
"""

from __future__ import annotations

import copy
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from profiling_agent.tools.compression.families.base import PrunableGroup
from profiling_agent.tools.recovery.reconstruct import reconstruct
from profiling_agent.tools.runtimes.forward import batched_logits
from profiling_agent.tools.text import one_line

log = logging.getLogger(__name__)


class UnprunableGroup(Exception):
    """The probe could not prune a group (recorded as the group's `error`, never raised to callers)."""


def restrict_logits(logits: torch.Tensor, allowed_ids: list[int] | None) -> torch.Tensor:
    """Mask every class outside `allowed_ids` (the dataset's classes) to -inf; all classes when None or empty."""
    if not allowed_ids:
        return logits
    mask = torch.full_like(logits, float("-inf"))
    mask[:, allowed_ids] = 0.0
    return logits + mask


def compare_logits(reference: torch.Tensor, logits: torch.Tensor, labels: torch.Tensor | None) -> dict[str, float]:
    """Return KL(reference || logits), prediction agreement and accuracy drop (percentage points)."""
    p_log = F.log_softmax(reference, dim=-1)
    q_log = F.log_softmax(logits, dim=-1)
    finite = torch.isfinite(p_log) & torch.isfinite(q_log)
    kl_terms = torch.where(finite, p_log.exp() * (p_log - q_log), torch.zeros_like(p_log))
    kl = float(kl_terms.sum(-1).mean())
    ref_pred, pred = reference.argmax(-1), logits.argmax(-1)
    out = {"kl": kl, "agreement": float((ref_pred == pred).float().mean() * 100)}
    if labels is not None:
        out["acc_drop"] = float(((ref_pred == labels).float().mean() - (pred == labels).float().mean()) * 100)
    return out


def damage_of(stats: dict[str, float]) -> float:
    """Return a probe's damage score from `compare_logits` stats: KL plus the fraction of changed predictions."""
    return stats["kl"] + (100.0 - stats["agreement"]) / 100.0


def probe_ratio(group: PrunableGroup, ratio: float) -> float:
    """Return the ratio a probe prunes `group` at: `ratio`, but at least one unit; a block is removed whole (1.0)."""
    if group.kind == "block":
        return 1.0
    return max(ratio, min(0.99, (1.0 + 1e-6) / max(group.units, 1)))


@dataclass(frozen=True)
class ProbeRun:
    """How a probe runs, beside what it measures.

    Attributes:
        allowed_ids: Restrict predictions to these ids (dataset classes that are a subset of the model's).
        seed: Seed of the pruning engine and of the refit's row sampling.
        progress: Called as progress(done, total, group_name).
    """

    allowed_ids: list[int] | None = None
    seed: int = 0
    progress: Callable[[int, int, str], None] | None = None


def probe_groups_full(
    model: nn.Module,
    groups: list[PrunableGroup],
    pixels: torch.Tensor,
    labels: torch.Tensor | None = None,
    *,
    ratio: float = 0.3,
    recover: bool = False,
    batch_size: int = 64,
    run: ProbeRun | None = None,
) -> dict[str, dict[str, Any]]:
    """Prune each group alone at `ratio` (at least one unit; a block whole) on a copy of the model, measure the damage.

    Args:
        model: The baseline model (left untouched).
        groups: Groups from the family adapter.
        pixels: Calibration images (N, C, H, W).
        labels: Their model label ids, or None.
        ratio: Probe ratio per group.
        recover: Refit the group's consumer layer by least squares (tools/recovery/reconstruct.py) on the same
            images before measuring, so the damage is what is left after the run's recovery: a group that
            recovers well looks less sensitive and gets pruned harder.
        batch_size: Inference batch size.
        run: Allowed class ids, seed and progress callback.

    Returns:
        Per group name, the fields of `state.GroupSensitivity`: `damage` (KL divergence of the probed model's
        predictions from the baseline's, plus the fraction of changed predictions), `kl`, `agreement`, `acc_drop`
        (with labels), `units_removed`, `ratio`. A group the probe cannot prune (the engine fails on it, or it
        removes no unit) is unprunable: `error` says why, its damage is ten times the largest measured one
        (JSON stays finite) and kl/agreement/acc_drop are None, as nothing was measured.
    """
    run = run or ProbeRun()
    reference = restrict_logits(batched_logits(model, pixels, batch_size), run.allowed_ids)
    setup = _Setup(pixels, labels, reference, ratio, recover, batch_size, run)
    results: dict[str, dict[str, Any]] = {}
    for done, group in enumerate(groups):
        results[group.name] = _probe_group(model, group, setup)
        if run.progress:
            run.progress(done + 1, len(groups), group.name)
    return cap_damage(results)


@dataclass(frozen=True)
class _Setup:
    """One full probe's calibration images, their labels and baseline logits, and its settings."""

    pixels: torch.Tensor
    labels: torch.Tensor | None
    reference: torch.Tensor
    ratio: float
    recover: bool
    batch_size: int
    run: ProbeRun


def _probe_group(model: nn.Module, group: PrunableGroup, setup: _Setup) -> dict[str, Any]:
    """Prune `group` alone on a copy of `model` (refit when asked) and return its row (`error` when it cannot)."""
    from profiling_agent.tools.compression.pruning import (
        prune_model,
    )  # lazy: torch_pruning; nodes.probe loads this module without it

    probe = probe_ratio(group, setup.ratio)
    entry = {"layer": f"^{re.escape(group.module)}$", "type": group.kind, "ratio": probe}
    trial = copy.deepcopy(model)
    try:
        report = prune_model(trial, [entry], setup.pixels[:1], seed=setup.run.seed)
        removed = sum(a.units_before - a.units_after for a in report.applied if a.group == group.name)
        if not removed:
            raise UnprunableGroup(f"pruning at ratio {probe:.2f} removes none of its {group.units} units")
        if setup.recover:
            reconstruct(model, trial, setup.pixels, report.applied, seed=setup.run.seed)
        logits = restrict_logits(batched_logits(trial, setup.pixels, setup.batch_size), setup.run.allowed_ids)
        stats = compare_logits(setup.reference, logits, setup.labels)
        return {**stats, "damage": damage_of(stats), "units_removed": removed, "ratio": round(probe, 4)}
    except Exception as exc:  # noqa: BLE001 - a group the engine cannot prune is a recorded fact, not fatal
        reason = one_line(exc)[:300] if isinstance(exc, UnprunableGroup) else f"{type(exc).__name__}: {one_line(exc)}"
        log.warning("sensitivity probe cannot prune %s: %s", group.name, reason)
        return {"damage": float("inf"), "error": reason[:300], "ratio": round(probe, 4)}
    finally:
        del trial


def cap_damage(results: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Replace each infinite damage (an unprunable group) by ten times the largest finite one (JSON stays finite).

    Returns:
        `results`, changed in place.
    """
    finite = [r["damage"] for r in results.values() if r["damage"] != float("inf")]
    cap = 10.0 * max(finite) if finite else 1.0
    for r in results.values():
        if r["damage"] == float("inf"):
            r["damage"] = cap
    return results


def engine_failures(
    model: nn.Module, groups: list[PrunableGroup], ratio: float, example: torch.Tensor, seed: int = 0
) -> dict[str, str]:
    """Return {group: reason} for the groups the pruning engine refuses at the probe ratio.

    Masking never asks the engine, so the block-local probe would rate a group it cannot prune like any other; one
    copy pruned at every group's probe ratio finds out in one dependency-graph build (one by one when that fails).
    """
    from profiling_agent.tools.compression.pruning import (
        prune_model,
    )  # lazy: torch_pruning; nodes.probe loads this module without it

    def entry(group: PrunableGroup) -> dict[str, Any]:
        return {"layer": f"^{re.escape(group.module)}$", "type": group.kind, "ratio": probe_ratio(group, ratio)}

    def refused(chosen: list[PrunableGroup]) -> str | None:
        try:
            prune_model(copy.deepcopy(model), [entry(g) for g in chosen], example, seed=seed)
        except Exception as exc:  # noqa: BLE001 - the reason is recorded as the group's fact
            return f"{type(exc).__name__}: {one_line(exc)}"
        return None

    if not groups or refused(groups) is None:
        return {}
    return {g.name: reason for g in groups if (reason := refused([g])) is not None}
