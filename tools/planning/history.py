"""The deterministic planner's view of earlier rounds: goal, gamma, and whether each kept the budget."""

from __future__ import annotations

from collections.abc import Sequence

from profiling_agent.state import Candidate, EvalRecord, Objective, PastRound, VariantSummary
from profiling_agent.tools.evaluation.selection import accuracy_drop, within_budget

SUMMARY_KEYS = set(VariantSummary.model_fields)  # what a round's backend forms say to the planners


def planner_history(
    candidates: Sequence[Candidate], baseline: EvalRecord | None, objective: Objective
) -> list[PastRound]:
    """Summarize earlier rounds for the planner: the goal and gamma each aimed at and whether the budget held."""
    rounds = []
    base = baseline
    for cand in candidates:
        meta = cand.planner_meta
        if meta.goal is None:
            continue
        ev = cand.eval
        passed = bool(cand.status == "ok" and ev and base and within_budget(ev, base, objective))
        drop = accuracy_drop(ev, base) if cand.status == "ok" and ev and base else None
        curve = cand.recovery.trial_curve if cand.recovery is not None else None
        missed = cand.status == "rejected" and bool(curve)  # its recovered trial missed the budget
        reviewed = cand.status == "rejected" and not missed
        if missed and curve:
            drop = float(curve[-1][2])  # the trial slice's loss after recovery, pp
        rounds.append(
            PastRound(
                iteration=cand.iteration,
                goal=meta.goal,
                gamma=meta.gamma,
                passed=passed,
                rejected=reviewed,  # a reviewer's no (a recovered trial that missed the budget is a miss)
                drop=drop,  # validation accuracy loss after recovery, pp (a missed trial's: the trial slice's)
                predicted_drop=meta.predicted_drop,  # the plan's trial on the trial slice, pp
                blocks=sorted(e.layer for e in cand.plan.pruning if e.type == "block"),  # removed blocks' patterns
                width=any(e.type != "block" for e in cand.plan.pruning),  # it pruned channels or heads too
                quant_speedup=ev.quant_speedup if ev else None,
                quant_speedup_batch=ev.quant_speedup_batch if ev else None,
                delivered=ev.delivered if ev else None,
                variants=[VariantSummary.model_validate(v.model_dump(include=SUMMARY_KEYS)) for v in ev.variants]
                if ev
                else [],
            )
        )
    return rounds
