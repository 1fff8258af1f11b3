"""The points of the accuracy-vs-cost plots: baseline, candidates, the best's backend forms, other baselines."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from profiling_agent.tools.text import as_number


def _relative_latency(entry: Mapping[str, Any], base_latency: float | None) -> float | None:
    """Batch-1 latency over the baseline's: 1/speedup (measured side by side), else a ratio of medians."""
    speedup = as_number(entry.get("speedup"))
    if speedup and speedup > 0:
        return 1.0 / speedup
    latency = as_number(entry.get("latency_ms"))
    return latency / base_latency if latency is not None and base_latency else None


def extra_baselines(result: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Other reference models in result.json's optional "baselines" key (a dict by name or a list of dicts).

    Returns:
        [{"name", **metrics}] in a stable order; entries that are not dicts are skipped.
    """
    raw = result.get("baselines")
    if isinstance(raw, Mapping):
        items = [{"name": str(name), **entry} for name, entry in raw.items() if isinstance(entry, Mapping)]
    elif isinstance(raw, list):
        items = [
            {**entry, "name": str(entry.get("name") or entry.get("label") or entry.get("method") or f"ref {i + 1}")}
            for i, entry in enumerate(raw)
            if isinstance(entry, Mapping)
        ]
    else:
        items = []
    return items


def pareto_points(result: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One point per measured model: baseline, every finished candidate, the best's other forms, extra baselines.

    Returns:
        [{"label", "kind" ("baseline" | "candidate" | "best" | "variant" | "reference"), "accuracy", "latency_rel",
        "params"}]; a metric that is missing is None. Candidate numbers are the candidate rows of result.json.
    """
    base = result.get("baseline") or {}
    base_latency = as_number(base.get("latency_ms"))
    points = []
    if as_number(base.get("accuracy")) is not None:
        points.append(
            {
                "label": "baseline",
                "kind": "baseline",
                "accuracy": as_number(base.get("accuracy")),
                "latency_rel": 1.0,
                "params": as_number(base.get("params")),
            }
        )
    best_it = (result.get("best") or {}).get("iteration")
    for cand in result.get("candidates") or []:
        if cand.get("status") != "ok" or as_number(cand.get("accuracy")) is None:
            continue
        points.append(
            {
                "label": f"iter {cand['iteration']}",
                "kind": "best" if cand["iteration"] == best_it else "candidate",
                "accuracy": as_number(cand.get("accuracy")),
                "latency_rel": _relative_latency(cand, base_latency),
                "params": as_number(cand.get("params")),
            }
        )
    best = result.get("best") or {}
    if best_it == 0 and as_number(best.get("accuracy")) is not None:  # quantization only was delivered
        points.append(
            {
                "label": f"unpruned {best.get('delivered')}",
                "kind": "best",
                "accuracy": as_number(best.get("accuracy")),
                "latency_rel": _relative_latency(best, base_latency),
                "params": as_number(best.get("params")),
            }
        )
    points += variant_points(result, base_latency)
    for ref in extra_baselines(result):
        if as_number(ref.get("accuracy")) is None:
            continue
        points.append(
            {
                "label": ref["name"],
                "kind": "reference",
                "accuracy": as_number(ref.get("accuracy")),
                "latency_rel": _relative_latency(ref, base_latency),
                "params": as_number(ref.get("params")),
            }
        )
    return points


def pareto_front(points: list[dict[str, Any]], cost: str) -> list[dict[str, Any]]:
    """Return the points no other point beats on both accuracy (higher) and `cost` (lower), sorted by cost."""
    usable = [p for p in points if p.get(cost) is not None and p.get("accuracy") is not None]
    front = [
        p
        for p in usable
        if not any(
            q is not p
            and q[cost] <= p[cost]
            and q["accuracy"] >= p["accuracy"]
            and (q[cost] < p[cost] or q["accuracy"] > p["accuracy"])
            for q in usable
        )
    ]
    return sorted(front, key=lambda p: (p[cost], -p["accuracy"]))


def variant_points(result: Mapping[str, Any], base_latency: float | None) -> list[dict[str, Any]]:
    """Return the best candidate's backend forms other than the delivered one (measured beside the baseline)."""
    best = result.get("best") or {}
    out = []
    for v in best.get("variants") or []:
        if v.get("status") != "ok" or v.get("name") == best.get("delivered") or as_number(v.get("accuracy")) is None:
            continue
        out.append(
            {
                "label": f"iter {best['iteration']} {v['name']}" if best["iteration"] else f"unpruned {v['name']}",
                "kind": "variant",
                "accuracy": as_number(v.get("accuracy")),
                "latency_rel": _relative_latency(v, base_latency),
                "params": as_number(best.get("params")),
            }
        )
    return out
