"""result.json and report.md of a stored finished run, rebuilt from its records, equal what that run wrote."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from profiling_agent.nodes.report import run_records
from profiling_agent.state import State
from profiling_agent.tools.evaluation.final_latency import kept_final
from profiling_agent.tools.reporting import result as result_module
from profiling_agent.tools.reporting.finish import write_run_report

STORED = Path(__file__).parents[1] / "data" / "report_run"  # written by tests/data/make_report_run.py
WRITTEN = ("result.json", "report.md")


@pytest.fixture(scope="module")
def rebuilt(tmp_path_factory):
    """(stored result.json, rebuilt result.json, run folder) of the stored run's report, written anew."""
    root = tmp_path_factory.mktemp("runs") / "ref1"
    shutil.copytree(STORED, root, ignore=shutil.ignore_patterns("state.json", *WRITTEN))
    stored = json.loads((STORED / "result.json").read_text())
    state = State.model_validate_json((STORED / "state.json").read_text())
    kept = kept_final(root, ["iter_01"])
    assert kept is not None
    with pytest.MonkeyPatch.context() as patch:
        # the library versions are read from the environment at report time, not from the run's records
        patch.setattr(result_module, "versions", lambda: stored["versions"])
        _, files, trouble = write_run_report(root, run_records(state, "ref1"), *kept)
    assert trouble == "" and files["html"] == "report.html"
    return stored, json.loads((root / "result.json").read_text()), root


def test_result_json_rebuilt_from_the_records_equals_the_stored_one(rebuilt):
    stored, result, _ = rebuilt
    assert list(result) == list(stored)
    for key in stored:
        assert result[key] == stored[key], key


def test_report_md_rebuilt_from_the_records_equals_the_stored_one(rebuilt):
    _, _, root = rebuilt
    assert (root / "report.md").read_text() == (STORED / "report.md").read_text()
