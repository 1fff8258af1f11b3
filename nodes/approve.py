"""Human approval: pause before a plan is applied, then apply it, apply an edited plan instead, or skip it."""

from __future__ import annotations

from typing import Any, Literal

from langgraph.runtime import Runtime
from langgraph.types import interrupt
from pydantic import BaseModel, Field

from profiling_agent.nodes.common import current_candidate, event, run_dir, thread_id_of
from profiling_agent.state import CompressionPlan, Context, Review, State
from profiling_agent.tools import run_layout
from profiling_agent.tools.io import read_json, write_json_atomic
from profiling_agent.tools.planning.review import parse_answer, review_plan

REJECTED = "plan rejected by the reviewer"


class ApprovalAnswer(BaseModel):
    """The answer that resumes a run paused for approval (Command(resume=...))."""

    decision: Literal["approve", "edit", "reject"] = Field(
        description="approve: apply the plan; edit: apply `plan` instead; reject: skip this iteration's candidate."
    )
    plan: CompressionPlan | None = Field(default=None, description="The replacement plan, only with decision 'edit'.")


def approval_request(state: State, thread_id: str, estimate: dict[str, float], notes: list[str]) -> dict[str, Any]:
    """Build the interrupt payload: the plan, what it is expected to save, and how to answer."""
    it = state.iteration
    goal = state.current.planner_meta.goal if state.current else None
    return {
        "kind": "approve_plan",
        "thread_id": thread_id,
        "iteration": it,
        "iterations": state.objective.iterations,
        "planner": state.planner_used,
        "plan": state.plan.model_dump() if state.plan else None,
        "plan_file": f"{run_layout.iteration_name(it)}/{run_layout.PLAN}",
        "target": state.objective.target,
        "estimate": {k: round(float(v), 4) for k, v in estimate.items()},
        "planner_estimate": round(float(goal), 4) if isinstance(goal, (int, float)) else None,
        "guard_notes": notes,
        "answer": "{'decision': 'approve'} | {'decision': 'reject'} | {'decision': 'edit', 'plan': {...}}",
        "error": "",
    }


def approve(state: State, runtime: Runtime[Context]) -> dict[str, Any]:
    """Pause for a human decision on this iteration's plan; record it and apply it (the node re-runs on resume)."""
    from profiling_agent.tools.planning.ratio_solver import estimate_key  # lazy: torch; steps load without it

    it = state.iteration
    profile = read_json(run_dir(state) / run_layout.PROFILE)
    if state.token_axis is not None:  # a plan's token entry is checked against what the run measured
        profile["token_axis"] = state.token_axis.model_dump()
    proposed = review_plan(
        state.plan.model_dump() if state.plan else {}, profile, time_budget=0.0
    )  # the estimate; planners' plans are trusted
    payload = approval_request(state, thread_id_of(runtime), proposed.estimate, proposed.reasons + proposed.warnings)
    while True:  # an invalid answer asks again, saying why; every answer so far is replayed on each resume
        decision, plan, estimate, error = parse_answer(
            interrupt(payload, response_schema=ApprovalAnswer.model_json_schema()), profile
        )
        if not error:
            break
        payload = {**payload, "error": error}
    current = current_candidate(state)
    review = Review.model_validate({"decision": decision, "proposed_by": state.planner_used})
    current.review = review
    if decision == "reject":
        current.status, current.error = "rejected", REJECTED
        message = f"{REJECTED}; the candidate is skipped"
        return {"current": current.model_dump(), "history": event("approve", message, it)}
    if decision == "approve":
        return {"current": current.model_dump(), "history": event("approve", "plan approved by the reviewer", it)}
    assert plan is not None, "parse_answer returns the edited plan with decision 'edit'"
    folder = run_layout.iteration_dir(run_dir(state), it)
    proposed_doc = {
        "iteration": it,
        "planner": state.planner_used,
        "plan": state.plan.model_dump() if state.plan else None,
    }
    write_json_atomic(folder / "plan_proposed.json", proposed_doc)
    write_json_atomic(folder / run_layout.PLAN, {"iteration": it, "planner": "human", "plan": plan, "edited": True})
    meta = current.planner_meta
    if meta.goal is not None:  # later deterministic rounds learn from what the applied plan aimed at
        meta.goal = float(estimate.get(estimate_key(state.objective.target), meta.goal))
    review.estimate = estimate
    counts = f"{len(plan['pruning'])} pruning and {len(plan['quantization'])} quantization entries"
    message = f"plan edited by the reviewer: {counts}"
    update = {"plan": plan, "planner_used": "human", "current": current.model_dump()}
    return {**update, "history": event("approve", message, it)}
