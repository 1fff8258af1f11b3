"""Which forms' accuracy passes a round can leave out: the ones that cannot change what is delivered.

A form's accuracy is needed only to decide what ships: the fastest form within the budget (and, for the unpruned
model, the forms a pruning round builds: `forms.round_forms`). Forms are scored fastest first, as measured in the
same round; once `keep` forms that may ship are within the budget, a slower form outside `tie` times the fastest of
them cannot be chosen, and its pass (on a full-size ViT-B/16 in ONNX Runtime FP32, about 90 s for 256 images on one
core) is left out. A pass cheaper than `min_seconds` is always run, so small models keep every form's accuracy.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from profiling_agent.tools.runtimes.forms import ROUND_KEEP, ROUND_TIE

MIN_PASS_S = 5.0  # an accuracy pass estimated under this many seconds is always run


@dataclass(frozen=True)
class ScoringRule:
    """When a form's accuracy pass may be left out.

    Attributes:
        optional: Model keys whose pass may be left out (the others are always scored).
        budget: The accuracy budget in pp, against the baseline's accuracy on the same images.
        eligible: Keys that may be delivered and so count toward `keep` (None: every optional key).
        keep: Forms within the budget that must be scored before slower ones may be left out.
        tie: Forms within this factor of the fastest scored form within the budget are scored too.
        min_seconds: A pass estimated under this many seconds is run anyway.
    """

    optional: frozenset[str]
    budget: float
    eligible: frozenset[str] | None = None
    keep: int = ROUND_KEEP
    tie: float = ROUND_TIE
    min_seconds: float = MIN_PASS_S


def pass_seconds(latency: Mapping[str, Any], images: int) -> float:
    """Estimate one accuracy pass over `images` from a form's timed batch latency (0 when it was not timed)."""
    batch_ms, batch = latency.get("latency_batch_ms"), latency.get("batch_size")
    if not batch_ms or not batch:
        return 0.0
    return float(batch_ms) / float(batch) * images / 1e3


@dataclass(frozen=True)
class Scores:
    """What a round has measured so far, which the scoring rule reads.

    Attributes:
        accuracies: Top-1 of the models scored so far.
        reference: The baseline's top-1 on the same images (the budget's reference).
        latency: `measure_latency` rows of the timed models.
        images: Images in one pass.
    """

    accuracies: Mapping[str, float]
    reference: float
    latency: Mapping[str, Mapping[str, Any]]
    images: int


def _within(rule: ScoringRule, scores: Scores) -> list[str]:
    """Return the scored models that count toward `keep` and are within the budget, fastest first."""
    counted = rule.eligible if rule.eligible is not None else rule.optional
    accuracies, latency, floor = scores.accuracies, scores.latency, scores.reference - rule.budget - 1e-9
    return sorted(
        (n for n, acc in accuracies.items() if n in counted and n in latency and acc >= floor),
        key=lambda n: float(latency[n]["latency_ms"]),
    )


def passes_needed(rule: ScoringRule, scores: Scores, candidates: Collection[str]) -> list[str]:
    """Return the optional models still to be scored, fastest first (empty: the rest may be left out).

    Args:
        rule: The scoring rule.
        scores: What the round measured so far.
        candidates: The models of the round (optional ones among them are considered).
    """
    latency = scores.latency
    pending = sorted(
        (n for n in candidates if n in rule.optional and n not in scores.accuracies),
        key=lambda n: float(latency.get(n, {}).get("latency_ms") or float("inf")),
    )
    within = _within(rule, scores)
    if len(within) < rule.keep:
        return pending
    limit = float(latency[within[0]]["latency_ms"]) * rule.tie
    return [
        n
        for n in pending
        if n not in latency
        or float(latency[n]["latency_ms"]) <= limit
        or pass_seconds(latency[n], scores.images) < rule.min_seconds
    ]


def left_out_reason(rule: ScoringRule, scores: Scores, name: str) -> str:
    """Say why `name`'s accuracy was not measured: the faster forms within the budget, and the pass it saved."""
    within = _within(rule, scores)
    if not within:
        return "accuracy not measured"
    return (
        f"accuracy not measured: {' and '.join(within[: rule.keep])} are within the budget and this form is over "
        f"{rule.tie:g}x slower than {within[0]}, so it cannot be delivered (a pass of about "
        f"{pass_seconds(scores.latency[name], scores.images):.0f} s left out)"
    )
