"""The planners' own currency: a trial of a plan (`Trial`) and an earlier round as the planners read it (`PastRound`).

Neither is held in the graph's state: a trial's facts are recorded through `plans.BackoffTrial`, `SearchTrial` and
`BlockTrial`, and the rounds are rebuilt from the candidates each time (`tools/planning/history.py`).
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from profiling_agent.schemas.base import Strict

# what the LLM's evaluate_plan tool does not show (it reads the measured loss, not how the trial was run)
_NOT_FOR_LLM = {"recovery", "seconds"}


class Trial(Strict):
    """A plan tried on a fresh copy of the baseline and judged on the trial slice (`trials.PlanEvaluator`).

    The accuracy names are the ones the planners have always read (`calib_accuracy`, ...): `judged_on` says which
    images they are.
    """

    kl_to_baseline: float | None = Field(default=None, description="Mean KL of its logits from the baseline's.")
    images: int = Field(default=0, description="Trial-slice images it was judged on.")
    judged_on: str = Field(default="", description="Which images those are.")
    calib_accuracy: float | None = Field(default=None, description="Its top-1 on the trial slice, %.")
    baseline_calib_accuracy: float | None = Field(default=None, description="The baseline's top-1 there, %.")
    accuracy_drop_pp: float = Field(description="Top-1 points it lost on the trial slice (its loss).")
    interval_pp: list[float] | None = Field(default=None, description="The loss's paired 95% interval [low, high].")
    agreement: float | None = Field(default=None, description="Percent of predictions equal to the baseline's.")
    params: int | None = Field(default=None, description="Parameters left.")
    params_reduction: float | None = Field(default=None, description="Parameters removed, fraction.")
    groups_pruned: int | None = Field(default=None, description="Groups whose units changed.")
    quantized_linear_layers: int | None = Field(default=None, description="Linear layers quantized.")
    evaluations_left: int | None = Field(default=None, description="Trials the evaluator may still run.")
    recovery: str = Field(default="", description="What the trial did after pruning: none, refit, refit+distill.")
    seconds: float | None = Field(default=None, description="Wall-clock seconds the trial took.")

    def bounds(self) -> list[float]:
        """Return the loss's interval [low, high], pp ([loss, loss] when the trial gave none)."""
        drop = float(self.accuracy_drop_pp)
        return [float(x) for x in self.interval_pp or (drop, drop)]

    def for_llm(self) -> dict[str, Any]:
        """Return what the evaluate_plan tool shows the LLM: the measured facts, unset ones left out."""
        return self.model_dump(exclude=_NOT_FOR_LLM, exclude_none=True)


class VariantSummary(Strict):
    """One backend form of an earlier round, as the planners read it."""

    name: str | None = None
    status: str | None = None
    accuracy: float | None = None
    speedup: float | None = None
    speedup_batch: float | None = None
    size_mb: float | None = None


class PastRound(Strict):
    """An earlier round as the planners read it (`history.planner_history`): its goal and whether it kept the budget."""

    iteration: int = Field(default=0, description="The round (0: unknown).")
    goal: float = Field(description="Estimated reduction of the target the round's plan aimed at.")
    gamma: float | None = Field(default=None, description="The sensitivity exponent the deterministic planner used.")
    passed: bool = Field(description="It kept the accuracy budget on validation.")
    rejected: bool = Field(default=False, description="A reviewer said no (a recovered trial that missed is a miss).")
    drop: float | None = Field(default=None, description="Validation loss after recovery, pp (a missed trial's: its).")
    predicted_drop: float | None = Field(default=None, description="The plan's trial on the trial slice, pp.")
    blocks: list[str] = Field(default_factory=list, description="Removed blocks' plan patterns (`^module$`).")
    width: bool = Field(default=False, description="It pruned channels or heads too.")
    quant_speedup: float | None = Field(default=None, description="Pruned fp32 latency / quantized, batch 1.")
    quant_speedup_batch: float | None = Field(default=None, description="The same at batch N.")
    delivered: str | None = Field(default=None, description="The form delivered.")
    variants: list[VariantSummary] = Field(default_factory=list, description="Its backend forms.")
