"""The latency a plan reads: repeated to a precision, snapped to a grid, stored once, the only one planners read."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from profiling_agent.tools.profiling.backend_profile import planning_costs
from profiling_agent.tools.profiling.planning_latency import (
    GRID,
    MAX_REPEATS,
    MIN_REPEATS,
    SCHEMA,
    cached_record,
    keep_record,
    record_from_profile,
    record_key,
    record_note,
    repeated_shares,
    snap,
)


def test_snap_puts_shares_on_a_geometric_grid_that_absorbs_small_noise():
    assert snap(0.0) == 0.0 and snap(-1e-9) == 0.0
    for share in (0.0031, 0.042, 0.1057, 0.5):
        snapped = snap(share)
        assert snapped == pytest.approx(GRID ** round(math.log(share, GRID)), rel=1e-5)
        assert abs(snapped / share - 1) <= (GRID - 1) / 2 + 1e-9  # at most half a step away
        assert snap(snapped) == snapped
    # the same value measured 1% higher or lower lands on the same point unless it sits on a step's edge
    assert snap(0.1) == snap(0.101) == snap(0.099)


def test_repeats_stop_once_the_shares_agree_and_report_how_many_and_how_far_apart():
    steady = itertools.cycle([{"a": 0.30, "b": 0.70}, {"a": 0.301, "b": 0.699}])
    shares, n, spread = repeated_shares(lambda: next(steady))
    assert n == MIN_REPEATS and spread <= 0.05 and shares["a"] == pytest.approx(0.30, abs=0.001)
    noisy = itertools.cycle([{"a": 0.2, "b": 0.8}, {"a": 0.4, "b": 0.6}])
    shares, n, spread = repeated_shares(lambda: next(noisy), first={"a": 0.3, "b": 0.7})
    assert n == MAX_REPEATS and spread > 0.05  # never agreed: stops at the bound and says how far apart
    assert shares == {"a": 0.3, "b": 0.7}  # the medians


def _profile(form="ort_dynamic"):
    return {
        "totals": {"latency_ms": 3.0},
        "group_costs": {"g1": {"latency_share": 0.2, "macs_share": 0.5}, "g2": {"latency_share": 0.3}},
        "backend_profile": {
            "planned_on": form,
            "forms": {"ort_dynamic": {"total_ms": 1.0, "group_latency_share": {"g1": 0.61, "g2": 0.12}}},
            "planned_repeats": {"shares": {"g1": 0.6, "g2": 0.1}, "repeats": 3, "spread": 0.02},
            "latency_table": {
                "form": "ort_dynamic",
                "ratios": [0.0, 0.5],
                "groups": {"g1": [0.6, 0.4], "g2": [0.1, 0.1]},
                "total_ms": [1.0, 0.8],
            },
        },
    }


def test_planners_read_the_stored_record_not_the_profiles_single_measurement():
    profile = _profile()
    profile["planning_latency"] = record_from_profile(profile)
    record = profile["planning_latency"]
    assert record["form"] == "ort_dynamic" and record["repeats"] == 3
    assert record["shares"] == {"g1": snap(0.6), "g2": snap(0.1)}  # the repeats' medians, snapped
    assert record["curves"]["g1"]["saved_share"] == [0.0, snap(0.2)]
    costs = planning_costs(profile)
    assert costs["g1"]["latency_share"] == snap(0.6) and costs["g1"]["torch_latency_share"] == snap(0.2)
    assert costs["g1"]["macs_share"] == 0.5  # the rest of the costs as profiled
    # what the profile step measured once more (or a table measured later) does not reach the planners
    profile["backend_profile"]["forms"]["ort_dynamic"]["group_latency_share"] = {"g1": 0.1, "g2": 0.9}
    profile["backend_profile"]["latency_table"]["groups"]["g1"] = [0.6, 0.6]
    assert planning_costs(profile) == costs


def test_a_torch_planned_profile_plans_on_its_snapped_torch_shares():
    profile = _profile("torch")
    profile["planning_latency"] = record_from_profile(profile)
    assert profile["planning_latency"]["form"] == "torch" and profile["planning_latency"]["spread"] is None
    costs = planning_costs(profile)
    assert costs["g2"]["latency_share"] == snap(0.3) and "torch_latency_share" not in costs["g2"]
    # the hooked modules' time beside one forward without hooks, and the identical layers pooled, said
    profile.update(totals={"latency_ms": 3.0, "timed_ms": 3.3}, identical_layers=[["l.0", "l.1", "l.2"]])
    record = record_from_profile(profile)
    assert record["nodes_vs_whole"] == pytest.approx(1.1)
    assert "3 identical layers in 1 classes pooled; parts sum to 1.10x one whole-model timing" in record_note(record)


def test_a_machine_keeps_the_first_record_of_a_model(tmp_path):
    key = record_key("digest", "auto", 1, (1, 32, 32), True)
    assert key != record_key("digest", "auto", 2, (1, 32, 32), True)  # threads change the measurement
    assert cached_record(tmp_path, key) is None
    first = {"schema": SCHEMA, "form": "ort_dynamic", "shares": {"g": 0.5}, "spread": 0.3}  # noisy, kept anyway
    assert keep_record(tmp_path, key, first)
    assert not keep_record(tmp_path, key, {**first, "shares": {"g": 0.25}, "spread": 0.01})
    assert cached_record(tmp_path, key) == {**first, "source": "cache"}


def test_a_missed_precision_snaps_the_shares_to_a_coarser_grid_the_console_names():
    from profiling_agent.tools.profiling.planning_latency import COARSEST, reachable_grid

    assert reachable_grid(None) == reachable_grid(0.05) == GRID
    assert reachable_grid(0.12) == pytest.approx(1.3) and reachable_grid(0.67) == COARSEST
    profile = _profile()
    profile["backend_profile"]["planned_repeats"].update(spread=0.12, calls_per_sample=200, sample_ms=6.0)
    record = record_from_profile(profile)
    assert record["grid"] == pytest.approx(1.3) and record["shares"]["g1"] == snap(0.6, 1.3)
    assert record["curves"]["g1"]["saved_share"] == [0.0, snap(0.2)]  # the table's curves keep the fine grid
    note = record_note(record)
    assert "spread 12%, above the 5% precision: shares on a coarser 1.3 grid" in note
    assert "200 calls a sample (a sample 6.0 ms, under 10 ms" in note


def test_the_planned_form_is_sampled_in_calls_and_checked_against_a_whole_timing(tiny_vit, tmp_path):
    """A tiny model is far faster than a sample: many calls a sample; the node sum is compared with one timing."""
    import dataclasses

    from profiling_agent.tools.compression.families import adapter_for
    from profiling_agent.tools.profiling.backend_profile import ORT_FORMS, profile_backends
    from profiling_agent.tools.profiling.deliverable import planned_repeats

    groups = [dataclasses.asdict(g) for g in adapter_for(tiny_vit).prunable_groups(tiny_vit)]
    example = torch.randn(1, 1, 16, 16)
    built: dict = {}
    out = profile_backends(tiny_vit, example, groups, ORT_FORMS[:1], folder=tmp_path, built=built)
    row = planned_repeats(ORT_FORMS[0], built["ort_fp32"], example, groups, out)
    assert row["calls_per_sample"] > 1 and row["whole_ms"] > 0 and row["nodes_vs_whole"] > 0
    assert row["shares"]["layers.0.heads"] == row["shares"]["layers.1.heads"]  # pooled in every repeat


def test_one_outlying_sample_among_five_does_not_set_the_precision():
    from profiling_agent.tools.profiling.planning_latency import spread

    steady = [{"a": 0.30, "b": 0.70}, {"a": 0.301, "b": 0.699}, {"a": 0.299, "b": 0.701}, {"a": 0.30, "b": 0.70}]
    outlier = {"a": 0.9, "b": 0.1}  # one compile whose block ran far slower: the median ignores it, so does spread
    assert spread([outlier, *steady[:2]]) > 1  # three samples: every one counts
    assert spread([outlier, *steady]) <= 0.05
    samples = iter([outlier, *steady])
    shares, n, _ = repeated_shares(lambda: next(samples))
    assert n == 5 and shares["a"] == pytest.approx(0.30)
