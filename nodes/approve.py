"""Human approval: pause before a plan is applied, then apply it, apply an edited plan instead, or skip it."""

from __future__ import annotations

from typing import Any, Literal

from langgraph.runtime import Runtime
from langgraph.types import interrupt
from pydantic import BaseModel, Field

from profiling_agent.nodes.common import event, iteration_dir, run_dir, thread_id_of
from profiling_agent.state import CompressionPlan, Context, State

DECISIONS = ("approve", "edit", "reject")
REJECTED = "plan rejected by the reviewer"


class ApprovalAnswer(BaseModel):
    """The answer that resumes a run paused for approval (Command(resume=...))."""

    decision: Literal["approve", "edit", "reject"] = Field(
        description="approve: apply the plan; edit: apply `plan` instead; reject: skip this iteration's candidate."
    )
    plan: CompressionPlan | None = Field(default=None, description="The replacement plan, only with decision 'edit'.")


def unwrap_plan(data: Any) -> Any:
    """Return the plan inside an iter_NN/plan.json document ({"plan": {...}, ...}), or `data` itself."""
    if isinstance(data, dict) and isinstance(data.get("plan"), dict) and "pruning" not in data:
        return data["plan"]
    return data


def review_plan(plan: Any, profile: dict[str, Any], time_budget: float = 1.0):
    """Check a human plan like an LLM plan: schema, regex safety, targets, protected layers and bounds.

    Args:
        plan: The plan (a dict, a CompressionPlan, or a plan.json document holding one).
        profile: The run's profile.json (groups, protected modules, group costs, layers).
        time_budget: Seconds allowed for all regex searches in a child process (0 skips that check).

    Returns:
        The plan guard's GuardVerdict (`ok`, `plan`, `reasons`, `warnings`, `estimate`).
    """
    from profiling_agent.tools.planning.plan_guard import GuardConfig, check_plan

    return check_plan(
        unwrap_plan(plan),
        profile.get("groups") or [],
        profile.get("protected") or [],
        profile.get("group_costs") or {},
        GuardConfig(match_time_budget=time_budget),
        layers=profile.get("layers"),
    )


def parse_answer(answer: Any, profile: dict[str, Any]) -> tuple[str, dict[str, Any] | None, dict[str, float], str]:
    """Read a resume value: "approve", {"decision": ...} or {"decision": "edit", "plan": {...}}.

    Returns:
        (decision, edited plan or None, the edited plan's estimate, error); `error` is "" when the answer is valid.
    """
    if isinstance(answer, str):
        answer = {"decision": answer}
    if not isinstance(answer, dict):
        return "", None, {}, "answer with {'decision': 'approve' | 'edit' | 'reject', 'plan': {...} for edit}"
    decision = str(answer.get("decision", "")).strip().lower()
    if decision not in DECISIONS:
        return "", None, {}, f"unknown decision {str(answer.get('decision'))[:40]!r}: use approve, edit or reject"
    plan = answer.get("plan")
    if decision != "edit":
        return (decision, None, {}, "") if plan is None else ("", None, {}, "a plan goes only with decision 'edit'")
    if plan is None:
        return "", None, {}, "decision 'edit' needs a plan"
    verdict = review_plan(plan, profile)
    if not verdict.ok:
        return "", None, {}, "the edited plan was refused: " + "; ".join(verdict.reasons)
    return "edit", verdict.plan.model_dump(), dict(verdict.estimate), ""


def approval_request(state: State, thread_id: str, estimate: dict[str, float], notes: list[str]) -> dict[str, Any]:
    """Build the interrupt payload: the plan, what it is expected to save, and how to answer."""
    it = state.iteration
    goal = ((state.current or {}).get("planner_meta") or {}).get("goal")
    return {
        "kind": "approve_plan",
        "thread_id": thread_id,
        "iteration": it,
        "iterations": state.objective.iterations,
        "planner": state.planner_used,
        "plan": state.plan,
        "plan_file": f"iter_{it:02d}/plan.json",
        "target": state.objective.target,
        "estimate": {k: round(float(v), 4) for k, v in estimate.items()},
        "planner_estimate": round(float(goal), 4) if isinstance(goal, (int, float)) else None,
        "guard_notes": notes,
        "answer": "{'decision': 'approve'} | {'decision': 'reject'} | {'decision': 'edit', 'plan': {...}}",
        "error": "",
    }


def approve(state: State, runtime: Runtime[Context]) -> dict[str, Any]:
    """Pause for a human decision on this iteration's plan; record it and apply it (the node re-runs on resume)."""
    from profiling_agent.tools.io import read_json, write_json_atomic
    from profiling_agent.tools.planning.deterministic import estimate_key

    it = state.iteration
    profile = read_json(run_dir(state) / "profile.json")
    proposed = review_plan(state.plan or {}, profile, time_budget=0.0)  # the estimate; planners' plans are trusted
    payload = approval_request(state, thread_id_of(runtime), proposed.estimate, proposed.reasons + proposed.warnings)
    while True:  # an invalid answer asks again, saying why; every answer so far is replayed on each resume
        decision, plan, estimate, error = parse_answer(
            interrupt(payload, response_schema=ApprovalAnswer.model_json_schema()), profile
        )
        if not error:
            break
        payload = {**payload, "error": error}
    current = dict(state.current or {"iteration": it})
    review = {"decision": decision, "proposed_by": state.planner_used}
    if decision == "reject":
        current.update({"status": "rejected", "error": REJECTED, "review": review})
        return {"current": current, "history": event("approve", f"{REJECTED}; the candidate is skipped", it)}
    if decision == "approve":
        current["review"] = review
        return {"current": current, "history": event("approve", "plan approved by the reviewer", it)}
    folder = iteration_dir(state, it)
    proposed_doc = {"iteration": it, "planner": state.planner_used, "plan": state.plan}
    write_json_atomic(folder / "plan_proposed.json", proposed_doc)
    write_json_atomic(folder / "plan.json", {"iteration": it, "planner": "human", "plan": plan, "edited": True})
    meta = dict(current.get("planner_meta") or {})
    if "goal" in meta:  # later deterministic rounds learn from what the applied plan aimed at
        meta["goal"] = float(estimate.get(estimate_key(state.objective.target), meta["goal"]))
    current.update({"planner_meta": meta, "review": {**review, "estimate": estimate}})
    counts = f"{len(plan['pruning'])} pruning and {len(plan['quantization'])} quantization entries"
    message = f"plan edited by the reviewer: {counts}"
    return {"plan": plan, "planner_used": "human", "current": current, "history": event("approve", message, it)}
