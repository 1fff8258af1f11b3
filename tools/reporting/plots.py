"""PNG charts of a finished run (profile breakdowns and accuracy-vs-cost Pareto plots) with matplotlib's Agg."""

from __future__ import annotations

import io
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from profiling_agent.tools import run_layout
from profiling_agent.tools.io import write_bytes_atomic
from profiling_agent.tools.reporting.labels import place_labels
from profiling_agent.tools.reporting.pareto import (  # noqa: F401 - re-exported: the plots' data live there
    extra_baselines,
    pareto_front,
    pareto_points,
)
from profiling_agent.tools.text import as_number, human

PLOTS_DIR = run_layout.PLOTS
# Deterministic file names, in the order a report shows them; the value is the figure's caption.
PLOT_FILES: dict[str, tuple[str, str]] = {
    "pareto_latency": ("pareto_latency.png", "Top-1 accuracy against batch-1 latency (relative to the baseline)"),
    "pareto_params": ("pareto_params.png", "Top-1 accuracy against parameter count"),
    "layer_latency": ("layer_latency.png", "Slowest layers of the baseline (module self time, batch 1)"),
    "cost_by_group": ("cost_by_group.png", "Params, MACs and latency share of each prunable group"),
    "cost_by_type": ("cost_by_type.png", "Params and MACs of the baseline by layer type"),
    "recovery_curve": ("recovery_curve.png", "Recovery: distillation loss and agreement with the baseline per step"),
    "predicted_loss": ("predicted_loss.png", "Accuracy loss per round: trial prediction (95% interval) vs measured"),
}

_BASE_COLOR, _CAND_COLOR, _BEST_COLOR, _REF_COLOR, _FRONT_COLOR = "#444444", "#4c78a8", "#e45756", "#9467bd", "#f58518"
_DPI = 110


# ------------------------------------------------------------------------------------------- figures


def new_figure(width: float, height: float):
    """Make a matplotlib Figure of the given size in inches, drawn without pyplot."""
    from matplotlib.backends.backend_agg import (
        FigureCanvasAgg,
    )  # lazy: matplotlib; tools.reporting.html loads this module without it
    from matplotlib.figure import (
        Figure,
    )  # lazy: matplotlib; Agg through its own canvas: no pyplot, no global backend state

    fig = Figure(figsize=(width, height), dpi=_DPI, layout="constrained")
    FigureCanvasAgg(fig)  # a renderer to measure text with (label placement)
    return fig


def png_bytes(fig) -> bytes:
    """Render a figure to PNG bytes."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=_DPI, metadata={"Software": None})
    return buf.getvalue()


def _short(name: str, limit: int = 46) -> str:
    return name if len(name) <= limit else "..." + name[-(limit - 3) :]


def accuracy_floor(points: list[dict[str, Any]], base_accuracy: float | None, budget: float | None) -> float | None:
    """Return the lowest accuracy a Pareto plot shows, or None when every point fits.

    A candidate far below the budget (a broken plan) would squash the interesting region near the
    baseline; it is drawn on this floor instead, labelled with its real accuracy.
    """
    if base_accuracy is None:
        return None
    floor = base_accuracy - max(4.0 * (budget or 0.0), 5.0)
    return floor if any(p["accuracy"] < floor for p in points) else None


_STYLE = {
    "baseline": dict(marker="s", s=70, color=_BASE_COLOR, label="baseline"),
    "candidate": dict(marker="o", s=45, color=_CAND_COLOR, label="candidates"),
    "best": dict(marker="*", s=240, color=_BEST_COLOR, label="best", edgecolor="black", linewidths=0.6),
    "reference": dict(marker="D", s=50, color=_REF_COLOR, label="other baselines"),
    "variant": dict(marker="^", s=30, color=_CAND_COLOR, alpha=0.45, label="best's other backend forms"),
}
# which labels claim their place first when points crowd: the delivered model and the baseline read first
_LABEL_ORDER = ("best", "baseline", "candidate", "reference", "variant")


def _draw_points(ax, points: list[dict[str, Any]], cost: str, shown) -> None:
    """Draw the Pareto front (dashed) and each kind of point with its marker."""
    front = pareto_front(points, cost)
    if len(front) > 1:
        xs, ys = [p[cost] for p in front], [shown(p) for p in front]
        ax.plot(xs, ys, color=_FRONT_COLOR, lw=1.2, ls="--", zorder=1, label="Pareto front")
    for kind, kw in _STYLE.items():
        chosen = [p for p in points if p["kind"] == kind]
        if chosen:
            ax.scatter([p[cost] for p in chosen], [shown(p) for p in chosen], zorder=3, **kw)


def _dress_axes(ax, cost: str, base_accuracy: float | None, budget: float | None) -> None:
    """Draw the budget line and the baseline's latency, name the axes and add the grid."""
    if base_accuracy is not None and budget is not None:
        label = f"accuracy budget (-{budget:g} pp)"
        ax.axhline(base_accuracy - budget, color="#888888", lw=0.9, ls=":", zorder=0, label=label)
    if cost == "latency_rel":
        ax.axvline(1.0, color="#bbbbbb", lw=0.8, zorder=0)
        ax.set_xlabel("batch-1 latency / baseline latency (side by side; lower is faster)")
    else:
        from matplotlib.ticker import (
            FuncFormatter,
        )  # lazy: matplotlib; tools.reporting.html loads this module without it

        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: human(v, ".3g")))
        ax.set_xlabel("parameters")
    ax.set_ylabel("top-1 accuracy (%)")
    ax.set_title("Accuracy vs " + ("latency" if cost == "latency_rel" else "parameters"))
    ax.grid(alpha=0.3)
    ax.margins(x=0.15, y=0.2)


def pareto_figure(result: Mapping[str, Any], cost: str):
    """Build the figure of accuracy against `cost` ("latency_rel" or "params"); the best candidate is starred.

    Every point is labelled where its label overlaps no other label or marker (tools.reporting.labels); the legend
    sits below the axes, out of the points' way.

    Returns:
        A matplotlib Figure with its layout done, or None when no point has both numbers.
    """
    points = [p for p in pareto_points(result) if p[cost] is not None]
    if not points:
        return None
    base = result.get("baseline") or {}
    budget = as_number((result.get("objective") or {}).get("max_acc_drop"))
    floor = accuracy_floor(points, as_number(base.get("accuracy")), budget)

    def shown(p: dict[str, Any]) -> float:
        return p["accuracy"] if floor is None else max(p["accuracy"], floor)

    fig = new_figure(6.4, 4.8)
    ax = fig.add_subplot()
    _draw_points(ax, points, cost, shown)
    _dress_axes(ax, cost, as_number(base.get("accuracy")), budget)
    if floor is not None:
        top = max(shown(p) for p in points)
        pad = max(top - floor, 1.0)
        ax.set_ylim(floor - 0.08 * pad, top + 0.15 * pad)
        ax.axhline(floor, color=_BEST_COLOR, lw=0.6, ls="-.", zorder=0)
    fig.legend(fontsize=8, loc="outside lower center", ncols=3, frameon=False)
    fig.draw_without_rendering()  # the layout is final before labels are placed in display pixels
    ordered = sorted(points, key=lambda p: _LABEL_ORDER.index(p["kind"]))
    labels = [
        (
            f"{p['label']} ({p['accuracy']:.1f}%, off scale)"
            if floor is not None and p["accuracy"] < floor
            else p["label"],
            p[cost],
            shown(p),
        )
        for p in ordered
    ]
    place_labels(ax, labels)
    return fig


def plot_pareto(result: Mapping[str, Any], cost: str) -> bytes | None:
    """Plot accuracy against `cost` ("latency_rel" or "params") for every model (pareto_figure) as PNG bytes.

    Returns:
        PNG bytes, or None when no point has both numbers.
    """
    fig = pareto_figure(result, cost)
    return None if fig is None else png_bytes(fig)


def plot_layer_latency(profile: Mapping[str, Any], top: int = 20) -> bytes | None:
    """Horizontal bars of the `top` layers by module self time, annotated with their latency share."""
    rows = sorted(
        (r for r in profile.get("layers") or [] if as_number(r.get("latency_ms"))),
        key=lambda r: r["latency_ms"],
        reverse=True,
    )[:top]
    if not rows:
        return None
    rows = rows[::-1]  # largest on top
    fig = new_figure(8.0, 1.2 + 0.28 * len(rows))
    ax = fig.add_subplot()
    labels = [f"{_short(r['name'])} ({r.get('type', '?')})" for r in rows]
    values = [r["latency_ms"] for r in rows]
    bars = ax.barh(range(len(rows)), values, color=_CAND_COLOR)
    ax.set_yticks(range(len(rows)), labels, fontsize=8)
    for bar, r in zip(bars, rows, strict=True):
        share = as_number(r.get("latency_share"))
        text = f"{r['latency_ms']:.3f} ms" + (f"  {share:.1%}" if share is not None else "")
        ax.annotate(
            text,
            (bar.get_width(), bar.get_y() + bar.get_height() / 2),
            xytext=(3, 0),
            textcoords="offset points",
            va="center",
            fontsize=7,
        )
    ax.set_xlabel("self time per forward (ms, batch 1)")
    ax.set_title(f"Top {len(rows)} layers by latency")
    ax.margins(x=0.22)
    ax.grid(axis="x", alpha=0.3)
    return png_bytes(fig)


def group_shares(profile: Mapping[str, Any]) -> list[tuple[str, dict[str, float]]]:
    """Per prunable group its params/MACs/latency shares, plus the rest of the model as a last row."""
    costs = profile.get("group_costs") or {}
    order = [g["name"] for g in profile.get("groups") or [] if g.get("name") in costs]
    order += [name for name in costs if name not in order]
    keys = ("params_share", "macs_share", "latency_share")
    rows = [(name, {k: float(costs[name].get(k) or 0.0) for k in keys}) for name in order]
    if rows:
        rows.append(("rest of the model", {k: max(0.0, 1.0 - sum(r[k] for _, r in rows)) for k in keys}))
    return rows


def plot_cost_by_group(profile: Mapping[str, Any]) -> bytes | None:
    """Draw grouped bars: each prunable group's share of params, MACs and latency (and the unprunable rest)."""
    rows = group_shares(profile)
    if not rows:
        return None
    import numpy as np  # lazy: numpy; tools.reporting.html loads this module without it

    fig = new_figure(8.0, 1.4 + 0.42 * len(rows))
    ax = fig.add_subplot()
    y = np.arange(len(rows))[::-1]
    height = 0.27
    for i, (key, label, color) in enumerate(
        (
            ("params_share", "params", _CAND_COLOR),
            ("macs_share", "MACs", _FRONT_COLOR),
            ("latency_share", "latency", _BEST_COLOR),
        )
    ):
        ax.barh(y + (1 - i) * height, [100 * r[key] for _, r in rows], height, label=label, color=color)
    kinds = {g["name"]: g.get("kind", "") for g in profile.get("groups") or []}
    ax.set_yticks(y, [f"{name} ({kinds[name]})" if kinds.get(name) else name for name, _ in rows], fontsize=8)
    ax.set_xlabel("share of the whole model (%)")
    ax.set_title("Cost by prunable group")
    ax.grid(axis="x", alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    return png_bytes(fig)


def type_totals(profile: Mapping[str, Any]) -> list[tuple[str, int, int]]:
    """(layer type, params, MACs) summed over the profile rows (own params/MACs per row), largest first."""
    totals: dict[str, list[int]] = {}
    for row in profile.get("layers") or []:
        acc = totals.setdefault(str(row.get("type", "?")), [0, 0])
        acc[0] += int(row.get("params") or 0)
        acc[1] += int(row.get("macs") or 0)
    out = [(name, p, m) for name, (p, m) in totals.items() if p or m]
    return sorted(out, key=lambda t: (-(t[1] + t[2]), t[0]))


def plot_cost_by_type(profile: Mapping[str, Any], top: int = 12) -> bytes | None:
    """Two panels of horizontal bars: params and MACs per layer type (the smallest types folded into 'other')."""
    rows = type_totals(profile)
    if not rows:
        return None
    if len(rows) > top:
        rest = rows[top - 1 :]
        rows = rows[: top - 1] + [("other", sum(r[1] for r in rest), sum(r[2] for r in rest))]
    rows = rows[::-1]
    fig = new_figure(9.0, 1.3 + 0.3 * len(rows))
    axes = fig.subplots(1, 2, sharey=True)
    panels = (
        (axes[0], [r[1] for r in rows], "params", _CAND_COLOR),
        (axes[1], [r[2] for r in rows], "MACs", _FRONT_COLOR),
    )
    for ax, values, title, color in panels:
        total = sum(values) or 1
        bars = ax.barh(range(len(rows)), values, color=color)
        for bar, v in zip(bars, values, strict=True):
            if v:
                ax.annotate(
                    f"{human(v, '.3g')} ({v / total:.0%})",
                    (bar.get_width(), bar.get_y() + bar.get_height() / 2),
                    xytext=(3, 0),
                    textcoords="offset points",
                    va="center",
                    fontsize=7,
                )
        ax.set_title(f"{title} by layer type")
        ax.margins(x=0.3)
        ax.grid(axis="x", alpha=0.3)
        from matplotlib.ticker import (
            FuncFormatter,
        )  # lazy: matplotlib; tools.reporting.html loads this module without it

        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: human(v, ".3g")))
    axes[0].set_yticks(range(len(rows)), [r[0] for r in rows], fontsize=8)
    return png_bytes(fig)


@dataclass(frozen=True)
class PredictionRow:
    """One round's predicted loss (the trial's, and the one expected after recovery) beside the measured one, pp.

    Measured is the validation drop after recovery (`check.measured_drop_pp`), or for a candidate rejected by its
    recovered trial, the trial slice's loss (the last point of `recovery.trial_curve`).
    """

    iteration: int
    predicted: float  # the trial's loss on the trial slice (refit, before distillation)
    interval: list[float] | None
    measured: float | None
    expected: float | None = None  # the trial corrected as the round chose its goal
    expected_interval: list[float] | None = None


def prediction_rows(result: Mapping[str, Any]) -> list[PredictionRow]:
    """Return the `PredictionRow` of every round that predicted."""
    rows = []
    for cand in result.get("candidates") or []:
        meta = cand.get("prediction") or cand.get("planner_meta") or {}  # result.json's entry, or the state's
        check = cand.get("check") or {}
        predicted = meta.get("predicted_drop", check.get("predicted_drop_pp"))
        if predicted is None:
            continue
        expected = meta.get("expected_drop")
        rows.append(
            PredictionRow(
                int(cand["iteration"]),
                float(predicted),
                meta.get("predicted_interval"),
                measured_loss(cand),
                None if expected is None else float(expected),
                meta.get("expected_interval"),
            )
        )
    return rows


def measured_loss(cand: Mapping[str, Any]) -> float | None:
    """Return a round's measured loss, pp (None when none was measured).

    Validation's loss after recovery, or for a candidate rejected by its recovered trial the trial slice's (the last
    point of `recovery.trial_curve`).
    """
    measured = (cand.get("check") or {}).get("measured_drop_pp")
    curve = (cand.get("recovery") or {}).get("trial_curve")
    if measured is None and cand.get("status") == "rejected" and curve:
        measured = curve[-1][2]
    return measured


def plot_predictions(result: Mapping[str, Any]) -> bytes | None:
    """Plot each round's predicted loss with its 95% interval beside the measured loss and the budget (None: none)."""
    rows = prediction_rows(result)
    if not rows:
        return None
    fig = new_figure(6.0, 3.2)
    ax = fig.add_subplot()
    first = rows[0].iteration
    for r in rows:
        points = [(r.iteration - 0.12, r.predicted, r.interval, "o", _CAND_COLOR, "trial (trial slice, 95% interval)")]
        if r.expected is not None:
            what = "expected after recovery (corrected trial)"
            points.append((r.iteration, r.expected, r.expected_interval, "D", _BASE_COLOR, what))
        for x, y, interval, marker, color, label in points:
            low, high = interval or (y, y)
            ax.errorbar(
                [x],
                [y],
                yerr=[[y - low], [high - y]],
                fmt=marker,
                capsize=4,
                color=color,
                label=label if r.iteration == first else None,
            )
        if r.measured is not None:
            ax.plot(
                [r.iteration + 0.12],
                [r.measured],
                "s",
                color=_BEST_COLOR,
                label="measured" if r.iteration == first else None,
            )
    budget = (result.get("objective") or {}).get("max_acc_drop")
    if budget is not None:
        ax.axhline(float(budget), color=_BASE_COLOR, linestyle="--", linewidth=1, label=f"budget {budget:g} pp")
    ax.set_xticks([r.iteration for r in rows])
    ax.set_xlim(first - 0.5, rows[-1].iteration + 0.5)
    ax.set_xlabel("round")
    ax.set_ylabel("accuracy loss, pp")
    ax.legend(fontsize=8)
    return png_bytes(fig)


# ------------------------------------------------------------------------------------------- files


def render_plots(result: Mapping[str, Any], profile: Mapping[str, Any] | None) -> dict[str, bytes]:
    """Render every chart the run's data allows.

    Args:
        result: result.json of the run.
        profile: profile.json of the run (None skips the profile charts).

    Returns:
        {key of PLOT_FILES: PNG bytes}, in PLOT_FILES order; charts without data are left out.
    """
    profile = profile or {}
    made = {
        "pareto_latency": plot_pareto(result, "latency_rel"),
        "pareto_params": plot_pareto(result, "params"),
        "layer_latency": plot_layer_latency(profile),
        "cost_by_group": plot_cost_by_group(profile),
        "cost_by_type": plot_cost_by_type(profile),
        "predicted_loss": plot_predictions(result),
    }
    return {key: image for key in PLOT_FILES if (image := made.get(key))}


def write_plots(run_path: str | os.PathLike, images: Mapping[str, bytes]) -> dict[str, str]:
    """Write rendered charts to RUN/plots/ (atomically) and remove stale ones missing from `images`.

    Args:
        run_path: The run folder RUN_DIR/THREAD_ID.
        images: {key of PLOT_FILES: PNG bytes}, as returned by render_plots.

    Returns:
        {key: path relative to the run folder}, e.g. {"pareto_latency": "plots/pareto_latency.png"}.
    """
    folder = Path(run_path) / PLOTS_DIR
    written = {}
    for key, (name, _caption) in PLOT_FILES.items():
        if key in images:
            write_bytes_atomic(folder / name, images[key])
            written[key] = f"{PLOTS_DIR}/{name}"
        else:
            (folder / name).unlink(missing_ok=True)
    return written


def markdown_section(written: Mapping[str, str]) -> str:
    """Return a '## Plots' Markdown section linking the written charts by relative path (empty without charts)."""
    if not written:
        return ""
    lines = ["## Plots", ""]
    for key, rel in written.items():
        lines += [f"![{PLOT_FILES[key][1]}]({rel})", ""]
    return "\n".join(lines)
