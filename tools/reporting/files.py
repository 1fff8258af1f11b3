"""Write and rebuild a run's report files (plots, report.md, report.html) from result.json and profile.json."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from profiling_agent.tools.io import read_json, write_text_atomic
from profiling_agent.tools.profiling.summary import summarize_profile
from profiling_agent.tools.reporting.html import PROFILE_JSON, REPORT_HTML, REPORT_MD, RESULT_JSON, render_html
from profiling_agent.tools.reporting.markdown import render_markdown
from profiling_agent.tools.reporting.plot_recovery import plot_recovery
from profiling_agent.tools.reporting.plots import PLOT_FILES, markdown_section, render_plots, write_plots

_RESULT_KEYS = ("thread_id", "status", "baseline", "candidates", "planner", "labels", "objective", "versions")


class ReportError(ValueError):
    """A folder that is not a finished run, or run files a report cannot be built from."""


# ------------------------------------------------------------------------------------------- files


def _summary_from_profile(profile: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if not profile or not profile.get("layers") or "totals" not in profile or "env" not in profile:
        return None
    return summarize_profile(profile, profile.get("groups"))


def markdown_with_plots(markdown: str, written: Mapping[str, str]) -> str:
    """Insert the plots section before the Markdown report's '## Plans' (or append it)."""
    section = markdown_section(written)
    if not section:
        return markdown
    marker = "\n## Plans\n"
    if marker in markdown:
        return markdown.replace(marker, "\n" + section + marker, 1)
    return markdown.rstrip("\n") + "\n\n" + section


def write_report_files(
    run_path: str | os.PathLike,
    result: Mapping[str, Any],
    profile: Mapping[str, Any] | None,
    profile_summary: Mapping[str, Any] | None = None,
    *,
    plots: bool = True,
) -> dict[str, Any]:
    """Write plots/*.png, report.md (linking the plots) and report.html into the run folder.

    Args:
        run_path: The run folder RUN_DIR/THREAD_ID.
        result: result.json of the run.
        profile: profile.json of the run, or None (no profile charts).
        profile_summary: Compact profile summary; computed from `profile` when None.
        plots: Draw the charts (False: none are drawn and earlier ones are removed; the reports have no charts).

    Returns:
        {"markdown": "report.md", "html": "report.html", "plots": {key: relative path}}.
    """
    root = Path(run_path)
    summary = profile_summary if profile_summary is not None else _summary_from_profile(profile)
    images = render_plots(result, profile) if plots else {}
    recovery = plot_recovery(result) if plots else None
    if recovery is not None:  # keyed like the others, so it takes its place in PLOT_FILES order
        images = {key: made for key in PLOT_FILES if (made := {**images, "recovery_curve": recovery}.get(key))}
    written = write_plots(root, images)
    markdown = render_markdown(dict(result), dict(summary) if summary else None)
    write_text_atomic(root / REPORT_MD, markdown_with_plots(markdown, written))
    write_text_atomic(root / REPORT_HTML, render_html(result, images, summary))
    return {"markdown": REPORT_MD, "html": REPORT_HTML, "plots": written}


def load_finished_run(run_path: str | os.PathLike) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """Read result.json (required, status done) and profile.json (optional) of a finished run.

    Raises:
        ReportError: the folder is missing, is not a finished run, or its files are unreadable.
    """
    root = Path(run_path)
    if not root.is_dir():
        raise ReportError(f"not a run folder: {root}")
    path = root / RESULT_JSON
    if not path.is_file():
        raise ReportError(f"not a finished run: {root} has no {RESULT_JSON}")
    result = _read(path)
    if not isinstance(result, dict) or any(k not in result for k in _RESULT_KEYS):
        missing = [k for k in _RESULT_KEYS if not isinstance(result, dict) or k not in result]
        raise ReportError(f"{path} is not a profiling-agent result (missing {', '.join(missing)})")
    if result.get("status") != "done":
        raise ReportError(f"not a finished run: {path} has status {result.get('status')!r}")
    profile = _read(root / PROFILE_JSON) if (root / PROFILE_JSON).is_file() else None
    if profile is not None and not isinstance(profile, dict):
        raise ReportError(f"{root / PROFILE_JSON} is not a profile")
    return result, profile


def _read(path: Path) -> Any:
    try:
        return read_json(path)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ReportError(f"cannot read {path}: {exc}") from None


def rebuild_report(run_path: str | os.PathLike) -> dict[str, Any]:
    """Rebuild plots, report.md and report.html of a finished run from its result.json and profile.json.

    Nothing is re-run or re-measured.

    Raises:
        ReportError: the folder is not a finished run, or its files cannot be rendered.
    """
    result, profile = load_finished_run(run_path)
    try:
        return write_report_files(run_path, result, profile)
    except (KeyError, TypeError, AttributeError) as exc:
        raise ReportError(f"cannot build a report from {Path(run_path) / RESULT_JSON}: bad field {exc}") from None
