"""The graph's shared state (`State`), its input (`InputState`), its run context (`Context`) and its node history.

What flows is declared here: the fields, their reducers (`operator.add` appends a node's `candidates`, `fallbacks`
and `history` to the ones before) and the settings of a run. The schemas the fields hold live in `schemas/`, by
meaning: `settings` (each choice a `Literal` defined once), `base` (the strict base models), `inputs` (model,
dataset, objective), `plans` (plans and what planners record), `records` (what flows between nodes) and
`migrations` (older checkpoints' shapes, keyed by `STATE_FORMAT`). Every one of their names is importable from
`profiling_agent.state` as well.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Annotated, Any, get_args

from pydantic import BaseModel, Field, model_validator

from profiling_agent.schemas.base import (
    Ref,
    Strict,
)
from profiling_agent.schemas.inputs import (
    DatasetRef,
    ModelRef,
    Objective,
)
from profiling_agent.schemas.migrations import (
    LEGACY_HISTORY_KEYS,
    MIGRATIONS,
    RENAMED_NODES,
    STATE_FORMAT,
    Migration,
    pending,
    upgrade_history_event,
)
from profiling_agent.schemas.planner_profile import LayerRow, PlannerProfile
from profiling_agent.schemas.planning import (
    PastRound,
    Trial,
    VariantSummary,
)
from profiling_agent.schemas.planning_problem import (
    GroupRow,
    LatencyCurve,
    PlanningProblem,
    group_rows,
)
from profiling_agent.schemas.plans import (
    MAX_REGEX_LEN,
    BackoffRecord,
    BackoffTrial,
    BlockTrial,
    BudgetPlan,
    CompressionPlan,
    Fallback,
    GivenUpMode,
    LayerPattern,
    LLMStep,
    PlannerMeta,
    PlannerMode,
    ProposalDiff,
    PruneEntry,
    QuantEntry,
    RejectedAnswer,
    Review,
    SearchRecord,
    SearchTrial,
    StructuredFacts,
    TokenChoice,
    TokenEntry,
)
from profiling_agent.schemas.records import (
    AppliedGroup,
    ArtifactRef,
    BackendSummary,
    Best,
    Candidate,
    DataRef,
    EvalRecord,
    GroupCosts,
    GroupSensitivity,
    InputShape,
    LabelMap,
    LatencyRow,
    MacsRow,
    OperatorRow,
    ProfileEnv,
    ProfileSummary,
    RecoveryRecord,
    ReportRef,
    RoundCheck,
    TestEval,
    TokenAxis,
    TokenRate,
    VariantRecord,
)
from profiling_agent.schemas.settings import (
    BASELINE_PLANNERS,
    CONTEXT_CHOICES,
    EMBEDDED_DATASET,
    EMBEDDED_MODEL,
    BackendChoice,
    BaselinePlanner,
    DeviceChoice,
    ImportanceChoice,
    PlannerChoice,
    PruneType,
    QuantDtype,
    QuantizeChoice,
    RecoverChoice,
    SelectRule,
    StructuredChoice,
    StructuredMode,
    TargetMetric,
    choices,
)


class StateSchemaError(Exception):
    """A checkpoint holds a key this version does not know (written by another version, or damaged): one line."""


class HistoryEvent(Strict):
    """One node step: which node, which iteration, when, what it did, and the facts some nodes add."""

    node: str
    iteration: int = 0
    time: float
    message: str
    rationale: str | None = Field(default=None, description="analyze: the plan's rationale.")
    planner_choice: PlannerMode | None = Field(default=None, description="analyze: how the planner choice resolved.")
    llm: LLMStep | None = Field(default=None, description="analyze: the round's LLM step, when an LLM was asked.")
    safe_adapter: bool | None = Field(default=None, description="acquire: the family adapter is a tested one.")
    spent_s: float | None = Field(default=None, description="Wall-clock seconds the step took (a resume sums them).")
    expected_s: float | None = Field(default=None, description="Seconds the time budget's planner expected it to take.")
    budget: BudgetPlan | None = Field(default=None, description="budget: the time budget's plan when its cuts changed.")

    @model_validator(mode="before")
    @classmethod
    def _known_keys(cls, data: Any) -> Any:
        """Map the keys older versions wrote to today's fields; refuse an unknown key in one line naming it."""
        if not isinstance(data, dict):
            return data
        data = upgrade_history_event(data)
        unknown = sorted(set(data) - set(cls.model_fields))
        if unknown:
            raise StateSchemaError(
                f"a history event of node {data.get('node')!r} has the unknown key {unknown[0]!r}: this checkpoint "
                "was written by another version of profiling-agent"
            )
        return data

    def to_update(self) -> dict[str, Any]:
        """Return the event as the JSON a node returns (the facts it does not carry left out)."""
        return {k: v for k, v in self.model_dump().items() if v is not None}


# ---------------------------------------------------------------- graph state


class State(BaseModel):
    """Shared state of one run (one LangGraph thread). JSON-only: models live on disk."""

    model: ModelRef = Field(default_factory=ModelRef, description="Model to compress.")
    dataset: DatasetRef = Field(default_factory=DatasetRef, description="Evaluation data.")
    objective: Objective = Field(default_factory=Objective, description="Goal, bounds and selection rule.")

    run_path: str = Field(default="", description="Absolute run folder RUN_DIR/THREAD_ID (set by acquire).")
    status: str = Field(default="new", description="new, running, done or failed.")
    family: str = Field(default="", description="Model family adapter in use (vit, resnet, ...).")
    baseline: ArtifactRef | None = Field(default=None, description="The untouched model.")
    labels: LabelMap | None = Field(default=None, description="Label mapping dataset -> model.")
    data: DataRef | None = Field(default=None, description="Prepared evaluation tensors on disk.")
    input_shape: InputShape | None = Field(default=None, description="channels/height/width and source.")
    profile: ProfileSummary | None = Field(default=None, description="Compact profile summary.")
    sensitivity: dict[str, GroupSensitivity] | None = Field(default=None, description="Probe result per group.")
    token_axis: TokenAxis | None = Field(default=None, description="Token merging's latency and damage (ViT, DeiT).")
    baseline_eval: EvalRecord | None = Field(default=None, description="The baseline's measurements (validation).")
    test_eval: TestEval | None = Field(default=None, description="Baseline and best on the held-out test images.")

    iteration: int = Field(default=0, description="Current pruning iteration, 1-based once planning starts.")
    plan: CompressionPlan | None = Field(default=None, description="Plan of the current iteration.")
    planner_used: str = Field(default="", description="Planner that produced the current plan.")
    current: Candidate | None = Field(default=None, description="Candidate being built this iteration.")
    candidates: Annotated[list[Candidate], operator.add] = Field(default_factory=list, description="One per round.")
    best: Best | None = Field(default=None, description="Best candidate so far, by the rule.")
    fallbacks: Annotated[list[Fallback], operator.add] = Field(default_factory=list, description="LLM refusals.")
    stop_reason: str = Field(default="", description="Why the loop ended.")
    report: ReportRef | None = Field(default=None, description="Paths of the report files.")
    history: Annotated[list[HistoryEvent], operator.add] = Field(default_factory=list, description="Node steps.")
    state_format: int = Field(
        default=0,
        description="Format of the saved state (schemas/migrations.py); 0: written before formats were numbered.",
    )


class InputState(BaseModel):
    """What a caller provides; `{}` runs the embedded default."""

    model: ModelRef = Field(default_factory=ModelRef, description="Model to compress.")
    dataset: DatasetRef = Field(default_factory=DatasetRef, description="Evaluation data.")
    objective: Objective = Field(default_factory=Objective, description="Goal, bounds and selection rule.")


# ---------------------------------------------------------------- run context


def _ctx(default: Any, description: str) -> Any:
    return field(default=default, metadata={"description": description})


@dataclass
class Context:
    """Run-scoped settings: how to run, never what to optimize (a resume cannot change the goal)."""

    run_root: str = _ctx("runs", "Folder holding one sub-folder per thread (RUN_DIR).")
    device: DeviceChoice = _ctx("auto", "cpu, cuda or auto.")
    threads: int = _ctx(0, "Threads for profiling (0: torch's default) and for measuring forms (0: one, fair).")
    llm_model: str = _ctx("gpt-4o", "Chat model name on the OpenAI-compatible endpoint.")
    llm_base_url: str = _ctx("", "OpenAI-compatible base URL (default: $OPENAI_BASE_URL).")
    llm_api_key_env: str = _ctx("OPENAI_API_KEY", "Environment variable holding the API key (never stored).")
    llm_temperature: float = _ctx(0.0, "Sampling temperature of the LLM planner.")
    llm_timeout: float = _ctx(
        0.0, "Seconds one LLM request may take in all (0: no total limit; the first-token and idle limits apply)."
    )
    llm_first_token_timeout: float = _ctx(
        900.0, "Seconds an LLM request may wait for its first streamed token (a CPU server reading a long prompt)."
    )
    llm_idle_timeout: float = _ctx(60.0, "Seconds a streamed LLM reply may go without a new token before it is cut.")
    llm_retries: int = _ctx(2, "Times an invalid LLM plan goes back to the LLM before the fallback.")
    llm_tool_rounds: int = _ctx(6, "Tool-call rounds allowed per planning step.")
    llm_max_tokens: int = _ctx(2048, "Most tokens one LLM reply may have (a rambling small model stops there).")
    trials: int = _ctx(0, "Calibration trials of a searching round (0: 4); the time budget lowers it.")
    llm_structured: StructuredChoice = _ctx(
        "auto", "Schema-constrained final answers (json_schema, json_object + schema, off); auto asks the server."
    )
    latency_warmup: int = _ctx(3, "Warm-up forward passes before timing.")
    latency_repeats: int = _ctx(15, "Timed repeats; the median is reported.")
    latency_batch: int = _ctx(16, "Batch size of the larger-batch latency.")
    eval_batch: int = _ctx(64, "Batch size for accuracy evaluation.")
    probe_ratio: float = _ctx(0.3, "Ratio each group is pruned at by the sensitivity probe.")
    importance: ImportanceChoice = _ctx("l2", "Channel/head importance: l2, l1 or random.")
    recover: RecoverChoice = _ctx(
        "auto", "Recovery after pruning: none, reconstruct, distill or auto (both when it can)."
    )
    recover_steps: int = _ctx(0, "Distillation steps (0: scaled to the training images and the model size).")
    recover_minutes: float = _ctx(
        2.0,
        "Cap of one candidate's distillation, minutes (0: none): wall-clock with --recover-steps; automatic "
        "recovery counts CPU time per torch thread, so waiting for a shared core does not cut it.",
    )
    recover_lr: float = _ctx(0.0, "Peak AdamW learning rate of distillation (0: 3e-4, 1e-3 after removing blocks).")
    recover_batch: int = _ctx(0, "Images per distillation step (0: 32, 64 after removing blocks).")
    recover_augment: bool = _ctx(True, "Augment training images (random resized crop; flips for RGB images).")
    recover_procs: int = _ctx(1, "Processes distillation runs on (>1: a torch.distributed job; docs/distributed.md).")
    launcher: str = _ctx("torchrun --standalone --nproc-per-node {procs}", "Command starting that job ({procs}).")
    backend: BackendChoice = _ctx(
        "auto", "torch, onnxruntime, openvino or auto (every form): the fastest within budget ships."
    )
    plots: bool = _ctx(True, "Draw the report's charts (plots/*.png, shown in report.md and report.html).")

    def __post_init__(self) -> None:
        """Refuse a choice setting outside its `Literal` (a typo would otherwise run with a silent default)."""
        for name, kind in CONTEXT_CHOICES.items():
            if getattr(self, name) not in get_args(kind):
                raise ValueError(
                    f"Context.{name} must be one of {', '.join(get_args(kind))}, not {getattr(self, name)!r}"
                )

    @classmethod
    def of(cls, values: dict[str, Any]) -> Context:
        """Build from a dict; keys that are not settings (another version's) are ignored."""
        return cls(**{k: v for k, v in values.items() if k in cls.__dataclass_fields__})


__all__ = [
    "AppliedGroup",
    "ArtifactRef",
    "BASELINE_PLANNERS",
    "BackendChoice",
    "BackendSummary",
    "BackoffRecord",
    "BackoffTrial",
    "BaselinePlanner",
    "Best",
    "BlockTrial",
    "BudgetPlan",
    "CONTEXT_CHOICES",
    "Candidate",
    "CompressionPlan",
    "Context",
    "DataRef",
    "DatasetRef",
    "DeviceChoice",
    "EMBEDDED_DATASET",
    "EMBEDDED_MODEL",
    "EvalRecord",
    "Fallback",
    "GivenUpMode",
    "GroupCosts",
    "GroupRow",
    "GroupSensitivity",
    "HistoryEvent",
    "ImportanceChoice",
    "InputShape",
    "InputState",
    "LEGACY_HISTORY_KEYS",
    "LLMStep",
    "LatencyCurve",
    "LabelMap",
    "LatencyRow",
    "LayerPattern",
    "MAX_REGEX_LEN",
    "MIGRATIONS",
    "MacsRow",
    "Migration",
    "ModelRef",
    "Objective",
    "OperatorRow",
    "PastRound",
    "PlanningProblem",
    "PlannerProfile",
    "LayerRow",
    "PlannerChoice",
    "PlannerMeta",
    "PlannerMode",
    "ProfileEnv",
    "ProfileSummary",
    "ProposalDiff",
    "TokenChoice",
    "TokenEntry",
    "PruneEntry",
    "PruneType",
    "QuantDtype",
    "QuantEntry",
    "QuantizeChoice",
    "RENAMED_NODES",
    "RecoverChoice",
    "RecoveryRecord",
    "Ref",
    "RejectedAnswer",
    "ReportRef",
    "Review",
    "RoundCheck",
    "STATE_FORMAT",
    "SearchRecord",
    "SearchTrial",
    "SelectRule",
    "State",
    "StateSchemaError",
    "Strict",
    "StructuredChoice",
    "StructuredFacts",
    "StructuredMode",
    "TargetMetric",
    "TestEval",
    "TokenAxis",
    "TokenRate",
    "Trial",
    "VariantRecord",
    "VariantSummary",
    "choices",
    "group_rows",
    "pending",
    "upgrade_history_event",
]
