"""Typed, JSON-only shared state of the graph and the schemas of plans, records and artifacts.

One package, split by meaning; every name is importable from `profiling_agent.state` as before:

- `settings`: the choices a run accepts (`Literal`s, defined once) and the run context (`Context`: how to run);
- `base`: the strict base models;
- `inputs`: what to compress and how to judge it (`ModelRef`, `DatasetRef`, `Objective`);
- `plans`: compression plans and what the planners record about a round (`PlannerMeta`, `LLMStep`, trials);
- `records`: what flows between nodes (artifacts, data, profile, measurements, candidates, report);
- `migrations`: how older checkpoints' shapes are upgraded, keyed by `STATE_FORMAT`;
- `graph_state`: the graph's `State`, `InputState` and the node history.
"""

from __future__ import annotations

from profiling_agent.state.base import (
    Ref,
    Strict,
)
from profiling_agent.state.graph_state import (
    HistoryEvent,
    InputState,
    State,
    StateSchemaError,
)
from profiling_agent.state.inputs import (
    DatasetRef,
    ModelRef,
    Objective,
)
from profiling_agent.state.migrations import (
    LEGACY_HISTORY_KEYS,
    MIGRATIONS,
    RENAMED_NODES,
    STATE_FORMAT,
    Migration,
    pending,
    upgrade_history_event,
)
from profiling_agent.state.plans import (
    MAX_REGEX_LEN,
    BackoffRecord,
    BackoffTrial,
    BlockTrial,
    CompressionPlan,
    Fallback,
    LayerPattern,
    LLMStep,
    PlannerMeta,
    PlannerMode,
    ProposalDiff,
    PruneEntry,
    QuantEntry,
    Review,
    SearchRecord,
    SearchTrial,
)
from profiling_agent.state.records import (
    AppliedGroup,
    ArtifactRef,
    BackendSummary,
    Best,
    Candidate,
    DataRef,
    EvalRecord,
    GroupSensitivity,
    InputShape,
    LabelMap,
    ProfileSummary,
    RecoveryRecord,
    ReportRef,
    RoundCheck,
    TestEval,
    VariantRecord,
)
from profiling_agent.state.settings import (
    BASELINE_PLANNERS,
    CONTEXT_CHOICES,
    EMBEDDED_DATASET,
    EMBEDDED_MODEL,
    BackendChoice,
    BaselinePlanner,
    Context,
    DeviceChoice,
    ImportanceChoice,
    PlannerChoice,
    PruneType,
    QuantDtype,
    QuantizeChoice,
    RecoverChoice,
    SelectRule,
    StructuredChoice,
    TargetMetric,
    choices,
)

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
    "GroupSensitivity",
    "HistoryEvent",
    "ImportanceChoice",
    "InputShape",
    "InputState",
    "LEGACY_HISTORY_KEYS",
    "LLMStep",
    "LabelMap",
    "LayerPattern",
    "MAX_REGEX_LEN",
    "MIGRATIONS",
    "Migration",
    "ModelRef",
    "Objective",
    "PlannerChoice",
    "PlannerMeta",
    "PlannerMode",
    "ProfileSummary",
    "ProposalDiff",
    "PruneEntry",
    "PruneType",
    "QuantDtype",
    "QuantEntry",
    "QuantizeChoice",
    "RENAMED_NODES",
    "RecoverChoice",
    "RecoveryRecord",
    "Ref",
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
    "TargetMetric",
    "TestEval",
    "VariantRecord",
    "choices",
    "pending",
    "upgrade_history_event",
]
