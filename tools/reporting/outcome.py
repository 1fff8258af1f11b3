"""Whether the delivered model met the objective's target, and by how much it missed: one record, one sentence."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from profiling_agent.state import Best, EvalRecord, Objective
from profiling_agent.tools import run_layout

NAMES = {"params": "parameter", "macs": "MAC", "size": "size", "latency": "latency"}
Timing = Mapping[str, Mapping[str, Any]]  # the report's joint timing by key ("iter_NN", "unpruned_<form>")


def target_outcome(
    best: Best | None,
    baseline: EvalRecord | None,
    objective: Objective,
    final: Timing | None = None,
) -> dict[str, Any]:
    """Return {"target", "requested", "measured", "met", "missed_by", "form", "against", "statement"}.

    `best` is the state's Best (its `reduction` was measured by the selection rule: with a latency target, on the
    delivered form against the unpruned model in that same form). None when no candidate was kept. `final` is the
    report's joint timing ("iter_NN", "unpruned_<form>"): when it timed the delivered model and the unpruned model
    in the same form, a latency outcome is measured there (the round's figure is kept as `round_measured`, and the
    larger batch's reduction is given as `measured_batch`), so result.json states one latency, not two; with paired
    repeats it is the paired median's reduction, inside its `measured_ci` (`latency.paired_reduction`).
    """
    from profiling_agent.tools.evaluation.selection import (
        same_form_latency,
    )  # lazy: torch; tools.reporting.result loads this module without it

    target, requested = objective.target, float(objective.target_reduction)
    out: dict[str, Any] = {"target": target, "requested": requested, "measured": None, "met": False}
    if best is None or best.eval is None or baseline is None:
        out["statement"] = f"no candidate was kept: the {requested:.0%} {NAMES[target]} reduction was not reached"
        return out
    measured = float(best.reduction)
    where = ""
    if target == "latency":
        _, out["form"], out["against"] = same_form_latency(best.eval, baseline)
        joint = _joint(final or {}, best, str(out["form"]))
        larger = ""
        if joint is not None:
            out["round_measured"], out["measured_batch"] = round(measured, 4), round(joint[1], 4)
            measured, out["against"] = joint[0], "timed beside it at the end of the run"
            larger = f"; at the larger batch {joint[1]:.1%}"
            paired = _joint_interval(final or {}, best, str(out["form"]))
            if paired is not None:  # the paired median's reduction, stated beside its own interval
                measured, out["measured_ci"] = paired
                larger = f" (95% interval {paired[1][0]:.1%} to {paired[1][1]:.1%}, paired repeats){larger}"
        where = f" on {out['form']} against the unpruned model's {out['form']} ({out['against']}){larger}"
    out["measured"], out["met"] = round(measured, 4), measured + 1e-9 >= requested
    out["missed_by"] = 0.0 if out["met"] else round(requested - measured, 4)
    verdict = "met" if out["met"] else f"missed by {out['missed_by']:.1%}"
    within = "within" if best.within_budget else "outside"
    out["statement"] = (
        f"{NAMES[target]} reduction {measured:.1%}{where}: the {requested:.0%} target {verdict}, "
        f"{within} the accuracy budget"
    )
    return out


def _joint(final: Timing, best: Best, form: str) -> tuple[float, float] | None:
    """Return (batch-1, larger-batch) latency reductions of `best` against the unpruned `form` in the joint timing."""
    from profiling_agent.tools.evaluation.delivery import (
        PEER_PREFIX,
    )  # lazy: torch; tools.reporting.result loads this module without it

    mine, peer = final.get(run_layout.iteration_name(best.iteration)), final.get(PEER_PREFIX + form)
    if not mine or not peer or not peer.get("latency_ms") or not peer.get("latency_batch_ms"):
        return None
    one = 1.0 - float(mine["latency_ms"]) / float(peer["latency_ms"])
    return one, 1.0 - float(mine["latency_batch_ms"]) / float(peer["latency_batch_ms"])


def _joint_interval(final: Timing, best: Best, form: str) -> tuple[float, list[float]] | None:
    """Return the batch-1 reduction of the joint timing's paired repeats and its 95% interval, or None."""
    from profiling_agent.tools.evaluation.delivery import (
        PEER_PREFIX,
    )  # lazy: torch; tools.reporting.result loads this module without it
    from profiling_agent.tools.evaluation.latency import (
        paired_ratio,
        paired_reduction,
    )  # lazy: torch; tools.reporting.result loads this module without it

    mine, peer = final.get(run_layout.iteration_name(best.iteration)), final.get(PEER_PREFIX + form)
    ratio = paired_ratio(peer, mine) if mine and peer else None  # the unpruned form's time over the delivered's
    return paired_reduction(ratio) if ratio is not None else None
