"""A round's predictions beside its measurements: the accuracy loss and, with a latency target, the latency.

The deterministic planner predicts a plan's accuracy loss from a calibration trial and its latency reduction from
the planned form's latency model; after recovery and evaluation the candidate measures both. `round_check`
records the pair (a `RoundCheck` on the candidate, in result.json) and the correction the next round carries.
"""

from __future__ import annotations

from profiling_agent.state import Candidate, EvalRecord, PastRound, RoundCheck
from profiling_agent.tools.planning.search import prediction_correction


def round_check(cand: Candidate, base: EvalRecord | None, target: str) -> RoundCheck | None:
    """Return the round's predicted-vs-measured record, or None when it has nothing to compare.

    Args:
        cand: The finished candidate.
        base: The baseline's evaluation record.
        target: The objective's target (latency adds the latency pair).
    """
    from profiling_agent.tools.evaluation.selection import (
        accuracy_drop,
        same_form_latency,
    )  # lazy: torch; nodes.iterate loads this module without it

    meta = cand.planner_meta
    if not base or not cand.eval:
        return None
    check = RoundCheck()
    predicted = meta.predicted_drop
    if predicted is not None:
        measured = accuracy_drop(cand.eval, base)
        check.predicted_drop_pp, check.measured_drop_pp = float(predicted), round(measured, 4)
        check.correction = prediction_correction(
            [PastRound(goal=0.0, passed=False, drop=measured, predicted_drop=predicted)]
        )
        check.expected_drop_pp = meta.expected_drop
    goal = meta.goal
    if target == "latency" and goal is not None:
        measured, form, against = same_form_latency(cand.eval, base)
        check.latency_form, check.latency_against = form, against
        check.predicted_latency_reduction, check.measured_latency_reduction = float(goal), round(measured, 4)
        check.latency_error = round(measured - float(goal), 4)
    return check if check.model_dump(exclude_none=True) else None


def check_message(check: RoundCheck | None) -> str:
    """Say in words how the round's predictions compared with what it measured ('' without a check)."""
    if check is None:
        return ""
    text = ""
    if check.predicted_drop_pp is not None and check.measured_drop_pp is not None:
        text += (
            f"; its trial predicted a {check.predicted_drop_pp:.2f} pp loss"
            + (
                f" ({check.expected_drop_pp:.2f} pp expected after recovery)"
                if check.expected_drop_pp is not None
                else ""
            )
            + f", validation showed {check.measured_drop_pp:.2f} pp after recovery "
            f"({check.measured_drop_pp - check.predicted_drop_pp:+.2f} pp off the trial: later rounds correct their "
            "trials by what every round measured)"
        )
    if check.predicted_latency_reduction is not None and check.measured_latency_reduction is not None:
        text += (
            f"; latency reduction predicted {check.predicted_latency_reduction:.1%}, measured "
            f"{check.measured_latency_reduction:.1%} on {check.latency_form} against the unpruned "
            f"{check.latency_form} (error {check.latency_error or 0.0:+.1%})"
        )
    return text
