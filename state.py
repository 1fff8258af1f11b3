"""Typed, JSON-only shared state of the graph and the schemas of plans, records and artifacts."""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

EMBEDDED_MODEL = "embedded:vit-digits"
EMBEDDED_DATASET = "embedded:digits"

PruneType = Literal["structured", "head"]
QuantDtype = Literal["qint8", "float16"]
QuantizeChoice = Literal["qint8", "float16", "none"]
PlannerChoice = Literal["deterministic", "llm", "auto", "l1", "l2", "random"]
BASELINE_PLANNERS = ("l1", "l2", "random")  # uniform pruning baselines (tools/compression/baselines.py)
SelectRule = Literal["paper", "budget"]
TargetMetric = Literal["params", "macs", "latency", "size"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


# ---------------------------------------------------------------- run inputs ("what")


class ModelRef(_Strict):
    """Which model to compress."""

    ref: str = Field(
        default=EMBEDDED_MODEL,
        description="Hub id (e.g. google/vit-base-patch16-224), local save_pretrained folder, a saved "
        "profiling-agent artifact, or embedded:vit-digits / embedded:resnet-digits.",
    )
    revision: str | None = Field(default=None, description="Hub revision (branch, tag or commit).")
    trust_remote_code: bool = Field(default=False, description="Allow custom modelling code from the hub.")


class DatasetRef(_Strict):
    """Which labelled images to evaluate on."""

    ref: str = Field(
        default=EMBEDDED_DATASET,
        description="Hub id, a save_to_disk folder, an imagefolder directory, or embedded:digits.",
    )
    split: str = Field(default="test", description="Split to evaluate on.")
    subset: int = Field(default=512, ge=8, le=1_000_000, description="Seeded evaluation subset size.")
    calibration: int = Field(
        default=64, ge=4, le=10_000, description="Images (from the other samples) used by the sensitivity probe."
    )
    image_column: str | None = Field(default=None, description="Image column; detected when omitted.")
    label_column: str | None = Field(default=None, description="Label column; detected when omitted.")
    seed: int = Field(default=0, description="Seed for the subset and every random choice.")


class Objective(_Strict):
    """What the run optimizes and the rule that picks the best candidate."""

    max_acc_drop: float = Field(
        default=2.0, ge=0.0, le=100.0, description="Largest accepted top-1 drop, in percentage points."
    )
    target: TargetMetric = Field(default="params", description="Metric the `budget` rule reduces.")
    target_reduction: float = Field(
        default=0.4,
        gt=0.0,
        lt=1.0,
        description="Fractional reduction of `target` that counts as success (the loop stops early).",
    )
    select: SelectRule = Field(
        default="budget",
        description="paper: highest accuracy, then fewer params, then lower latency. budget: largest "
        "reduction of `target` among candidates within max_acc_drop.",
    )
    iterations: int = Field(default=5, ge=1, le=50, description="Upper bound on pruning iterations.")
    quantize: QuantizeChoice = Field(default="qint8", description="Dynamic quantization added to each plan.")
    planner: PlannerChoice = Field(
        default="auto",
        description="deterministic, llm, auto (the LLM when one is configured), or a uniform pruning baseline: "
        "l1, l2 or random (needs `ratio`).",
    )
    ratio: float | None = Field(
        default=None,
        gt=0.0,
        lt=1.0,
        description="Uniform pruning ratio of the l1/l2/random baselines (required for them, unused otherwise).",
    )
    approve: bool = Field(
        default=False,
        description="Pause before each plan is applied for a human decision: approve, edit (a replacement plan) "
        "or reject (the iteration's candidate is skipped and recorded as rejected).",
    )

    @model_validator(mode="after")
    def _baseline_ratio(self) -> Objective:
        if self.planner in BASELINE_PLANNERS and self.ratio is None:
            raise ValueError(f"planner {self.planner} needs a ratio in (0, 1)")
        if self.ratio is not None and self.planner not in BASELINE_PLANNERS:
            raise ValueError(f"ratio applies only to the planners {', '.join(BASELINE_PLANNERS)}")
        return self


# ---------------------------------------------------------------- plans (paper, Figure 4)

MAX_REGEX_LEN = 200


def _short_regex(value: str) -> str:
    if not value or len(value) > MAX_REGEX_LEN:
        raise ValueError(f"layer regex must have 1..{MAX_REGEX_LEN} characters")
    return value


LayerPattern = Annotated[str, AfterValidator(_short_regex)]


class PruneEntry(_Strict):
    """Prune the prunable groups whose module name matches `layer` (re.search) by `ratio`."""

    layer: LayerPattern = Field(description="Regular expression searched in module names, e.g. 'layers\\.(2|3)\\.mlp'.")
    type: PruneType = Field(description="structured: conv/MLP channels; head: whole attention heads.")
    ratio: float = Field(gt=0.0, lt=1.0, description="Fraction of channels (or heads) removed per group.")
    justification: str = Field(default="", description="Why, grounded in the profile.")


class QuantEntry(_Strict):
    """Dynamically quantize the nn.Linear layers matched by `layer` ('all' or a regex)."""

    layer: LayerPattern = Field(default="all", description="'all' or a regular expression searched in module names.")
    type: Literal["dynamic"] = Field(default="dynamic", description="Post-training dynamic quantization.")
    dtype: QuantDtype = Field(default="qint8", description="Weight dtype.")
    justification: str = Field(default="", description="Why, grounded in the profile.")


class CompressionPlan(_Strict):
    """A layer-wise compression plan, as in the paper's Figure 4."""

    pruning: list[PruneEntry] = Field(default_factory=list, description="Later entries override earlier ones.")
    quantization: list[QuantEntry] = Field(default_factory=list, description="Applied after pruning.")
    rationale: str = Field(default="", description="One paragraph on the plan as a whole.")


# ---------------------------------------------------------------- records


class ArtifactRef(_Strict):
    """A model saved on disk, described well enough to check and reload it."""

    path: str = Field(description="Folder, relative to the run folder.")
    sha256: str = Field(description="sha256 over the folder's files (sorted names and contents).")
    size_bytes: int = Field(description="Bytes of the weights file on disk.")
    params: int = Field(description="Logical parameter count (quantized weights counted once).")


class EvalRecord(BaseModel):
    """Measured quality and cost of one model, taken side by side with the baseline."""

    name: str
    accuracy: float = Field(description="Top-1 accuracy in percent on the seeded subset.")
    agreement: float = Field(description="Percent of predictions equal to the baseline's.")
    n_samples: int
    latency_ms: float = Field(description="Median batch-1 latency, ms.")
    latency_batch_ms: float = Field(description="Median latency of one batch of `batch_size`, ms.")
    batch_size: int
    baseline_latency_ms: float = Field(description="Baseline batch-1 median measured in the same run.")
    speedup: float = Field(description="baseline_latency_ms / latency_ms, measured side by side.")
    memory_bytes: int = Field(description="Bytes of parameters and buffers (packed weights included).")
    size_mb: float = Field(description="Size of the saved weights file, MB.")
    params: int
    macs: int = Field(description="Multiply-accumulates of one image (pruned architecture, fp32 count).")
    threads: int


class Candidate(BaseModel):
    """One iteration's plan, what pruning actually did, its artifact and its evaluation."""

    iteration: int
    status: Literal["ok", "failed", "rejected"]
    plan: dict[str, Any]
    planner: str = Field(description="Planner that produced the plan.")
    applied: list[dict[str, Any]] = Field(default_factory=list, description="Per-group pruning as applied.")
    quantized: list[str] = Field(default_factory=list, description="Modules dynamically quantized.")
    artifact: dict[str, Any] | None = None
    eval: dict[str, Any] | None = None
    error: str | None = None


# ---------------------------------------------------------------- graph state


class State(BaseModel):
    """Shared state of one run (one LangGraph thread). JSON-only: models live on disk."""

    model: ModelRef = Field(default_factory=ModelRef, description="Model to compress.")
    dataset: DatasetRef = Field(default_factory=DatasetRef, description="Evaluation data.")
    objective: Objective = Field(default_factory=Objective, description="Goal, bounds and selection rule.")

    run_path: str = Field(default="", description="Absolute run folder RUN_DIR/THREAD_ID (set by acquire).")
    status: str = Field(default="new", description="new, running, done or failed.")
    family: str = Field(default="", description="Model family adapter in use (vit, resnet, ...).")
    baseline: dict[str, Any] | None = Field(default=None, description="ArtifactRef of the untouched model.")
    labels: dict[str, Any] | None = Field(default=None, description="Label mapping dataset -> model.")
    data: dict[str, Any] | None = Field(default=None, description="Prepared evaluation tensors on disk.")
    input_shape: dict[str, Any] | None = Field(default=None, description="channels/height/width and source.")
    profile: dict[str, Any] | None = Field(default=None, description="Compact profile summary.")
    sensitivity: dict[str, Any] | None = Field(default=None, description="Sensitivity probe per group.")
    baseline_eval: dict[str, Any] | None = Field(default=None, description="EvalRecord of the baseline.")

    iteration: int = Field(default=0, description="Current pruning iteration, 1-based once planning starts.")
    plan: dict[str, Any] | None = Field(default=None, description="Plan of the current iteration.")
    planner_used: str = Field(default="", description="Planner that produced the current plan.")
    current: dict[str, Any] | None = Field(default=None, description="Candidate being built this iteration.")
    candidates: Annotated[list[dict[str, Any]], operator.add] = Field(
        default_factory=list, description="Finished candidates, one per iteration."
    )
    best: dict[str, Any] | None = Field(default=None, description="Best candidate so far, by the rule.")
    fallbacks: Annotated[list[dict[str, Any]], operator.add] = Field(
        default_factory=list, description="Planner fallbacks (LLM -> deterministic) with reasons."
    )
    stop_reason: str = Field(default="", description="Why the loop ended.")
    report: dict[str, Any] | None = Field(default=None, description="Paths of report.md and result.json.")
    history: Annotated[list[dict[str, Any]], operator.add] = Field(
        default_factory=list, description="One event per node step (node, iteration, message)."
    )


class InputState(BaseModel):
    """What a caller provides; `{}` runs the embedded default."""

    model: ModelRef = Field(default_factory=ModelRef, description="Model to compress.")
    dataset: DatasetRef = Field(default_factory=DatasetRef, description="Evaluation data.")
    objective: Objective = Field(default_factory=Objective, description="Goal, bounds and selection rule.")


# ---------------------------------------------------------------- run context ("how")


def _ctx(default: Any, description: str) -> Any:
    return field(default=default, metadata={"description": description})


@dataclass
class Context:
    """Run-scoped settings: how to run, never what to optimize (a resume cannot change the goal)."""

    run_root: str = _ctx("runs", "Folder holding one sub-folder per thread (RUN_DIR).")
    device: str = _ctx("auto", "cpu, cuda or auto.")
    threads: int = _ctx(0, "torch intra-op threads for profiling and evaluation (0 keeps torch's default).")
    llm_model: str = _ctx("gpt-4o", "Chat model name on the OpenAI-compatible endpoint.")
    llm_base_url: str = _ctx("", "OpenAI-compatible base URL (default: $OPENAI_BASE_URL).")
    llm_api_key_env: str = _ctx("OPENAI_API_KEY", "Environment variable holding the API key (never stored).")
    llm_temperature: float = _ctx(0.0, "Sampling temperature of the LLM planner.")
    llm_timeout: float = _ctx(60.0, "Seconds before one LLM request times out.")
    llm_retries: int = _ctx(2, "Times an invalid LLM plan goes back to the LLM before the fallback.")
    llm_tool_rounds: int = _ctx(6, "Tool-call rounds allowed per planning step.")
    latency_warmup: int = _ctx(3, "Warm-up forward passes before timing.")
    latency_repeats: int = _ctx(15, "Timed repeats; the median is reported.")
    latency_batch: int = _ctx(16, "Batch size of the larger-batch latency.")
    eval_batch: int = _ctx(64, "Batch size for accuracy evaluation.")
    probe_ratio: float = _ctx(0.3, "Ratio each group is pruned at by the sensitivity probe.")
    importance: str = _ctx("l2", "Channel/head importance: l2, l1 or random.")
