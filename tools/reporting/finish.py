"""The end of a run on disk: result.json with the joint final latency, then report.md, report.html and plots."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from profiling_agent.tools import run_layout
from profiling_agent.tools.io import read_json, write_json_atomic, write_text_atomic
from profiling_agent.tools.reporting import files as report_files
from profiling_agent.tools.reporting.markdown import render_markdown
from profiling_agent.tools.reporting.plot_recovery import attach_curves
from profiling_agent.tools.reporting.records import RunRecords
from profiling_agent.tools.reporting.result import build_result


def write_run_report(
    root: Path,
    records: RunRecords,
    latency: Mapping[str, Mapping[str, Any]],
    timing: Mapping[str, Any],
    *,
    plots: bool = True,
) -> tuple[dict[str, Any], dict[str, Any], str]:
    """Write result.json, then report.md, report.html and plots (a chart that fails keeps report.md).

    Args:
        root: The run folder.
        records: The finished run's records.
        latency: The final joint latencies (`final_latency`).
        timing: Their timing facts.
        plots: Draw the charts (`Context.plots`).

    Returns:
        The result, the files written ({"markdown", "html", "plots"}) and a trouble note ('' when all were written).
    """
    from profiling_agent.tools.evaluation.delivery import (
        delivery_summary,
    )  # lazy: torch; nodes.report loads this module without it

    result = build_result(records, latency)
    result["final_latency_timing"] = dict(timing) or None
    if timing.get("reused"):
        result["latency_method"] = f"final: {timing['reused']}"
    result["delivery"] = delivery_summary(result.get("best"), result["baseline"], records.objective, latency, timing)
    result = attach_curves(result, root)  # the report rebuilds from result.json
    write_json_atomic(root / run_layout.RESULT, result)
    profile_path = root / run_layout.PROFILE
    profile = read_json(profile_path) if profile_path.exists() else None
    summary = records.profile.model_dump() if records.profile else None
    try:
        written = report_files.write_report_files(root, result, profile, summary, plots=plots)
        return result, written, "" if plots else "; charts not drawn (--no-plots)"
    except Exception as exc:  # noqa: BLE001 - charts and HTML must not fail a finished run: keep report.md
        write_text_atomic(root / run_layout.REPORT_MD, render_markdown(result, summary))
        files: dict[str, Any] = {"markdown": run_layout.REPORT_MD, "html": None, "plots": {}}
        return result, files, f"; plots and report.html not written ({type(exc).__name__}: {exc})"
