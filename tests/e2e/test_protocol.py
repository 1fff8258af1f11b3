"""The evaluation protocol end to end: validation selects, held-out test reports, and the test images steer nothing."""

from __future__ import annotations

import json

import pytest


@pytest.mark.slow
def test_test_images_are_read_only_after_selection_and_reported_with_intervals(tmp_path, digits_run):
    # the session's shared run: 120 validation and 150 test images, prepared-data reads recorded by a spy
    out, readers, run = digits_run.out, digits_run.readers, digits_run.run
    assert out["best"] is not None and out["status"] == "done"

    test_readers = [callers for parts, callers in readers if "test" in parts]
    # prepare_data reads every role's row numbers once to write subsets.json; only evaluate_held_out opens test images
    # (through nodes.common.prepared, which streams them)
    assert [c[0] for c in test_readers] == ["prepare_data", "evaluate_held_out"], test_readers
    assert all("test" not in parts for parts, _ in readers[1:] if "evaluate_held_out" not in _)

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

    # the baseline's passes ran on its FP32 form (torch eager is about 3x slower on this tiny model): torch itself
    # gives the same accuracy
    by = result["protocol"]["baseline_predicted_by"]
    assert by == base["predicted_by"] and by in ("ort_fp32", "ov_fp32")
    argv = ["evaluate", "--model", str(run / base["path"]), "--from-run", str(run), "--json", str(tmp_path / "b.json")]
    for part, recorded in (("test", base["test_accuracy"]), ("validation", base["accuracy"])):
        assert main([*argv, "--part", part]) == 0
        torch_run = json.loads((tmp_path / "b.json").read_text())
        assert torch_run["accuracy"] == pytest.approx(recorded), (part, by)
