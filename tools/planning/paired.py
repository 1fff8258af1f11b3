"""Paired rounds of an LLM run: every LLM plan is measured beside the deterministic planner's own sequence.

When the LLM plans, the run interleaves two sequences of candidates. An LLM turn applies the LLM's plan; when that
plan is the LLM's (not the deterministic fallback), the next candidate is a reference turn that applies the plan
the deterministic planner makes from its own earlier rounds only. The deterministic rounds therefore see exactly
what they would see in a `--planner deterministic` run with the same settings (same plans, same images, same
seeds), and the best candidate is selected over both sequences, so the delivered model is never worse by the
selection rule than the deterministic run's. The run stops when the deterministic sequence would stop (its own
best meets the objective, it converged, or it had `iterations` rounds), never before a pending reference turn.
"""

from __future__ import annotations

from collections.abc import Sequence

from profiling_agent.state import Best, Candidate, EvalRecord, Objective
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
