"""Compression plans (the paper's Figure 4) and what the planners record about a round: LLM step, trials, review."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, ConfigDict, Field, model_serializer, model_validator, with_config
from typing_extensions import TypedDict

from profiling_agent.schemas.base import Strict
from profiling_agent.schemas.settings import BackendChoice, PruneType, QuantDtype, StructuredChoice, StructuredMode

MAX_REGEX_LEN = 200


def _short_regex(value: str) -> str:
    if not value or len(value) > MAX_REGEX_LEN:
        raise ValueError(f"layer regex must have 1..{MAX_REGEX_LEN} characters")
    return value


LayerPattern = Annotated[str, AfterValidator(_short_regex)]


class PruneEntry(Strict):
    """Prune the prunable groups whose module name matches `layer` (re.search) by `ratio`."""

    layer: LayerPattern = Field(description="Regular expression searched in module names, e.g. 'layers\\.(2|3)\\.mlp'.")
    type: PruneType = Field(description="structured: conv/MLP channels; head: attention heads; block: a whole block.")
    ratio: float = Field(gt=0.0, le=1.0, description="Fraction of channels or heads removed per group; 1.0: a block.")
    justification: str = Field(default="", description="Why, grounded in the profile.")

    @model_validator(mode="after")
    def _whole_blocks(self) -> PruneEntry:
        if (self.type == "block") != (self.ratio == 1.0):  # a block goes whole; channels and heads never all go
            must = "1.0 (a block is removed whole)" if self.type == "block" else "below 1.0 (type 'block' removes one)"
            raise ValueError(f"a {self.type} entry's ratio must be {must}, not {self.ratio:g}")
        return self


class QuantEntry(Strict):
    """Dynamically quantize the nn.Linear layers matched by `layer` ('all' or a regex)."""

    layer: LayerPattern = Field(default="all", description="'all' or a regular expression searched in module names.")
    type: Literal["dynamic"] = Field(default="dynamic", description="Post-training dynamic quantization.")
    dtype: QuantDtype = Field(default="qint8", description="Weight dtype.")
    justification: str = Field(default="", description="Why, grounded in the profile.")


class TokenEntry(Strict):
    """Merge tokens (ToMe) after each transformer layer's attention: one `rate` for every layer or a `schedule`.

    Only ViT and DeiT have a token axis (`tools/compression/token_merge.py`); the merge is installed after pruning.
    """

    type: Literal["tokens"] = Field(default="tokens", description="Token merging (ViT, DeiT).")
    rate: int | None = Field(default=None, ge=0, description="Tokens merged after every layer (capped per layer).")
    schedule: list[int] | None = Field(default=None, description="Tokens merged after each layer, one r per layer.")
    justification: str = Field(default="", description="Why, grounded in the measured latency and damage.")

    @model_validator(mode="after")
    def _one_form(self) -> TokenEntry:
        if (self.rate is None) == (self.schedule is None):
            raise ValueError('a tokens entry needs exactly one of "rate" (one r) and "schedule" (r per layer)')
        if self.schedule is not None and any(r < 0 for r in self.schedule):
            raise ValueError(f"every r of a token schedule must be >= 0, got {self.schedule}")
        return self

    @model_serializer(mode="wrap")
    def _written(self, handler: Any) -> dict[str, Any]:
        """Leave out the form the entry does not use (rate or schedule)."""
        return {k: v for k, v in handler(self).items() if v is not None or k not in ("rate", "schedule")}

    def label(self) -> str:
        """Return the entry in a few words: "rate 4" or "schedule [8, 8, 4, 0]"."""
        return f"rate {self.rate}" if self.rate is not None else f"schedule {self.schedule}"


def one_module(pattern: str) -> bool:
    """Return whether a layer pattern names exactly one module name: `^` + re.escape(name) + `$`."""
    body = pattern[1:-1] if pattern.startswith("^") and pattern.endswith("$") else None
    return body is not None and re.escape(re.sub(r"\\(.)", r"\1", body)) == body


class CompressionPlan(Strict):
    """A layer-wise compression plan, as in the paper's Figure 4."""

    pruning: list[PruneEntry] = Field(default_factory=list, description="Later entries override earlier ones.")
    quantization: list[QuantEntry] = Field(default_factory=list, description="Applied after pruning.")
    rationale: str = Field(default="", description="One paragraph on the plan as a whole.")
    tokens: TokenEntry | None = Field(default=None, description="Token merging, installed after pruning (ViT, DeiT).")

    @model_serializer(mode="wrap")
    def _written(self, handler: Any) -> dict[str, Any]:
        """Leave `tokens` out of a plan without it, so plans that merge nothing read as they always did."""
        return {k: v for k, v in handler(self).items() if k != "tokens" or v is not None}

    def effect(self) -> dict[str, Any]:
        """Return what the plan does, its words aside: the entries without their justifications, no rationale.

        Pruning entries that each name one module (`^name$`, as the planners write them) cannot override each
        other, so their order says nothing: they are sorted. Entries with wider patterns keep their order.
        """
        words = {"__all__": {"justification"}}
        dump = self.model_dump(
            exclude={"rationale": True, "pruning": words, "quantization": words, "tokens": {"justification"}}
        )
        layers = [e["layer"] for e in dump["pruning"]]
        if len(set(layers)) == len(layers) and all(one_module(p) for p in layers):
            dump["pruning"] = sorted(dump["pruning"], key=lambda e: e["layer"])
        return dump


# ---------------------------------------------------------------- what the planners record


@with_config(ConfigDict(extra="forbid"))
class GivenUpMode(TypedDict, total=False):
    """A structured-output mode the server refused or ignored, and why."""

    mode: StructuredMode
    why: str


@with_config(ConfigDict(extra="forbid"))
class StructuredFacts(TypedDict, total=False):
    """The structured-output mode asked for, the one used, and the ones given up (`planning/structured.py`)."""

    choice: StructuredChoice
    mode: StructuredMode
    confirmed: bool
    given_up: list[GivenUpMode]


@with_config(ConfigDict(extra="forbid"))
class RejectedAnswer(TypedDict, total=False):
    """An LLM answer the planner refused: at which stage, why, the answer (cut) and the structured mode."""

    stage: str
    reasons: list[str]
    answer: str
    structured: StructuredMode


class LLMStep(Strict):
    """What one LLM planning step did (never the API key): its model, outcome, transcript and token usage."""

    model: str = Field(default="", description="The chat model.")
    planner: str = Field(default="", description="llm, or deterministic when the LLM's plan was refused.")
    transcript: str | None = Field(default=None, description="The step's JSONL transcript, relative to the run.")
    usage: dict[str, int] = Field(default_factory=dict, description="calls, input/output/total tokens.")
    tool_errors: list[dict[str, str]] = Field(default_factory=list, description="Tool calls refused or failed.")
    structured: StructuredFacts = Field(
        default_factory=StructuredFacts, description="Structured-output mode tried and found."
    )
    vs_proposal: str | None = Field(default=None, description="The applied plan against the proposal, in words.")
    applied: str = Field(
        default="", description="applied, chosen, edited, copied or replaced (the LLM's plan), and why."
    )
    tools_dropped: str | None = Field(
        default=None,
        description="Why this step stopped offering tools (the model's first answer could not use them): the rest "
        "of the run asks for schema-constrained answers without tools.",
    )


class ProposalDiff(Strict):
    """What the LLM's applied plan changed relative to the closest proposal it was offered this step.

    verdict: "copied" (no change to the deterministic proposal), "chosen" (another offered alternative, unchanged),
    "resized" (the groups of the model's own refused plan at the ratios a repair offered for the goal, unchanged),
    "edited" (at most one change per proposed group), "own" (more, or no proposal was asked for: the plan is
    entirely the LLM's). `choice` names the alternative the answer chose by label (or the closest one it copied).
    """

    verdict: Literal["copied", "chosen", "resized", "edited", "own"] = Field(
        description="copied, chosen, resized, edited or own."
    )
    changes: int = Field(default=0, description="Groups added or removed, ratios changed, quantization changed.")
    proposals: int = Field(default=0, description="Proposals the LLM asked for in this step.")
    offered: int = Field(default=0, description="Alternatives the prompt offered in this step (chosen by label).")
    goal: float | None = Field(default=None, description="Goal of the proposal compared against.")
    emphasis: str | None = Field(default=None, description="Emphasis of that proposal.")
    added: list[str] = Field(default_factory=list, description="Groups the LLM pruned that the proposal did not.")
    removed: list[str] = Field(default_factory=list, description="Proposed groups the LLM left unpruned.")
    ratios: dict[str, list[float]] = Field(default_factory=dict, description="Group -> [proposed, LLM's] ratio.")
    quantization: str = Field(default="", description="How quantization changed ('' when it did not).")
    choice: str | None = Field(default=None, description="Label of the offered alternative compared against.")
    alternative: str | None = Field(default=None, description="What that alternative is, in words.")
    why: str = Field(default="", description="The LLM's reason for its choice, as it wrote it.")

    def label(self) -> str:
        """Return "copied", "chosen alternative B", "resized: ...", "edited (n changes)" or "own" for the tables."""
        if self.verdict == "chosen":
            return f"chosen alternative {self.choice}"
        if self.verdict == "resized":
            return "resized: its own groups at the goal's ratios"
        if self.verdict == "edited":
            edited = f"edited ({self.changes} changes)"
            return f"{edited} from alternative {self.choice}" if self.choice else edited
        return self.verdict


class BackoffTrial(Strict):
    """One round-1 trial of a whole plan on the calibration images (`planning/backoff.py`)."""

    goal: float = Field(description="The goal the plan was made for.")
    calib_drop_pp: float = Field(description="Calibration accuracy lost, pp.")
    params_reduction: float | None = Field(default=None, description="Parameters removed, fraction.")


class BackoffRecord(Strict):
    """Round 1's back-off: the goal kept, the calibration drop allowed, and the trials that chose it."""

    cap_pp: float = Field(description="Largest calibration accuracy drop accepted, pp.")
    kept_goal: float = Field(description="The goal round 1 planned for.")
    trials: list[BackoffTrial] = Field(default_factory=list, description="The trials, the planner's own goal first.")


class SearchTrial(Strict):
    """One calibration trial of a searching round (`planning/search.py`)."""

    goal: float = Field(description="The goal the plan was made for.")
    predicted_pp: float = Field(description="Calibration accuracy lost, pp.")
    corrected_pp: float = Field(description="That loss times the correction, pp.")


class SearchRecord(Strict):
    """A searching round: the measured interval, the correction of the trials' loss, the trials and the goal."""

    goal: float = Field(description="The goal planned for.")
    interval: list[float] = Field(description="[largest goal that kept the budget, smallest that missed it].")
    correction: float = Field(description="Validation loss / calibration trial loss, from the rounds so far.")
    cap_pp: float = Field(description="The calibration loss a trial may show, pp.")
    trials: list[SearchTrial] = Field(default_factory=list, description="The calibration trials.")
    why: str = Field(default="", description="One sentence for the plan's rationale.")


class BlockTrial(Strict):
    """One block set tried in round 1 (`planning/block_trials.py`): pruned, refit and briefly distilled."""

    blocks: list[str] = Field(description="The block groups removed.")
    estimate: float = Field(description="Estimated reduction of the plan.")
    width_groups: int = Field(description="Width groups pruned beside the blocks.")
    kl: float | None = Field(description="Mean KL of the trial's logits from the baseline's (None: it failed).")
    calib_drop_pp: float | None = Field(default=None, description="Calibration accuracy lost, pp (when it ran).")
    error: str | None = Field(default=None, description="Why the trial failed.")

    @model_serializer(mode="wrap")
    def _written(self, handler: Any) -> dict[str, Any]:
        """Leave out calib_drop_pp of a failed trial and error of one that ran, as the trials record them."""
        return {k: v for k, v in handler(self).items() if v is not None or k not in ("calib_drop_pp", "error")}


class TokenChoice(Strict):
    """Round 1's weighing of token merging against pruning alone (`planning/token_plan.py`), on the trial slice."""

    rate: int | None = Field(description="The merging rate weighed (None: the front-loaded schedule below).")
    schedule: list[int] | None = Field(default=None, description="The front-loaded schedule weighed, when no rate.")
    saved_share: float = Field(description="Share of the planned form's latency it saved, measured.")
    drop_pp: float = Field(description="The merged baseline's trial-slice loss, pp.")
    with_pp: float | None = Field(default=None, description="The plan with merging: trial-slice loss, pp.")
    without_pp: float | None = Field(default=None, description="The plan pruning alone: trial-slice loss, pp.")
    chosen: bool = Field(description="The plan merges tokens.")
    why: str = Field(default="", description="In words.")


class PlannerMeta(Strict):
    """What the planner aimed at in a round (later rounds learn from it)."""

    goal: float | None = Field(default=None, description="Estimated reduction of the target the plan aimed at.")
    gamma: float | None = Field(default=None, description="Sensitivity exponent of the deterministic planner.")
    converged: bool = Field(default=False, description="The deterministic planner had nothing new to try.")
    llm: LLMStep | None = Field(default=None, description="The LLM step's facts (model, usage, transcript).")
    vs_proposal: ProposalDiff | None = Field(default=None, description="LLM plan vs the closest proposal.")
    turn: str | None = Field(default=None, description="With an LLM: llm, or reference (the deterministic sequence).")
    baseline: str | None = Field(default=None, description="The uniform baseline planner (l1, l2, random).")
    ratio: float | None = Field(default=None, description="The uniform baseline's ratio.")
    backoff: BackoffRecord | None = Field(default=None, description="Round 1's trials (goal, drop) and their cap.")
    predicted_drop: float | None = Field(default=None, description="The plan's trial-slice loss, pp.")
    predicted_interval: list[float] | None = Field(default=None, description="Its paired 95% interval [lo, hi], pp.")
    expected_drop: float | None = Field(
        default=None,
        description="Validation's loss expected after recovery: the trial corrected by earlier rounds (or, in round 1, "
        "by the recovery prior when recovery distills), pp.",
    )
    expected_interval: list[float] | None = Field(default=None, description="The trial's interval so corrected, pp.")
    correction: list[float] | None = Field(default=None, description="[additive pp, multiplicative] applied.")
    search: SearchRecord | None = Field(default=None, description="Searching round: interval, correction, trials.")
    block_trials: list[BlockTrial] | None = Field(default=None, description="Round 1's block sets tried.")
    tokens: TokenChoice | None = Field(default=None, description="Token merging weighed against pruning alone.")


class Review(Strict):
    """A human decision on a plan (objective.approve)."""

    decision: Literal["approve", "reject", "edit"]
    proposed_by: str = Field(description="Planner that proposed the plan.")
    estimate: dict[str, float] | None = Field(default=None, description="Estimated reductions of an edited plan.")


class Fallback(Strict):
    """A round whose LLM plan was refused, and why (the deterministic plan was applied instead)."""

    iteration: int = Field(default=0, description="The round.")
    stage: str = Field(description="parse, guard, timeout, error or tool_loop.")
    reason: str = Field(description="What was wrong.")
    rejected: list[RejectedAnswer] = Field(default_factory=list, description="The refused answers and reasons.")
    tool_errors: list[dict[str, str]] = Field(default_factory=list, description="Tool calls refused or failed.")
    model: str = Field(default="", description="The LLM.")


class PlannerMode(Strict):
    """How the objective's planner choice resolved against the configuration."""

    requested: str = Field(description="The objective's planner (auto, llm, deterministic, l1/l2/random).")
    mode: str = Field(description="What plans the rounds: llm (beside the deterministic reference) or that planner.")
    note: str = Field(default="", description="Why, in words (the endpoint, or the missing setting).")


class BudgetPlan(Strict):
    """How a run fits its time budget: the knobs it plans the remaining steps with and what it cut to fit."""

    budget_s: float = Field(description="The time budget, seconds.")
    spent_s: float = Field(default=0.0, description="Seconds the finished steps took (a resume counts them).")
    expected_s: float = Field(default=0.0, description="Seconds the remaining steps are expected to take.")
    rounds: int = Field(description="Pruning rounds the run may finish in all.")
    trials: int = Field(description="Calibration trials of a searching round.")
    recover_minutes: float = Field(description="Cap of one candidate's distillation, minutes.")
    backend: BackendChoice = Field(description="Backend whose forms are built (auto: every form).")
    cuts: list[str] = Field(default_factory=list, description="What the run cut to fit, in the order it cuts.")
    cut: list[str] = Field(default_factory=list, description="The knobs cut: trials, recovery, forms, rounds.")
