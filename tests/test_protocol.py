"""The evaluation protocol end to end: validation selects, held-out test reports, and the test images steer nothing."""

from __future__ import annotations

import inspect
import json

import pytest
from quick_assets import FAST_CONTEXT

from profiling_agent.graph.builder import build_graph
from profiling_agent.state import Context


@pytest.mark.slow
def test_test_images_are_read_only_after_selection_and_reported_with_intervals(tmp_path, monkeypatch):
    import profiling_agent.tools.data.prepare as prepare

    real, readers = prepare.load_prepared, []

    def spying(path, with_indices=False, parts=("eval", "calib"), **kwargs):
        callers = [f.function for f in inspect.stack()[1:8]]
        node = next(f for f in callers if f not in ("open_prepared", "open_run_data", "prepared"))
        readers.append((tuple(parts), [node, *callers]))
        return real(path, with_indices=with_indices, parts=parts, **kwargs)

    monkeypatch.setattr(prepare, "load_prepared", spying)
    inputs = {  # plain strings, as people type them in Studio
        "model": "embedded:vit-digits",
        "dataset": {"ref": "embedded:digits", "subset": 120, "test_subset": 150, "calibration": 32},
        "objective": {"planner": "deterministic", "iterations": 2, "quantize": "none"},
    }
    out = build_graph().invoke(inputs, context=Context(run_root=str(tmp_path), **FAST_CONTEXT))
    assert out["best"] is not None and out["status"] == "done"

    test_readers = [callers for parts, callers in readers if "test" in parts]
    # prepare_data reads every role's row numbers once to write subsets.json; only evaluate_held_out opens test images
    # (through nodes.common.prepared, which streams them)
    assert [c[0] for c in test_readers] == ["prepare_data", "evaluate_held_out"], test_readers
    assert all("test" not in parts for parts, _ in readers[1:] if "evaluate_held_out" not in _)

    run = next(p for p in tmp_path.iterdir() if (p / "result.json").exists())
    subsets = json.loads((run / "subsets.json").read_text())
    val, test = set(subsets["validation"]["indices"]), set(subsets["test"]["indices"])
    calib = subsets["calibration"]
    assert len(val) == 120 and len(test) == 150 and not val & test
    assert calib["split"] == "train" or not (set(calib["indices"]) & (val | test))

    result = json.loads((run / "result.json").read_text())
    base, best = result["baseline"], result["best"]
    assert base["accuracy"] is not None and base["test_accuracy"] is not None
    assert best["test_accuracy"] is not None and best["test_delta"] == pytest.approx(
        best["test_accuracy"] - base["test_accuracy"], abs=1e-6
    )
    low, high = best["test_delta_ci"]
    assert low <= best["test_delta"] <= high
    for cand in result["candidates"]:
        if cand["status"] == "ok":
            c_low, c_high = cand["acc_delta_ci"]
            assert c_low <= cand["accuracy"] - base["accuracy"] <= c_high
    assert result["protocol"]["test"]["images"] == 150 and result["protocol"]["validation"]["images"] == 120
    report = (run / "report.md").read_text()
    assert "held-out test images" in report and "val top-1 %" in report and "test top-1 %" in report

    # `evaluate --from-run` reproduces the recorded test accuracy on exactly those images
    from profiling_agent.graph.cli.main import main

    code = main(
        [
            "evaluate",
            "--model",
            str(run / "best"),
            "--from-run",
            str(run),
            "--part",
            "test",
            "--json",
            str(tmp_path / "m.json"),
        ]
    )
    assert code == 0
    measured = json.loads((tmp_path / "m.json").read_text())
    assert measured["n_samples"] == 150 and measured["accuracy"] == pytest.approx(best["test_accuracy"])
