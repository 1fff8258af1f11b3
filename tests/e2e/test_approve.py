"""Human approval: the approve node's answer parsing and routing, and the CLI flow run --approve / resume --decision."""

from __future__ import annotations

import json

import pytest

from profiling_agent.graph import routing
from profiling_agent.state import State
from profiling_agent.tools.planning.review import parse_answer, unwrap_plan

PROFILE = {
    "groups": [
        {"name": "l0.mlp", "kind": "structured", "module": "enc.0.mlp", "units": 8, "min_units": 1},
        {"name": "l0.heads", "kind": "head", "module": "enc.0.attn", "units": 4, "min_units": 1},
    ],
    "protected": ["classifier"],
    "group_costs": {
        "l0.mlp": {"params_share": 0.4, "macs_share": 0.4, "latency_share": 0.3},
        "l0.heads": {"params_share": 0.2, "macs_share": 0.3, "latency_share": 0.3},
    },
    "layers": [{"name": "enc.0.mlp", "type": "Linear"}, {"name": "classifier", "type": "Linear"}],
}
PLAN = {"pruning": [{"layer": r"^enc\.0\.mlp$", "type": "structured", "ratio": 0.5}], "quantization": []}


def test_routing_goes_through_approve_only_when_asked():
    state = State(objective={"approve": False})
    assert routing.after_analyze(state) == "prune"
    assert routing.after_analyze(State(objective={"approve": True})) == "approve"
    assert routing.after_analyze(State(objective={"approve": True}, stop_reason="converged")) == "evaluate_held_out"
    assert routing.after_approve(State(current={"iteration": 1})) == "prune"
    assert routing.after_approve(State(current={"iteration": 1, "status": "ok"})) == "prune"
    # the baseline is measured before planning, so a rejected plan goes straight to the bookkeeping
    assert routing.after_approve(State(current={"iteration": 1, "status": "rejected"})) == "iterate"


@pytest.mark.parametrize(
    "answer, expected",
    [
        ("approve", ("approve", None, "")),
        ({"decision": "Reject"}, ("reject", None, "")),
        ({"decision": "maybe"}, ("", None, "unknown decision 'maybe'")),
        (42, ("", None, "answer with")),
        ({"decision": "approve", "plan": PLAN}, ("", None, "a plan goes only with decision 'edit'")),
        ({"decision": "edit"}, ("", None, "decision 'edit' needs a plan")),
        ({"decision": "edit", "plan": {"pruning": [{"layer": "(a+)+", "type": "structured", "ratio": 0.5}]}},
         ("", None, "the edited plan was refused: pruning[0]")),
        ({"decision": "edit", "plan": {"pruning": [{"layer": "x", "type": "structured", "ratio": 2}]}},
         ("", None, "the edited plan was refused: pruning.0.ratio")),
    ],
)  # fmt: skip
def test_parse_answer_refusals(answer, expected):
    decision, plan, _, error = parse_answer(answer, PROFILE)
    assert (decision, plan) == expected[:2]
    assert error.startswith(expected[2]) if expected[2] else error == ""


def test_parse_answer_accepts_an_edited_plan_and_estimates_it():
    document = {"plan": PLAN, "iteration": 1}  # a copy of iter_NN/plan.json is accepted too
    decision, plan, estimate, error = parse_answer({"decision": "edit", "plan": document}, PROFILE)
    assert (decision, error) == ("edit", "")
    assert plan["pruning"][0]["ratio"] == 0.5 and plan["rationale"] == ""
    assert estimate["params"] == pytest.approx(0.2)  # half of a group holding 40% of the params
    assert unwrap_plan(PLAN) is PLAN


@pytest.mark.slow
def test_cli_approval_flow(tmp_path, capfd, digits_vit):
    from profiling_agent.graph.builder import build_graph
    from profiling_agent.graph.checkpoint import open_checkpointer
    from profiling_agent.graph.cli.main import main
    from profiling_agent.tools.io import sha256_path

    dataset, model = digits_vit.dataset, digits_vit.model
    runs = tmp_path / "runs"
    base = ["--run-dir", str(runs)]
    run = ["run", "--model", str(model), "--dataset", str(dataset), "--planner", "deterministic", "--iterations", "3",
           "--target-reduction", "0.9", "--max-acc-drop", "0.5", "--subset", "96", "--calibration", "16",
           "--repeats", "2", "--threads", "1", "--backend", "torch", "--approve", "--thread-id", "t",
           "--recover", "reconstruct",  # the approval flow is under test, not distillation
           *base]  # fmt: skip
    assert main(run) == 0
    out, err = capfd.readouterr()
    # the plan's table: which groups the planner picks follows this machine's latency shares (heads on some CPUs)
    assert "iteration 1/3: deterministic plan waiting for approval" in out and "\n  prune     " in out
    assert "waiting for approval: profiling-agent resume t --run-dir" in err.splitlines()[-1]
    proposed = json.loads((runs / "t" / "iter_01" / "plan.json").read_text())
    assert main(["runs", *base]) == 0
    assert "waiting for approval" in capfd.readouterr()[0]

    # edit: a copy of plan.json with one entry; the run continues to the next pause
    edited = {**proposed, "plan": {**proposed["plan"], "pruning": proposed["plan"]["pruning"][1:2]}}
    plan_file = tmp_path / "edited.json"
    plan_file.write_text(json.dumps(edited))
    assert main(["resume", "t", *base, "--decision", "edit", "--plan", str(plan_file)]) == 0
    out, _ = capfd.readouterr()
    assert "iteration 2/3" in out
    applied = json.loads((runs / "t" / "iter_01" / "plan.json").read_text())
    assert applied["planner"] == "human" and applied["plan"]["pruning"] == edited["plan"]["pruning"]
    assert json.loads((runs / "t" / "iter_01" / "plan_proposed.json").read_text())["plan"] == proposed["plan"]

    assert main(["resume", "t", *base, "--decision", "reject"]) == 0
    assert "iteration 3/3" in capfd.readouterr()[0]
    assert main(["resume", "t", *base, "--decision", "approve"]) == 0
    out, _ = capfd.readouterr()
    assert "stopped: iteration bound reached (3)" in out

    graph = build_graph(checkpointer=open_checkpointer(runs))
    values = graph.get_state({"configurable": {"thread_id": "t"}}).values
    cands = values["candidates"]
    assert [(c["iteration"], c["status"], c["planner"]) for c in cands] == [
        (1, "ok", "human"), (2, "rejected", "deterministic"), (3, "ok", "deterministic"),
    ]  # fmt: skip
    assert [c["review"]["decision"] for c in cands] == ["edit", "reject", "approve"]
    assert cands[2]["planner_meta"]["goal"] < cands[1]["planner_meta"]["goal"]  # a rejection makes the planner milder
    assert cands[1]["artifact"] is None and not (runs / "t" / "iter_02" / "candidate").exists()
    assert [h["node"] for h in values["history"]].count("prune") == 2  # the rejected plan was never applied
    for cand in (cands[0], cands[2]):
        assert sha256_path(runs / "t" / cand["artifact"]["path"]) == cand["artifact"]["sha256"]
    result = json.loads((runs / "t" / "result.json").read_text())
    assert [c["status"] for c in result["candidates"]] == ["ok", "rejected", "ok"]
    assert result["planner"]["used"] == ["deterministic", "human"]
