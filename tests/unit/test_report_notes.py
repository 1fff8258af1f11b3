"""report.html draws notes in a neutral style and warnings in the warning style; report.md says both as text."""

from __future__ import annotations

import copy
import html
import json
import re
from pathlib import Path

from profiling_agent.tools.reporting import markdown
from profiling_agent.tools.reporting.html import render_html
from profiling_agent.tools.reporting.notes import evaluation_notes, outcome_warnings, weak_evaluation

STORED = json.loads((Path(__file__).parents[1] / "data" / "report_run" / "result.json").read_text())
TRIAL_NOTE = "Every plan trial was judged on 64 validation images"


def _boxes(page: str) -> tuple[list[str], list[str]]:
    """Return (the texts drawn as notes, the texts drawn as warning badges) of the page's outcome."""
    notes = re.findall(r'<p class="note">([^<]*)</p>', page)
    warnings = re.findall(r'<span class="badge warn">([^<]*)</span>', page)
    return [html.unescape(n) for n in notes], [html.unescape(w) for w in warnings]


def _doubtful() -> dict:
    """The stored run's result.json with every warning the outcome knows: weak data, interval, budget, timings."""
    result = copy.deepcopy(STORED)
    result["protocol"]["test"]["images"] = 5
    result["best"] |= {"ci_crosses_budget": True, "within_budget": False}
    return result


def test_a_note_is_drawn_neutral_and_never_as_a_warning():
    result = copy.deepcopy(STORED)
    result["delivery"] = {**result["delivery"], "timings_flagged": False, "flag_reason": ""}
    notes, warnings = _boxes(render_html(result))
    assert notes == evaluation_notes(result) and notes[0].startswith(TRIAL_NOTE) and len(notes) == 2
    assert warnings == [] and outcome_warnings(result) == []


def test_warnings_are_drawn_in_the_warning_style_and_notes_stay_neutral():
    result = _doubtful()
    notes, warnings = _boxes(render_html(result))
    assert notes[0].startswith(TRIAL_NOTE) and not any(TRIAL_NOTE in w for w in warnings)
    assert warnings[0] == "NOT within the accuracy budget"
    assert warnings[1] == "Accuracy results mean little: 5 test images (at least 8 needed) (--allow-weak-eval)."
    assert warnings[2].startswith("Caution: the accuracy change is within the 2.0 pp budget")
    assert warnings[3].startswith("Timings flagged: a reference workload ran 2.1299x its quiet time")
    assert "TIMINGS FLAGGED" not in render_html(result)  # said once, as the warning, not inside the speed sentence


def test_report_md_says_the_notes_and_warnings_as_text():
    result = _doubtful()
    lines = markdown.test_lines(result)
    assert lines[0].startswith("On the held-out test images (5 images") and lines[1].startswith(TRIAL_NOTE)
    assert lines[-3].startswith("Accuracy results mean little") and lines[-2].startswith("Caution:") and not lines[-1]
    text = markdown.render_markdown(result)
    assert "TIMINGS FLAGGED: a reference workload ran 2.1299x" in text  # the speed line keeps saying it


def test_weak_evaluation_names_each_role_short_of_its_floor():
    result = copy.deepcopy(STORED)
    assert weak_evaluation(result) == ""
    result["protocol"]["validation"]["images"], result["protocol"]["calibration"]["images"] = 7, 3
    assert weak_evaluation(result) == (
        "Accuracy results mean little: 7 validation images (at least 8 needed); 3 calibration images "
        "(at least 4 needed) (--allow-weak-eval)."
    )
    result["protocol"]["test"]["images"] = 0  # no test images asked for: not a shortfall
    assert "test" not in weak_evaluation(result)
