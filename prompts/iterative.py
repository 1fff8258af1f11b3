"""Prompts of the Iterative Pruning Agent (rounds > 1): the profile plus earlier plans and their measurements."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from langchain_core.messages import BaseMessage, HumanMessage, SystemMessage

from profiling_agent.prompts.analysis import objective_block, profile_block, system_prompt
from profiling_agent.state import Objective

# Appended to the analysis system prompt from round 2 on. No placeholders.
ITERATIVE_SYSTEM_ADDENDUM = """

From round 2 on you act as the Iterative Pruning Agent: you also see every earlier plan and its measured \
evaluation (accuracy drop, reductions, speedup, failures). Learn from them: back off on the groups pruned \
hardest when accuracy fell beyond the budget, push further where the budget held and damage is low, and never \
resubmit a plan that was already evaluated."""

# Placeholders: {profile_block} and {objective_block} (as in ANALYSIS_USER), {iteration} (round being planned),
# {max_iterations} (Objective.iterations), {baseline} (baseline measurements), {history} (one block per earlier
# candidate: plan, what pruning did, measured evaluation or error), {best} (best candidate so far),
# {rejections} (earlier LLM plans the guard rejected, or empty).
ITERATIVE_USER = """{profile_block}

{objective_block}

Round {iteration} of at most {max_iterations}. Every plan is applied to the original model and measured side \
by side with the baseline ({baseline}).
Earlier candidates:
{history}
Best so far: {best}
{rejections}
Propose the plan for round {iteration}. If the last candidate exceeded the accuracy budget, lower the ratios \
it used, above all on high-damage groups; if it kept the budget but missed the target, prune more where damage \
is low. Answer with the JSON plan only."""

MAX_HISTORY = 6  # most recent candidates shown
MAX_ENTRIES_SHOWN = 8  # plan entries shown per candidate


def _reduction(record: dict[str, Any], baseline: dict[str, Any], key: str) -> str:
    base, value = baseline.get(key), record.get(key)
    if not base or value is None:
        return "n/a"
    return f"{float(value) / float(base) - 1:+.1%}"


def baseline_line(baseline: dict[str, Any] | None) -> str:
    """Render the baseline's measurements."""
    if not baseline:
        return "baseline not measured"
    return (
        f"baseline: accuracy {float(baseline.get('accuracy', 0.0)):.2f}%, params {baseline.get('params')}, "
        f"MACs {baseline.get('macs')}, latency {float(baseline.get('latency_ms', 0.0)):.2f} ms, "
        f"size {float(baseline.get('size_mb', 0.0)):.1f} MB"
    )


def eval_line(record: dict[str, Any], baseline: dict[str, Any] | None, objective: Objective) -> str:
    """Render one evaluation against the baseline: accuracy drop, reductions, speedup."""
    acc = float(record.get("accuracy", 0.0))
    if not baseline:
        return f"accuracy {acc:.2f}%"
    drop = float(baseline.get("accuracy", 0.0)) - acc
    verdict = "within budget" if drop <= objective.max_acc_drop + 1e-9 else "OVER budget"
    return (
        f"accuracy {acc:.2f}% (drop {drop:.2f} pp, {verdict}), params {_reduction(record, baseline, 'params')}, "
        f"MACs {_reduction(record, baseline, 'macs')}, size {_reduction(record, baseline, 'size_mb')}, "
        f"speedup {float(record.get('speedup') or 0.0):.2f}x"
    )


def plan_line(plan: dict[str, Any]) -> str:
    """Summarize a plan's entries on one line each for pruning and quantization."""
    pruning = [f"{e.get('layer')} {e.get('type')} {e.get('ratio')}" for e in plan.get("pruning") or []]
    quant = [f"{e.get('layer')} {e.get('dtype')}" for e in plan.get("quantization") or []]
    more = f"; ... {len(pruning) - MAX_ENTRIES_SHOWN} more" if len(pruning) > MAX_ENTRIES_SHOWN else ""
    return f"pruning: {'; '.join(pruning[:MAX_ENTRIES_SHOWN]) or 'none'}{more} | quantization: " + (
        "; ".join(quant) or "none"
    )


def applied_line(applied: list[dict[str, Any]]) -> str:
    """Summarize what pruning did: groups touched and a few unit counts."""
    if not applied:
        return "nothing pruned"
    shown = [f"{a.get('group')} {a.get('units_before')}->{a.get('units_after')}" for a in applied[:4]]
    more = f", ... ({len(applied)} groups)" if len(applied) > 4 else ""
    return "pruned " + ", ".join(shown) + more


def forms_line(record: dict[str, Any]) -> str:
    """Summarize the backend forms measured for a candidate (speed vs the baseline, accuracy) and the delivered one."""
    parts = [
        f"{v.get('name')} {float(v.get('speedup') or 0.0):.2f}x {float(v.get('accuracy') or 0.0):.1f}%"
        if v.get("status") == "ok"
        else f"{v.get('name')} failed"
        for v in record.get("variants") or []
    ]
    return f"forms (delivered {record.get('delivered')}): " + "; ".join(parts)


def history_block(candidates: list[dict[str, Any]], baseline: dict[str, Any] | None, objective: Objective) -> str:
    """Render the most recent candidates: plan, pruning applied, measured evaluation or error."""
    if not candidates:
        return "(none)"
    lines = []
    skipped = max(0, len(candidates) - MAX_HISTORY)
    if skipped:
        lines.append(f"({skipped} older candidates omitted)")
    for cand in candidates[-MAX_HISTORY:]:
        head = f"#{cand.get('iteration')} ({cand.get('planner', '?')}, {cand.get('status')})"
        if cand.get("status") == "ok" and cand.get("eval"):
            head += ": " + eval_line(cand["eval"], baseline, objective)
        else:
            head += f": failed: {str(cand.get('error') or 'unknown error')[:200]}"
        lines.append(head)
        lines.append("   " + plan_line(cand.get("plan") or {}))
        lines.append("   " + applied_line(cand.get("applied") or []))
        if cand.get("status") == "ok" and (cand.get("eval") or {}).get("variants"):
            lines.append("   " + forms_line(cand["eval"]))
    return "\n".join(lines)


def best_line(best: dict[str, Any] | None, baseline: dict[str, Any] | None, objective: Objective) -> str:
    """Name the best candidate so far (the caller's select_best result), or say there is none."""
    if not baseline:
        return "none"
    if best is None:
        return "none (no candidate finished)"
    return (
        f"#{best['iteration']} ({objective.select} rule): {objective.target} reduction {best['reduction']:.1%}, "
        f"accuracy drop {best['accuracy_drop']:.2f} pp, {'within' if best['within_budget'] else 'over'} budget"
    )


def rejections_block(fallbacks: list[dict[str, Any]], limit: int = 3) -> str:
    """Render the latest LLM plans the guard or parser rejected, with their reasons."""
    lines = []
    for fb in fallbacks[-limit:]:
        reasons: list[str] = []
        for attempt in fb.get("rejected") or []:
            reasons += attempt.get("reasons", []) if isinstance(attempt, dict) else [str(attempt)]
        detail = "; ".join(reasons[:4]) or str(fb.get("reason", ""))
        lines.append(f"- round {fb.get('iteration', '?')} ({fb.get('stage')}): {detail[:400]}")
    return "Earlier LLM answers that were rejected (avoid these mistakes):\n" + "\n".join(lines) if lines else ""


@dataclass(frozen=True)
class Feedback:
    """What the earlier rounds showed, for a later round's prompt.

    Attributes:
        iteration: Round being planned (>= 2).
        candidates: Earlier candidates (iteration, status, planner, plan, applied, eval, error).
        baseline_eval: The baseline's evaluation record.
        fallbacks: Earlier planner fallbacks (stage, reason, rejected, iteration).
        best: The best candidate so far by the run's rule (select_best's result), or None.
    """

    iteration: int
    candidates: list[dict[str, Any]] = field(default_factory=list)
    baseline_eval: dict[str, Any] | None = None
    fallbacks: list[dict[str, Any]] = field(default_factory=list)
    best: dict[str, Any] | None = None


def render_iterative(
    profile: dict[str, Any],
    sensitivity: dict[str, Any],
    objective: Objective,
    feedback: Feedback,
    *,
    model_info: dict[str, Any] | None = None,
    bounds: dict[str, Any] | None = None,
    tool_rounds: int = 6,
) -> list[BaseMessage]:
    """Build the messages of a later round: analysis system prompt + addendum, profile and feedback.

    Args:
        profile: The full profile.json dict.
        sensitivity: Probe results per group name.
        objective: The run's objective.
        feedback: The round planned and what the earlier rounds showed.
        model_info: Facts shown in the header.
        bounds: The guard's bounds quoted in the rules (GuardConfig's fields by name).
        tool_rounds: Tool-call rounds allowed.
    """
    baseline_eval = feedback.baseline_eval
    system = system_prompt(bounds, tool_rounds) + ITERATIVE_SYSTEM_ADDENDUM
    user = ITERATIVE_USER.format(
        profile_block=profile_block(profile, sensitivity, model_info or {}),
        objective_block=objective_block(objective),
        iteration=feedback.iteration,
        max_iterations=objective.iterations,
        baseline=baseline_line(baseline_eval),
        history=history_block(feedback.candidates, baseline_eval, objective),
        best=best_line(feedback.best, baseline_eval, objective),
        rejections=rejections_block(feedback.fallbacks),
    )
    return [SystemMessage(content=system), HumanMessage(content=user)]
