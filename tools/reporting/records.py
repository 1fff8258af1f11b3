"""The finished run's records a report is built from: typed as the state holds them, and nothing else."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from profiling_agent.state import (
    ArtifactRef,
    Best,
    Candidate,
    DataRef,
    DatasetRef,
    EvalRecord,
    Fallback,
    HistoryEvent,
    InputShape,
    LabelMap,
    ModelRef,
    Objective,
    ProfileSummary,
    TestEval,
    TokenAxis,
)


class RunRecords(BaseModel):
    """What result.json, report.md and report.html are built from: the run's inputs, measurements and choices."""

    model_config = ConfigDict(frozen=True)

    thread_id: str = Field(description="The run (thread) id result.json names.")
    status: str = Field(default="done", description="The run's status as reported.")
    stop_reason: str = Field(default="", description="Why the loop ended.")
    model: ModelRef = Field(description="The model compressed.")
    dataset: DatasetRef = Field(description="The evaluation data asked for.")
    objective: Objective = Field(description="Goal, bounds and selection rule.")
    family: str = Field(default="", description="The family adapter used.")
    input_shape: InputShape | None = Field(default=None, description="The input shape and where it came from.")
    labels: LabelMap | None = Field(default=None, description="How the dataset's labels map to the model's.")
    data: DataRef | None = Field(default=None, description="The prepared images: roles, sizes and splits.")
    profile: ProfileSummary | None = Field(default=None, description="The compact profile summary.")
    token_axis: TokenAxis | None = Field(default=None, description="Token merging's measured latency and damage.")
    baseline: ArtifactRef | None = Field(default=None, description="The untouched model on disk.")
    baseline_eval: EvalRecord | None = Field(default=None, description="The baseline's validation measurements.")
    test_eval: TestEval | None = Field(default=None, description="Baseline and best on the held-out test images.")
    candidates: list[Candidate] = Field(default_factory=list, description="One per round.")
    best: Best | None = Field(default=None, description="The candidate the rule kept.")
    fallbacks: list[Fallback] = Field(default_factory=list, description="LLM plans refused.")
    history: list[HistoryEvent] = Field(default_factory=list, description="The node steps (planner facts).")
