"""bench/llm_planners.py: its per-model summary, its fake small model, and its --quick smoke run."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from helpers.fake_llm import local_llm_only, probe_records, vit_profile, vit_sensitivity

from profiling_agent.nodes.analyze import round_inputs
from profiling_agent.state import Context, Objective, PlanningProblem, State
from profiling_agent.tools.planning.deterministic import plan_round
from profiling_agent.tools.planning.llm_planner import plan_with_llm

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import llm_planners  # noqa: E402
from llm_fake_server import FakeSmallModel  # noqa: E402


@pytest.fixture(autouse=True)
def local_only(monkeypatch):
    local_llm_only(monkeypatch)


def test_the_fake_small_model_is_driven_to_its_own_constrained_plan(tmp_path):
    profile = vit_profile(n_layers=2)
    sens = vit_sensitivity(profile)
    state = State(run_path=str(tmp_path), family="vit", objective=Objective())
    fallback = plan_round(PlanningProblem.of(profile["groups"], profile["group_costs"], sens, state.objective, []))
    with FakeSmallModel() as fake:
        ctx = Context(llm_base_url=fake.url, llm_timeout=10, llm_tool_rounds=2, llm_api_key_env="PA_BENCH_UNSET")
        outcome = plan_with_llm(round_inputs(state, 1), ctx, profile, probe_records(sens), fallback)
    assert outcome.planner == "llm" and outcome.structured["mode"] == "json_object"
    assert {e.layer for e in outcome.plan.pruning} == {r"^vit\.layers\.0\.mlp\.fc1$", r"^vit\.layers\.1\.mlp\.fc1$"}
    events = [json.loads(line) for line in (tmp_path / outcome.transcript).read_text().splitlines()]
    assert llm_planners.schema_answers(events) == (1, 1)  # the prose answer was unconstrained: not counted


def _write(run: Path, iteration: int, events: list[dict]) -> None:
    folder = run / f"iter_{iteration:02d}"
    folder.mkdir(parents=True)
    (folder / "llm_transcript.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))


def test_the_summary_counts_whose_plan_was_applied_refusals_by_reason_and_schema_validity(tmp_path):
    floor = "the plan is predicted to remove {}% of the params: less than 50% of the objective's 40%"
    _write(
        tmp_path,
        1,
        [
            {"event": "reply", "tool_calls": []},
            {"event": "guard", "ok": False, "reasons": [floor.format("8.0")]},
            {"event": "request", "structured": "json_object"},
            {"event": "reply", "tool_calls": []},
            {"event": "guard", "ok": True},
        ],
    )
    _write(
        tmp_path,
        3,
        [
            {"event": "request", "structured": "json_object"},
            {"event": "reply", "tool_calls": []},
            {"event": "guard", "ok": False, "reasons": [floor.format("12.5")]},
            {"event": "request", "structured": "json_object"},
            {"event": "reply", "tool_calls": []},
            {"event": "guard", "ok": False, "reasons": [floor.format("12.5")]},
            {"event": "repeated", "reason": floor.format("12.5")},
        ],
    )

    def cand(iteration, planner, turn, verdict=None, tokens=100):
        llm = {"usage": {"calls": 2, "total_tokens": tokens}} if turn == "llm" else None
        meta = {"turn": turn, "llm": llm, "vs_proposal": {"verdict": verdict} if verdict else None}
        return {"iteration": iteration, "planner": planner, "planner_meta": meta}

    state = {
        "candidates": [
            cand(1, "llm", "llm", "edited"),
            cand(2, "deterministic", "reference"),
            cand(3, "deterministic", "llm", tokens=50),
        ]
    }
    summary = llm_planners.model_summary("smol", state, tmp_path)
    assert summary["llm_turns"] == 2 and summary["llm_plans"] == 1
    assert summary["verdicts"] == {"own": 0, "edited": 1, "chosen": 0, "resized": 0, "copied": 0, "replaced": 1}
    assert summary["schema_valid"] == [3, 3] and (summary["calls"], summary["tokens"]) == (4, 150)
    assert summary["refusals"] == {"the plan is predicted to remove #% of the params": 3, "repeated a refused plan": 1}
    assert summary["server_s"] == 0.0  # these events carry no times
    spent = ((200.0, 100.0), (66.0, 60.0))  # (walls, CPU-seconds) of the LLM run and the deterministic run
    row = llm_planners.summary_row({**summary, "server_s": 80.0}, "embedded", spent, ({}, {}))
    assert row[2] == "1/2 (50%)" and row[3] == "0 / 1" and row[7] == "200 s (80 + 120) / 100 s (outside: 1.20x)"
    assert row[8] == "66 / 60 (1.10x)"


def test_the_server_time_is_each_replys_wait_since_the_event_before_it(tmp_path):
    events = [
        {"event": "prompt", "time": 0.0},
        {"event": "prompt", "time": 0.5},
        {"event": "parse_error", "time": 8.5},  # 8 s: a first answer (tools offered) cut off at the token limit
        {"event": "tools_dropped", "time": 8.6},
        {"event": "prompt", "time": 10.0},
        {"event": "prompt", "time": 10.5},
        {"event": "reply", "time": 40.5},  # 30 s: the first request
        {"event": "parse_error", "time": 40.6},
        {"event": "prompt", "time": 41.0},
        {"event": "request", "structured": "json_object", "time": 41.5},
        {"event": "reply", "time": 61.5},  # 20 s: the constrained one
        {"event": "guard", "time": 62.0},
        {"event": "request", "structured": "json_object", "time": 62.5},
        {"event": "parse_error", "time": 162.5},  # 100 s: cut off at the token limit, no reply written
        {"event": "request", "structured": "json_object", "time": 163.0},
        {"event": "reply", "time": 173.0},  # 10 s
    ]
    assert llm_planners.server_seconds(events) == pytest.approx(168.0)
    chosen = {
        "candidates": [
            {"iteration": 1, "planner": "llm", "planner_meta": {"turn": "llm", "vs_proposal": {"verdict": "chosen"}}}
        ]
    }
    summary = llm_planners.model_summary("q", chosen, tmp_path)
    assert summary["llm_plans"] == 1 and summary["verdicts"]["chosen"] == 1  # another alternative: a decision


@pytest.mark.slow
def test_the_quick_smoke_run_prints_the_summary_with_the_fake_model(tmp_path, capsys):
    assert llm_planners.main(["--quick", "--work", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    summary = out.split("\n\n")[1]
    (row,) = [line for line in summary.splitlines() if line.startswith("| fake-small")]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1] == "embedded" and cells[2] == "1/1 (100%)"  # the fake model's own plan was applied
    assert cells[4] == "1/1"  # its one constrained answer was schema-valid
