"""The run's inputs, what to compress and how to judge it: the model, the dataset and the objective."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, Field, model_validator

from profiling_agent.schemas.base import Ref, Strict
from profiling_agent.schemas.settings import (
    BASELINE_PLANNERS,
    EMBEDDED_DATASET,
    EMBEDDED_MODEL,
    PlannerChoice,
    QuantizeChoice,
    SelectRule,
    TargetMetric,
)


def _subset_size(value: int) -> int:
    if 0 < value < 8:
        raise ValueError("Input should be 0 (the whole split) or at least 8")
    return value


class ModelRef(Ref):
    """Which model to compress."""

    ref: str = Field(default=EMBEDDED_MODEL, description="Hub id, save_pretrained/artifact folder, embedded:NAME.")
    revision: str | None = Field(default=None, description="Hub revision (branch, tag or commit).")
    trust_remote_code: bool = Field(default=False, description="Allow custom modelling code from the hub.")


class DatasetRef(Ref):
    """Which labelled images to evaluate on."""

    ref: str = Field(default=EMBEDDED_DATASET, description="Hub id, save_to_disk or imagefolder, embedded:digits.")
    split: str = Field(default="test", description="Split to evaluate on (validation and, by default, test images).")
    subset: Annotated[int, AfterValidator(_subset_size)] = Field(
        default=512, ge=0, le=10_000_000, description="Seeded validation subset the loop selects on (0: all rows left)."
    )
    test_subset: int = Field(
        default=512, ge=8, le=1_000_000, description="Held-out test subset: only the baseline and delivered model."
    )
    test_split: str | None = Field(default=None, description="Test images' split (default: evaluated or `test`).")
    calibration: int = Field(default=64, ge=4, le=10_000, description="Probe and refit images (unused rows).")
    train_split: str | None = Field(default=None, description="Recovery's split (default: `train`, else unused rows).")
    image_column: str | None = Field(default=None, description="Image column; detected when omitted.")
    label_column: str | None = Field(default=None, description="Label column; detected when omitted.")
    seed: int = Field(default=0, description="Seed for the subset and every random choice.")
    allow_weak_eval: bool = Field(default=False, description="Run on data that cannot judge (one class, few images).")


class Objective(Strict):
    """What the run optimizes and the rule that picks the best candidate."""

    max_acc_drop: float = Field(default=2.0, ge=0.0, le=100.0, description="Largest accepted top-1 drop, in pp.")
    target: TargetMetric = Field(default="params", description="Metric the `budget` rule reduces.")
    target_reduction: float = Field(default=0.4, gt=0.0, lt=1.0, description="Reduction of `target` that succeeds.")
    select: SelectRule = Field(
        default="budget",
        description="paper: highest accuracy, then fewer params, then lower latency. budget: largest "
        "reduction of `target` among candidates within max_acc_drop.",
    )
    iterations: int = Field(default=5, ge=1, le=50, description="Upper bound on pruning iterations.")
    beyond_target: int = Field(
        default=1,
        ge=0,
        le=49,
        description="Rounds that may push past a met target while the best model left half the accuracy budget "
        "unused (0: stop at the target).",
    )
    quantize: QuantizeChoice = Field(default="qint8", description="Dynamic quantization added to each plan.")
    planner: PlannerChoice = Field(default="auto", description="deterministic, llm, auto, or l1/l2/random + ratio.")
    ratio: float | None = Field(
        default=None, gt=0.0, lt=1.0, description="Uniform ratio of the l1/l2/random baselines (required by them)."
    )
    approve: bool = Field(default=False, description="Pause before each plan: approve, edit or reject it.")
    depth: bool | None = Field(default=None, description="Remove whole blocks too (None: under a latency target).")
    time_budget: float | None = Field(
        default=None,
        gt=0.0,
        le=100_000.0,
        description="Wall-clock minutes the whole run may take (None: no bound); the run cuts trials, recovery, "
        "forms, then rounds to fit, and says what it cut.",
    )

    def prunes_depth(self) -> bool:
        """Return whether the planners may remove whole blocks (`depth`; None: only under a latency target)."""
        return self.target == "latency" if self.depth is None else self.depth

    @model_validator(mode="after")
    def _baseline_ratio(self) -> Objective:
        if self.planner in BASELINE_PLANNERS and self.ratio is None:
            raise ValueError(f"planner {self.planner} needs a ratio in (0, 1)")
        if self.ratio is not None and self.planner not in BASELINE_PLANNERS:
            raise ValueError(f"ratio applies only to the planners {', '.join(BASELINE_PLANNERS)}")
        return self
