"""Whether the delivered model met the objective's target, and by how much it missed: one record, one sentence."""

from __future__ import annotations

from typing import Any

NAMES = {"params": "parameter", "macs": "MAC", "size": "size", "latency": "latency"}


def target_outcome(best: dict[str, Any] | None, baseline: dict[str, Any] | None, objective: dict[str, Any]):
    """Return {"target", "requested", "measured", "met", "missed_by", "form", "against", "statement"}.

    `best` is the state's Best (its `reduction` was measured by the selection rule: with a latency target, on the
    delivered form against the unpruned model in that same form). None when no candidate was kept.
    """
    from profiling_agent.tools.evaluation.selection import same_form_latency

    target = str(objective.get("target") or "params")
    requested = float(objective.get("target_reduction") or 0.0)
    out: dict[str, Any] = {"target": target, "requested": requested, "measured": None, "met": False}
    if not best or not best.get("eval") or not baseline:
        out["statement"] = f"no candidate was kept: the {requested:.0%} {NAMES[target]} reduction was not reached"
        return out
    measured = float(best.get("reduction") or 0.0)
    out["measured"], out["met"] = round(measured, 4), measured + 1e-9 >= requested
    out["missed_by"] = 0.0 if out["met"] else round(requested - measured, 4)
    where = ""
    if target == "latency":
        _, out["form"], out["against"] = same_form_latency(best["eval"], baseline)
        where = f" on {out['form']} against the unpruned model's {out['form']} ({out['against']})"
    verdict = "met" if out["met"] else f"missed by {out['missed_by']:.1%}"
    within = "within" if best.get("within_budget") else "outside"
    out["statement"] = (
        f"{NAMES[target]} reduction {measured:.1%}{where}: the {requested:.0%} target {verdict}, "
        f"{within} the accuracy budget"
    )
    return out
