"""PlannerMeta holds typed records and still reads and writes the JSON that checkpoints and result.json hold."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from profiling_agent.state import (
    BackoffRecord,
    BlockTrial,
    Candidate,
    PlannerMeta,
    ProposalDiff,
    SearchRecord,
    SearchTrial,
)
from profiling_agent.tools.planning.backoff import Backoff
from profiling_agent.tools.planning.error_model import Correction
from profiling_agent.tools.planning.search import SearchStep

# the planner_meta of a candidate as checkpoints and result.json hold it (written before the records were typed)
OLD_META = {
    "goal": 0.42,
    "gamma": 1.25,
    "converged": False,
    "llm": None,
    "vs_proposal": {
        "verdict": "edited",
        "changes": 1,
        "proposals": 2,
        "goal": 0.4,
        "emphasis": "balanced",
        "added": [],
        "removed": ["mlp_3"],
        "ratios": {"mlp_1": [0.3, 0.35]},
        "quantization": "",
    },
    "turn": "llm",
    "baseline": None,
    "ratio": None,
    "backoff": {
        "cap_pp": 4.0,
        "kept_goal": 0.25,
        "trials": [
            {"goal": 0.5, "calib_drop_pp": 40.625, "params_reduction": 0.41},
            {"goal": 0.25, "calib_drop_pp": 1.562, "params_reduction": None},
        ],
    },
    "predicted_drop": 1.562,
    "search": {
        "goal": 0.3125,
        "interval": [0.25, 0.5],
        "correction": 1.5,
        "cap_pp": 1.067,
        "trials": [{"goal": 0.375, "predicted_pp": 3.125, "corrected_pp": 4.688}],
        "why": "searching between 25.0% (kept the budget) and 50.0% (missed it)",
    },
    "block_trials": [
        {"blocks": ["layers.2.block"], "estimate": 0.41, "width_groups": 3, "kl": 0.01234, "calib_drop_pp": 1.5},
        {"blocks": ["layers.1.block"], "estimate": 0.4, "width_groups": 2, "kl": None, "error": "pruning failed"},
    ],
}


def test_an_old_planner_meta_loads_as_typed_records_and_writes_the_same_json():
    meta = PlannerMeta.model_validate(OLD_META)
    assert isinstance(meta.backoff, BackoffRecord) and meta.backoff.trials[0].calib_drop_pp == 40.625
    assert isinstance(meta.search, SearchRecord) and meta.search.trials[0].corrected_pp == 4.688
    assert isinstance(meta.vs_proposal, ProposalDiff) and meta.vs_proposal.label() == "edited (1 changes)"
    assert meta.block_trials is not None and all(isinstance(t, BlockTrial) for t in meta.block_trials)
    new_keys = {"predicted_interval": None, "correction": None, "tokens": None}  # added since (issues 36, 37)
    new_keys |= {"expected_drop": None, "expected_interval": None}  # issue 36
    # the offered alternatives (issue 48): an old comparison with the proposals names no choice
    vs_proposal = {**OLD_META["vs_proposal"], "choice": None, "alternative": None, "why": "", "offered": 0}
    new_keys |= {"vs_proposal": vs_proposal}
    assert meta.model_dump() == {
        **OLD_META,
        **new_keys,
    }  # the same keys: a failed trial has no calib_drop_pp, one that ran no error
    assert json.loads(meta.model_dump_json()) == {**OLD_META, **new_keys}
    cand = Candidate.model_validate({"iteration": 1, "planner_meta": OLD_META})
    assert cand.model_dump()["planner_meta"] == {**OLD_META, **new_keys}


def test_a_wrong_record_key_is_refused():
    bad = {**OLD_META, "backoff": {**OLD_META["backoff"], "goal": 0.3}}
    with pytest.raises(ValidationError):
        PlannerMeta.model_validate(bad)


def test_backoff_and_search_records_round_trip_through_the_planner_types():
    backoff = Backoff.from_record(BackoffRecord.model_validate(OLD_META["backoff"]))
    assert backoff.goal == 0.25 and backoff.cap == 4.0 and backoff.backed_off
    assert backoff.to_record().model_dump() == OLD_META["backoff"]
    step = SearchStep(goal=0.3125, low=0.25, high=0.5, correction=Correction(multiplicative=1.5), cap=1.0666, why="w")
    step.trials.append(SearchTrial(goal=0.375, predicted_pp=3.125, corrected_pp=4.688))
    assert step.to_record().model_dump() == {
        "goal": 0.3125,
        "interval": [0.25, 0.5],
        "correction": 1.5,
        "cap_pp": 1.067,
        "trials": [{"goal": 0.375, "predicted_pp": 3.125, "corrected_pp": 4.688}],
        "why": "w",
    }
