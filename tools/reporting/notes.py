"""What a report says beside its numbers: notes that inform, and warnings that put a result in doubt."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from profiling_agent.tools.reporting.speed import delivered_speed, timing_flag


def test_headline(result: Mapping[str, Any]) -> list[str]:
    """Say what the held-out test images report ([] when the delivered model was not measured there)."""
    best, base = result.get("best") or {}, result.get("baseline") or {}
    if best.get("test_accuracy") is None or base.get("test_accuracy") is None:
        return []
    ci = best.get("test_delta_ci")
    return [
        f"On the held-out test images ({(result.get('protocol') or {}).get('test', {}).get('images')} images no "
        f"plan, probe or selection saw): top-1 {best['test_accuracy']:.2f}% vs {base['test_accuracy']:.2f}% "
        f"({best['test_delta']:+.2f} pp"
        + (f", 95% CI [{ci[0]:+.2f}, {ci[1]:+.2f}]" if ci else "")
        + "). The validation numbers chose this model; the test numbers report it."
    ]


def evaluation_notes(result: Mapping[str, Any]) -> list[str]:
    """Say how the numbers were taken: the trial slice, a missing before-recovery figure, a faster accuracy form."""
    best, base = result.get("best") or {}, result.get("baseline") or {}
    lines = []
    trial = (result.get("protocol") or {}).get("trial")
    if trial:
        lines.append(f"Every plan trial was judged on {trial['images']} validation images ({trial['rows']}).")
    if best.get("before_recovery_note"):
        lines.append(f"The best candidate's {best['before_recovery_note']}.")
    if base.get("predicted_by"):
        lines.append(
            f"The baseline's accuracy passes ran on its {base['predicted_by']} form: the same weights, faster than "
            "torch here, its logits checked against torch's on the check images within the FP32 tolerance."
        )
    return lines


def weak_evaluation(result: Mapping[str, Any]) -> str:
    """Say which roles held fewer images than the protocol judges on ('' when none: a run forced to go on)."""
    # the data room loads numpy and the hub helpers: imported only when a report is written
    from profiling_agent.tools.data.roles import (
        MIN_EVAL,
        WEAK_FLAG,
    )  # lazy: numpy; tools.reporting.html loads this module without it
    from profiling_agent.tools.data.subsets import (
        MIN_CALIBRATION,
    )  # lazy: numpy; tools.reporting.html loads this module without it

    protocol = result.get("protocol") or {}
    short = []
    for role, floor in (("validation", MIN_EVAL), ("test", MIN_EVAL), ("calibration", MIN_CALIBRATION)):
        images = (protocol.get(role) or {}).get("images")
        if isinstance(images, int) and 0 < images < floor:
            short.append(f"{images} {role} images (at least {floor} needed)")
    return f"Accuracy results mean little: {'; '.join(short)} ({WEAK_FLAG})." if short else ""


def evaluation_warnings(result: Mapping[str, Any]) -> list[str]:
    """Say what puts the accuracy result in doubt: too few images, an interval reaching past the budget."""
    best = result.get("best") or {}
    lines = [weak] if (weak := weak_evaluation(result)) else []
    if best.get("ci_crosses_budget"):
        budget = (result.get("objective") or {}).get("max_acc_drop")
        lines.append(
            f"Caution: the accuracy change is within the {budget} pp budget on the validation point estimate, "
            "but its 95% interval reaches past the budget."
        )
    return lines


def outcome_warnings(result: Mapping[str, Any]) -> list[str]:
    """Return every warning on the outcome: the accuracy result's, then flagged timings (report.html's red boxes)."""
    speed = delivered_speed(result)
    flag = timing_flag(speed) if speed is not None else ""
    return [*evaluation_warnings(result), *([f"Timings flagged: {flag}."] if flag else [])]
