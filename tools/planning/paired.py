"""Paired rounds of an LLM run: every LLM plan is measured beside the deterministic planner's own sequence.

When the LLM plans, the run interleaves two sequences of candidates. An LLM turn applies the LLM's plan; when that
plan is the LLM's (not the deterministic fallback), the next candidate is a reference turn that applies the plan
the deterministic planner makes from its own earlier rounds only. The deterministic rounds therefore see exactly
what they would see in a `--planner deterministic` run with the same settings (same plans, same images, same
seeds), and the best candidate is selected over both sequences, so the delivered model is never worse by the
selection rule than the deterministic run's. The run stops when the deterministic sequence would stop (its own
best meets the objective, it converged, or it had `iterations` rounds), never before a pending reference turn.

A turn whose plan does what an earlier finished candidate's did (the LLM copied the proposal that the reference
turn then plans again) is not built twice: pruning, recovery and evaluation read the run's seed and images, not the
iteration, so they would rebuild the same model. The turn is recorded with that candidate's measurements
(`repeated_round`), and the report says whose.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from profiling_agent.state import Best, Candidate, CompressionPlan, EvalRecord, Objective, PlannerMeta
from profiling_agent.tools.evaluation.selection import objective_met, select_best


def is_paired(candidates: Sequence[Candidate]) -> bool:
    """Return True when the run interleaves LLM and reference turns (a candidate has a turn)."""
    return any(c.planner_meta.turn for c in candidates)


def reference_due(candidates: Sequence[Candidate]) -> bool:
    """Return True when the last candidate applied the LLM's own plan, so the deterministic round comes next."""
    return bool(candidates) and candidates[-1].planner_meta.turn == "llm" and candidates[-1].planner == "llm"


def deterministic_sequence(candidates: Sequence[Candidate]) -> list[Candidate]:
    """Return the candidates the deterministic planner learns from: in a paired run only its own plans."""
    if not is_paired(candidates):
        return list(candidates)
    return [c for c in candidates if c.planner == "deterministic"]


def round_bound(objective: Objective, candidates: Sequence[Candidate]) -> int:
    """Return the most candidates the run may make: `iterations`, or twice that in a paired run."""
    return objective.iterations * (2 if is_paired(candidates) else 1)


def paired_stop(
    candidates: Sequence[Candidate], baseline: EvalRecord | None, objective: Objective
) -> tuple[str, Best | None]:
    """Say why a paired run stops now ("" to go on) and return the deterministic sequence's best.

    A pending reference turn always runs; then the run stops when the deterministic sequence's own best meets the
    objective or it had `objective.iterations` rounds, as the deterministic run would.
    """
    det = deterministic_sequence(candidates)
    det_best = select_best(det, baseline, objective) if baseline else None
    if reference_due(candidates):
        return "", det_best
    if objective_met(det_best, baseline, objective):
        assert det_best is not None
        return (
            f"objective met by the deterministic sequence at iteration {det_best.iteration} "
            f"({det_best.reduction:.1%} {objective.target} reduction); every LLM plan was measured beside it"
        ), det_best
    if len(det) >= objective.iterations:
        return f"iteration bound reached ({objective.iterations} rounds of each planner)", det_best
    return "", det_best


def measured_before(candidates: Sequence[Candidate], plan: CompressionPlan) -> Candidate | None:
    """Return the latest candidate measured with a plan doing what `plan` does (None: none was).

    Measured: evaluated (ok), or rejected by its recovered trial (a plan a person rejected was never measured).
    """
    effect = plan.effect()
    same = [c for c in candidates if measured(c) and c.plan.effect() == effect]
    return same[-1] if same else None


def measured(candidate: Candidate) -> bool:
    """Return whether a finished candidate's record holds its measurements: evaluated, or refused by its trial."""
    if candidate.status == "ok":
        return candidate.eval is not None
    return candidate.status == "rejected" and candidate.review is None


def repeated_round(
    candidates: Sequence[Candidate], plan: CompressionPlan, meta: PlannerMeta, iteration: int
) -> tuple[int, dict[str, Any]] | None:
    """In a paired run, the finished record of round `iteration` when its plan was measured before (None: build it).

    Returns (the earlier iteration, the record): the earlier candidate's pruned model, recovery, forms and
    measurements, with this round's iteration and planner meta. The same plan on the same seed and images is the
    same model, measured once.
    """
    earlier = measured_before(candidates, plan) if meta.turn else None
    if earlier is None:
        return None
    kept = earlier.model_dump(exclude={"iteration", "planner_meta", "review", "check", "plan", "planner"})
    return earlier.iteration, {**kept, "iteration": iteration, "planner_meta": meta.model_dump()}
