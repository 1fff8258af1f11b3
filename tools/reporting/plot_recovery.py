"""The recovery curve: distillation loss and running agreement with the baseline, per candidate."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from profiling_agent.tools.io import read_json
from profiling_agent.tools.reporting.plots import new_figure, png_bytes

CURVE_POINTS = 120  # points kept per candidate in result.json (the full curve stays in iter_NN/recovery.json)


def attach_curves(result: dict[str, Any], run_path: str | os.PathLike) -> dict[str, Any]:
    """Copy each candidate's distillation curve (thinned to CURVE_POINTS) from its recovery.json into `result`.

    The report is then rebuilt from result.json alone. Returns `result`, changed in place.
    """
    for cand in result.get("candidates") or []:
        path = (cand.get("recovery") or {}).get("curve")
        file = Path(run_path) / path if path else None
        if file is None or not file.is_file():
            continue
        points = (read_json(file).get("distill") or {}).get("curve") or []
        stride = max(1, -(-len(points) // CURVE_POINTS))
        kept = points[::stride]
        if points and kept[-1] != points[-1]:
            kept.append(points[-1])
        if kept:
            cand["recovery_curve"] = kept
    return result


def plot_recovery(result: Mapping[str, Any]) -> bytes | None:
    """Plot loss and running agreement against the step, one line per candidate (None without distillation)."""
    curves = [(c["iteration"], c["recovery_curve"]) for c in result.get("candidates") or [] if c.get("recovery_curve")]
    if not curves:
        return None
    fig = new_figure(9.0, 3.4)
    loss_ax, agree_ax = fig.subplots(1, 2)
    for iteration, points in curves:
        steps = [p[0] + 1 for p in points]
        loss_ax.plot(steps, [p[1] for p in points], label=f"iter {iteration}", linewidth=1.2)
        agree_ax.plot(steps, [p[2] for p in points], label=f"iter {iteration}", linewidth=1.2)
    loss_ax.set(xlabel="distillation step", ylabel="loss (KL x T^2 + CE)", title="Distillation loss")
    agree_ax.set(xlabel="distillation step", ylabel="agreement with the baseline, %", title="Running agreement")
    for ax in (loss_ax, agree_ax):
        ax.grid(alpha=0.3)
    agree_ax.legend(fontsize=8, loc="lower right")
    return png_bytes(fig)
