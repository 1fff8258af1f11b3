"""Repair turns a small model can follow: the refused plan's numbers beside the deterministic proposal, inline."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any

from profiling_agent.tools.planning.plan_parse import parse_plan_text
from profiling_agent.tools.planning.proposal import ProposalAnswer, Propose

logger = logging.getLogger(__name__)

REPAIR_MARK = "Here is the deterministic planner's plan for this model"  # a repair turn that shows the proposal
REPAIR_PROPOSAL = (
    "{header}\n{reasons}\n{numbers}\n{resized}" + REPAIR_MARK + " ({proposal_numbers}); the guard accepts it:\n"
    "{proposal}\n"
    "Answer with {which} as it is, or with an edit of {it} (change ratios, add or drop groups from this model's "
    "table), as one JSON object only.{tools}"
)
# with measured alternatives offered, the repair lists them all again (the deterministic proposal is one of them,
# alternative A) instead of presenting that one plan as the answer to give
REPAIR_CHOICE = (
    "{header}\n{reasons}\n{numbers}\n{resized}The alternatives offered above, again:\n{offered}\n"
    "Answer with {which}, an edit of one, or a plan of your own, as one JSON object only.{tools}"
)
TOOLS_LEFT = " You may still call the tools (estimate_plan, propose_plan) before answering."
REPEATED = "the answer repeated a plan already refused ({reason}); the turn ended instead of sending it back again"


def _pct(value: Any) -> str | None:
    return f"{float(value):.1%}" if isinstance(value, (int, float)) and not isinstance(value, bool) else None


@dataclass
class Repair:
    """What a repair turn shows: the deterministic proposal at the round's goal, asked for once per step.

    Attributes:
        propose: propose_plan's function (goal, emphasis) -> {"goal", "predicted_reduction", "plan", ...}; its
            answers are recorded by the planner, so an applied copy or edit is compared with this proposal.
        goal: The goal of the proposal: the deterministic planner's goal this round.
        target: The objective's target (params, macs or latency): which predicted reduction is quoted.
    """

    propose: Propose
    goal: float
    target: str
    cached: ProposalAnswer | None = field(default=None, init=False)
    failed: bool = field(default=False, init=False)

    def proposal(self) -> ProposalAnswer | None:
        """Return propose_plan's answer at `goal` (None when it failed); computed once per step."""
        if self.cached is None and not self.failed:
            try:
                self.cached = self.propose(self.goal, "balanced")
            except Exception:  # noqa: BLE001 - a repair without the proposal is still a repair
                logger.debug("no proposal for the repair turn", exc_info=True)
                self.failed = True
        return self.cached

    def message(
        self,
        reasons: list[str],
        estimate: dict[str, float],
        tools_left: bool,
        parsed: bool = True,
        offered: str = "",
        resized: str = "",
    ) -> str | None:
        """Return the repair turn with the proposal inline (or the offered alternatives), or None without either.

        Args:
            reasons: The guard's (or the parser's) reasons for refusing the answer.
            estimate: The refused plan's predicted reduction per metric (empty when it was refused before sizing).
            tools_left: Whether the next request still offers the tools.
            parsed: False when the answer was no plan at all (the parser refused it).
            offered: The prompt's section of measured alternatives (empty: none were offered). When given, the
                repair lists them all again, the deterministic proposal among them, and asks for a choice, an
                edit or the model's own plan; the proposal is then not shown on its own.
            resized: The refused plan's groups sized to the goal (`resize.Resized.text`), shown first ('': none).
        """
        header = "Your plan was refused:" if parsed else "Your answer could not be used:"
        lines = "\n".join(f"- {r}" for r in reasons)
        tools = TOOLS_LEFT if tools_left else ""
        shown = f"{resized}\n" if resized else ""
        if offered:
            numbers = self._numbers(estimate, parsed)
            which = "that plan, one of the alternatives by its label" if resized else "one of them by its label"
            return REPAIR_CHOICE.format(
                header=header, reasons=lines, numbers=numbers, resized=shown, offered=offered, which=which, tools=tools
            )
        found = self.proposal()
        plan = found.plan.wire() if found is not None else None
        if not plan:
            return None
        numbers = self._numbers(estimate, parsed)
        theirs = _pct(found.predicted_reduction.get(self.target)) if found is not None else None
        proposal_numbers = f"predicted to remove {theirs} of the {self.target}" if theirs else "no estimate"
        return REPAIR_PROPOSAL.format(
            header=header,
            reasons=lines,
            numbers=numbers,
            proposal_numbers=proposal_numbers,
            proposal=json.dumps(plan),  # one line: fewer tokens for a slow local server
            resized=shown,
            which="either plan" if resized else "this plan",
            it="one" if resized else "it",
            tools=tools,
        )

    def _numbers(self, estimate: dict[str, float], parsed: bool) -> str:
        mine = _pct(estimate.get(self.target))
        if mine:
            return f"Your plan is predicted to remove {mine} of the {self.target}."
        return (
            "Your plan was refused before it could be sized."
            if parsed
            else "It is not a plan in the required JSON format."
        )


def answer_key(text: str) -> str:
    """Return what makes two answers the same plan: entries' groups or layer, type, ratio, dtype (no prose).

    An answer that does not parse is keyed by its whitespace-normalized text.
    """
    try:
        raw, _ = parse_plan_text(text)
    except ValueError:
        return "text:" + " ".join(text.split())
    keep = ("groups", "layer", "type", "ratio", "dtype")
    entries = {
        kind: sorted(
            json.dumps({k: e.get(k) for k in keep if k in e}, sort_keys=True)
            for e in raw.get(kind) or []
            if isinstance(e, dict)
        )
        for kind in ("pruning", "quantization")
    }
    return "plan:" + json.dumps(entries, sort_keys=True)


def repeated_reason(first_reason: str) -> str:
    """Return the fallback reason of a turn ended because an answer repeated a refused plan."""
    return REPEATED.format(reason=first_reason[:200])
