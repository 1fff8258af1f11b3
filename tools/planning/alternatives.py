"""Measured alternatives a small model can choose among: labelled plans at the round's goal, the choice read back."""

from __future__ import annotations

import dataclasses
import json
import logging
from dataclasses import dataclass, field
from typing import Any

from profiling_agent.state import CompressionPlan, GroupRow, PlannerProfile, PlanningProblem, QuantEntry, TokenAxis
from profiling_agent.tools.planning.json_extract import find_object
from profiling_agent.tools.planning.plan_guard import GuardConfig, check_plan
from profiling_agent.tools.planning.plan_parse import normalize_plan
from profiling_agent.tools.planning.proposal import DEFAULT_LABEL, Proposal, ProposedPlan, propose
from profiling_agent.tools.planning.token_plan import TokenOption
from profiling_agent.tools.planning.trials import Evaluate

logger = logging.getLogger(__name__)

LABELS = "ABCDE"
OWN = "own"  # the choice of an answer that writes its own plan
# trials of the alternatives run only on models this small (a trial prunes a copy and runs the trial slice)
CHEAP_TRIAL_PARAMS = 25_000_000
CHOICE_FORM = '{"choice": "<label>", "why": "<one sentence>"}'  # no label of its own: a copy would be no choice
OFFER_HEADER = (
    "Measured alternatives at this round's goal (predicted reduction of the params and the latency from the group "
    "cost shares; loss: top-1 accuracy lost on the trial images, pp, where a trial measured it):"
)
OFFER_FOOTER = (
    "Your JSON plan may name one of them instead of writing its entries: answer "
    + CHOICE_FORM
    + ". To edit the chosen plan, add to that object "
    '"pruning" entries (they override its entries for the same groups), a "quantization" list or a "tokens" '
    'entry. Or write your own plan with "choice": "' + OWN + '".'
)


@dataclass
class Alternative:
    """One labelled plan offered beside the deterministic proposal, with its predicted numbers."""

    label: str
    name: str
    plan: ProposedPlan  # the plan, exact group names
    record: Proposal  # its ratios and estimate, for the comparison with the applied plan
    loss_pp: float | None = None  # trial-slice loss, pp (None: not measured)
    measured: str = "not measured"  # where the loss comes from

    def line(self, target: str) -> str:
        """Return the alternative in the prompt's compact form: label, name, numbers, ratios per group."""
        numbers = numbers_text(self.record.estimate, target, self.loss_pp, self.measured)
        by_ratio: dict[float, list[str]] = {}
        for group, ratio in self.record.ratios.items():
            by_ratio.setdefault(ratio, []).append(group)
        ratios = "; ".join(f"{', '.join(names)} at {ratio:g}" for ratio, names in by_ratio.items()) or "no pruning"
        tokens = self.plan.tokens
        merges = None if tokens is None else tokens.rate if tokens.rate is not None else tokens.schedule
        extra = [f"merge tokens {merges}"] if tokens is not None else []
        extra += [f"quantization {', '.join(self.record.quantization)}"] if self.record.quantization else []
        return f"{self.label} ({self.name}): {numbers}\n   prune {ratios}" + "".join(f"; {x}" for x in extra)


def numbers_text(estimate: dict[str, float], target: str, loss_pp: float | None, measured: str) -> str:
    """Return an offered plan's numbers as the prompt shows them: its predicted reductions, then its trial loss."""
    keys = dict.fromkeys((target, "params", "latency"))
    shares = ", ".join(f"{k} -{float(estimate.get(k, 0.0)):.1%}" for k in keys)
    loss = f"loss {loss_pp:.2f} pp ({measured})" if loss_pp is not None else f"loss {measured}"
    return f"{shares}, {loss}"


@dataclass
class Offer:
    """The alternatives of one planning step, and the reading of an answer that chooses one by label."""

    alternatives: list[Alternative] = field(default_factory=list)

    def labels(self) -> list[str]:
        """Return the labels offered."""
        return [a.label for a in self.alternatives]

    def get(self, label: str | None) -> Alternative | None:
        """Return the alternative of `label`, or None."""
        return next((a for a in self.alternatives if a.label == label), None)

    def text(self, target: str) -> str:
        """Return the prompt's section that offers the alternatives ('' when there are none)."""
        if not self.alternatives:
            return ""
        return "\n".join([OFFER_HEADER, *(a.line(target) for a in self.alternatives), OFFER_FOOTER])

    def resolve(self, text: str) -> tuple[dict[str, Any], list[str], dict[str, str]] | None:
        """Read an answer that chooses an alternative: the plan it stands for, notes and the choice.

        The chosen plan's pruning entries come first and the answer's own entries after them (later entries
        override earlier ones); an answer's quantization list or tokens entry replaces the alternative's.

        Returns:
            (the plan dict, notes, {"label", "why"}), or None when the answer chooses nothing (or "own").

        Raises:
            ValueError: The answer chooses a label that was not offered.
        """
        if not self.alternatives:
            return None
        try:
            found = find_object(text, _choice_shaped, "choice", CHOICE_FORM).value
        except ValueError:
            return None
        label = str(found["choice"]).strip().strip(".").upper() if str(found["choice"]).lower() != OWN else OWN
        if label == OWN:
            return None
        chosen = self.get(label)
        if chosen is None:
            raise ValueError(
                f"choice {str(found['choice'])[:20]!r} is not one of the alternatives {', '.join(self.labels())} "
                f'(or "{OWN}" with a plan of your own)'
            )
        plan = chosen.plan.wire()
        edits = [e for e in found.get("pruning") or [] if isinstance(e, dict)]
        plan["pruning"] = [*plan.get("pruning", []), *edits]
        if isinstance(found.get("quantization"), list) and found["quantization"]:
            plan["quantization"] = found["quantization"]
        if "tokens" in found:
            plan["tokens"] = found["tokens"]
        normalized, notes = normalize_plan(plan)
        why = found.get("why") if isinstance(found.get("why"), str) else ""
        return normalized, notes, {"label": label, "why": str(why)[:300]}


def _choice_shaped(value: dict[str, Any]) -> dict[str, Any] | None:
    return value if isinstance(value.get("choice"), str) else None


@dataclass
class OfferInputs:
    """What the alternatives are made from: the round's profile, probe, objective, goal and measurements.

    Attributes:
        profile: The profile (groups, group_costs, totals), as the guard checks a plan against it.
        problem: The round's planning problem (the groups' rows, the objective) the alternatives are planned from.
        goal: The round's goal (the deterministic planner's).
        quantization: The quantization entries every alternative carries (the deterministic plan's).
        merging: The token merging the deterministic plan installs (None: it merges nothing).
        token_axis: The run's token axis (an alternative merges where a measured row pays).
        default_loss: The trial-slice loss this round already measured for the deterministic plan, pp.
        evaluate: The trial evaluator (a plan -> its trial on the trial slice), or None.
    """

    profile: PlannerProfile
    problem: PlanningProblem
    goal: float
    quantization: list[QuantEntry]
    merging: TokenOption | None = None
    token_axis: TokenAxis | None = None
    default_loss: float | None = None
    evaluate: Evaluate | None = None


Variant = tuple[str, list[GroupRow], TokenOption | None, str]  # (name, group rows, merging, emphasis)
# a model with one kind of width unit (a CNN's channels) splits no axis: its alternatives weigh cost against damage
EMPHASIS_VARIANTS = (
    ("costliest groups harder", "cost"),
    ("sensitive groups spared", "sensitivity"),
)


def _variants(inputs: OfferInputs) -> list[Variant]:
    """Return (name, group rows, merging, emphasis) of each alternative: the default first, then one axis at a time.

    A model whose groups are of one kind gets the deterministic planner's other emphases instead of per-kind plans.
    """
    groups, merging = list(inputs.problem.rows), inputs.merging
    kinds = {r.kind for r in groups}
    out: list[Variant] = [("default: the deterministic proposal", groups, merging, "balanced")]
    widths = [r for r in groups if r.kind != "block"]
    if "structured" in kinds and "head" in kinds:
        out.append(("MLP channels only", [r for r in groups if r.kind == "structured"], merging, "balanced"))
        out.append(("attention heads only", [r for r in groups if r.kind == "head"], merging, "balanced"))
    if "block" in kinds:
        out.append(("whole blocks only", [r for r in groups if r.kind == "block"], merging, "balanced"))
        out.append(("widths only, no whole blocks", widths, merging, "balanced"))
    if len(kinds) == 1:
        out += [(name, groups, merging, emphasis) for name, emphasis in EMPHASIS_VARIANTS]
    axis = inputs.token_axis
    paying = axis.paying() if axis is not None else []
    if merging is not None:
        out.append(("no token merging", groups, None, "balanced"))
    elif paying and axis is not None:
        best = max(paying, key=lambda r: r.saved_share)
        out.append(("token merging where it pays", groups, TokenOption.of(best, axis.form), "balanced"))
    return out


def offer_alternatives(inputs: OfferInputs, guard: GuardConfig) -> Offer:
    """Return up to len(LABELS) distinct plans at the goal the guard accepts, labelled, the default first.

    The default's loss is the round's own trial of the deterministic plan; another alternative gets a trial of its
    own only when an evaluator is given and the model is small (CHEAP_TRIAL_PARAMS).
    """
    profile, offer, seen = inputs.profile, Offer(), set()
    cheap = cheap_trials(profile)
    for name, groups, merging, emphasis in _variants(inputs):
        if len(offer.alternatives) >= len(LABELS) or not groups:
            continue
        try:
            problem = inputs.problem.model_copy(update={"rows": groups})
            plan, record = propose(problem, inputs.goal, emphasis, inputs.quantization, merging)
        except Exception:  # noqa: BLE001 - an alternative that cannot be planned is not offered
            logger.debug("alternative %s not planned", name, exc_info=True)
            continue
        wire = plan.wire()  # the plan as the LLM would write it, which the guard reads
        key = json.dumps([record.ratios, wire.get("tokens")], sort_keys=True)
        guarded = _guarded(wire, profile, guard) if record.ratios and key not in seen else None
        if guarded is None:
            continue
        seen.add(key)
        label = LABELS[len(offer.alternatives)]
        alt = Alternative(label, name, plan, record.model_copy(update={"label": label, "name": name}))
        _measure(alt, guarded, inputs, cheap)
        offer.alternatives.append(alt)
    return offer


def cheap_trials(profile: PlannerProfile) -> bool:
    """Return whether the model is small enough for trials of plans beyond the round's own (CHEAP_TRIAL_PARAMS)."""
    return int(profile.totals.get("params") or 0) <= CHEAP_TRIAL_PARAMS


def _guarded(plan: dict[str, Any], profile: PlannerProfile, guard: GuardConfig) -> CompressionPlan | None:
    verdict = check_plan(plan, profile, without_floor(guard))  # the floor is for plans the model writes
    return verdict.plan if verdict.ok else None


def without_floor(guard: GuardConfig) -> GuardConfig:
    """Return `guard` without the round-1 floor: an offered alternative (chosen or edited) is never under it."""
    return dataclasses.replace(guard, min_share_of_target=0.0)


def _measure(alt: Alternative, guarded: CompressionPlan, inputs: OfferInputs, cheap: bool) -> None:
    if alt.label == DEFAULT_LABEL and inputs.default_loss is not None:
        alt.loss_pp, alt.measured = float(inputs.default_loss), "this round's trial of the deterministic plan"
        return
    alt.loss_pp, alt.measured = trial_loss(guarded, inputs.evaluate, cheap)


def trial_loss(plan: CompressionPlan, evaluate: Evaluate | None, cheap: bool) -> tuple[float | None, str]:
    """Return a guarded plan's trial-slice loss (pp) and where it comes from; None when it was not measured.

    Args:
        plan: The plan in the guard's form (layer regexes).
        evaluate: The trial evaluator, or None (no trials this round).
        cheap: Whether the model is small enough for an extra trial (CHEAP_TRIAL_PARAMS).
    """
    if evaluate is None or not cheap:
        return None, "not measured" if evaluate is None else "not measured (trials skipped: a large model)"
    try:
        return float(evaluate(plan).accuracy_drop_pp), "trial"
    except Exception as exc:  # noqa: BLE001 - a failed trial leaves the loss unmeasured
        return None, f"not measured (trial failed: {str(exc)[:80]})"
