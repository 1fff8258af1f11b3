"""Human review of a plan, as pure functions: unwrap a plan file, check a human plan, read a resume answer."""

from __future__ import annotations

from typing import Any

from profiling_agent.state import PlannerProfile

DECISIONS = ("approve", "edit", "reject")


def unwrap_plan(data: Any) -> Any:
    """Return the plan inside an iter_NN/plan.json document ({"plan": {...}, ...}), or `data` itself."""
    if isinstance(data, dict) and isinstance(data.get("plan"), dict) and "pruning" not in data:
        return data["plan"]
    return data


def review_plan(plan: Any, profile: dict[str, Any], time_budget: float = 1.0):
    """Check a human plan like an LLM plan: schema, regex safety, targets, protected layers and bounds.

    Args:
        plan: The plan (a dict, a CompressionPlan, or a plan.json document holding one).
        profile: The run's profile.json (groups, protected modules, group costs, layers), and the run's
            `token_axis` (its JSON) when it has one: a token entry is checked against it.
        time_budget: Seconds allowed for all regex searches in a child process (0 skips that check).

    Returns:
        The plan guard's GuardVerdict (`ok`, `plan`, `reasons`, `warnings`, `estimate`).
    """
    from profiling_agent.tools.planning.plan_guard import (
        GuardConfig,
        check_plan,
    )  # lazy: torch and transformers; nodes.approve loads this module without it

    facts = PlannerProfile.of(profile)  # the file's JSON, read once
    return check_plan(unwrap_plan(plan), facts, GuardConfig(match_time_budget=time_budget, tokens=facts.token_axis))


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
