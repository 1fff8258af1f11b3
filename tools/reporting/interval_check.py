"""Every figure a result.json states beside an interval must lie inside that interval: the check, one line per miss."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

TOLERANCE = 1e-6  # the stored figures are rounded to 4-6 decimals; an interval's ends are never rounded inwards
PLAN_TOLERANCE = 1e-3  # a plan's predicted and expected losses and their intervals are stored rounded to 3 decimals


def _pairs(result: Mapping[str, Any]) -> Iterator[tuple[str, Any, Any, float]]:
    """Yield (where, point, interval, tolerance) for every figure of `result` stored beside an interval."""
    delivery = result.get("delivery") or {}
    for key in ("vs_original_torch", "vs_quantization_only"):
        paired = delivery.get(f"{key}_ci")
        if paired:
            yield f"delivery.{key}", delivery.get(key), paired.get("ci"), TOLERANCE
            yield f"delivery.{key}_ci.ratio", paired.get("ratio"), paired.get("ci"), TOLERANCE
    outcome = result.get("outcome") or {}
    if outcome.get("measured_ci"):
        yield "outcome.measured", outcome.get("measured"), outcome["measured_ci"], TOLERANCE
    base_acc = (result.get("baseline") or {}).get("accuracy")
    best = result.get("best") or {}
    if best.get("test_delta_ci"):
        yield "best.test_delta", best.get("test_delta"), best["test_delta_ci"], TOLERANCE
    rows = [("best", best)] + [(f"candidates[{i}]", c) for i, c in enumerate(result.get("candidates") or [])]
    for where, row in rows:
        if row.get("acc_delta_ci") and row.get("accuracy") is not None and base_acc is not None:
            delta = float(row["accuracy"]) - float(base_acc)
            yield f"{where}.accuracy - baseline.accuracy", delta, row["acc_delta_ci"], TOLERANCE
        prediction = row.get("prediction") or {}
        for kind in ("predicted", "expected"):
            if prediction.get(f"{kind}_interval") and prediction.get(f"{kind}_drop") is not None:
                point, interval = prediction[f"{kind}_drop"], prediction[f"{kind}_interval"]
                yield f"{where}.prediction.{kind}_drop", point, interval, PLAN_TOLERANCE


def ratios_outside_intervals(result: Mapping[str, Any]) -> list[str]:
    """Return one line per figure of a result.json that lies outside the interval stored beside it.

    Checked: the delivered model's speed ratios against the original torch model and quantization alone (and
    each interval's own estimate), a latency target's measured reduction, the held-out accuracy change, every
    candidate's accuracy change against the baseline on validation, and every round's predicted and expected loss.
    An empty list: every point lies inside its own interval.
    """
    out = []
    for where, point, interval, tolerance in _pairs(result):
        if point is None or not _is_interval(interval):
            out.append(f"{where}: {point!r} beside {interval!r} (no point or no [low, high])")
            continue
        low, high = (float(x) for x in interval)
        if not low - tolerance <= float(point) <= high + tolerance:
            out.append(f"{where}: {float(point):.6g} outside its interval [{low:.6g}, {high:.6g}]")
    return out


def _is_interval(value: Any) -> bool:
    """Return whether `value` is a [low, high] pair of numbers with low <= high."""
    if not isinstance(value, Sequence) or isinstance(value, str) or len(value) != 2:
        return False
    low, high = value
    return isinstance(low, int | float) and isinstance(high, int | float) and low <= high
