"""The records that flow between nodes: artifacts, data, profile, sensitivity, measurements, candidates, report.

Everything here moves through the graph as plain JSON (nodes return `model_dump()` dicts, so checkpoints hold JSON);
the State validates it back into these models, so every field that flows is declared here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from pydantic import ConfigDict, Field, with_config
from typing_extensions import TypedDict

from profiling_agent.schemas.base import Strict
from profiling_agent.schemas.plans import CompressionPlan, PlannerMeta, Review
from profiling_agent.schemas.settings import PruneType


class ArtifactRef(Strict):
    """A model saved on disk, described well enough to check and reload it."""

    path: str = Field(description="Folder, relative to the run folder.")
    sha256: str = Field(description="sha256 over the folder's files (sorted names and contents).")
    size_bytes: int = Field(description="Bytes of the weights file on disk.")
    params: int = Field(description="Logical parameter count (quantized weights counted once).")


class LabelMap(Strict):
    """How the dataset's labels map to the model's class ids (never a silent substring guess)."""

    method: str = Field(description="How names were matched: identical, synonyms, numeric ids or WordNet ids.")
    dataset_to_model: dict[str, int] = Field(description="Dataset class index (as a string) -> model class id.")
    restricted: bool = Field(description="The dataset's classes are a strict subset of the model's.")
    allowed_ids: list[int] | None = Field(default=None, description="Model ids predictions are restricted to.")
    unmapped: list[str] = Field(default_factory=list, description="Dataset names without a model class.")
    n_dataset_classes: int = Field(default=0, description="Classes in the dataset.")
    n_model_classes: int = Field(default=0, description="Classes the model predicts.")
    examples: list[str] = Field(default_factory=list, description="A few 'dataset -> model' pairs, for people.")
    image_column: str = Field(description="Image column of the dataset.")
    label_column: str = Field(description="Label column of the dataset.")
    dataset_label_names: list[str] = Field(default_factory=list, description="The dataset's label names.")


class DataRef(Strict):
    """The prepared evaluation and calibration images on disk."""

    path: str = Field(description="Row numbers and labels (no pixels: streamed), relative to the run folder.")
    sha256: str = Field(description="sha256 of the tensor file.")
    n_eval: int = Field(description="Validation images (what the loop selects on).")
    n_test: int = Field(default=0, description="Held-out test images (what the report quotes).")
    n_calib: int = Field(description="Calibration (sensitivity-probe) images.")
    image_column: str = Field(description="Image column read.")
    label_column: str = Field(description="Label column read.")
    label_names: list[str] = Field(default_factory=list, description="The dataset's label names.")
    note: str = Field(default="", description="How the subsets were drawn.")
    seed: int = Field(description="Seed of the subsets.")
    shape: list[int] = Field(description="channels, height, width of the stored pixels.")
    calib_overlaps_eval: bool = Field(default=False, description="Calibration images overlap validation (never now).")
    test_other_split: bool = Field(default=False, description="The test images come from another split.")
    calib_other_split: bool = Field(default=False, description="The calibration images come from another split.")
    subsets: str = Field(default="subsets.json", description="Row indices of every role, relative to the run.")
    splits: dict[str, str | None] = Field(default_factory=dict, description="Role -> split (None: no splits).")


class InputShape(Strict):
    """The model's input shape, where it came from, and whether a forward pass accepted it."""

    channels: int
    height: int
    width: int
    source: str = Field(description="processor, config, default or llm.")
    ambiguous: bool = Field(default=False, description="Processor and config disagreed or said nothing.")
    candidates: list[list[int]] = Field(default_factory=list, description="Other plausible (c, h, w) shapes.")
    notes: list[str] = Field(default_factory=list, description="What the resolver noticed.")
    verified: str = Field(default="", description="How the shape was checked ('forward pass').")
    tried: list[dict[str, Any]] = Field(default_factory=list, description="Shapes tried, where from, and errors.")
    llm: dict[str, Any] | None = Field(default=None, description="The LLM's answer when it was consulted.")


class BackendSummary(Strict):
    """The deliverable forms' per-node profile, condensed (the full one is profile.json's backend_profile)."""

    planned_on: str = "torch"  # the form whose latency shares the planners read
    forms_ms: dict[str, float] = Field(default_factory=dict)  # batch-1 node-time total per profiled form, ms
    failed: dict[str, str] = Field(default_factory=dict)  # forms that could not be profiled, and why
    latency_table: str | None = None  # the form a per-group latency table was measured on
    notes: list[str] = Field(default_factory=list)  # runtimes left out, and why


# the profile summary's rows (tools/profiling/summary.py writes them): plain dicts with known keys, typed
@with_config(ConfigDict(extra="forbid"))
class ProfileEnv(TypedDict, total=False):
    """Where the profile was taken."""

    device: str
    threads: int
    input_shape: list[int]
    batch: int


@with_config(ConfigDict(extra="forbid"))
class GroupCosts(TypedDict, total=False):
    """Per prunable group, its shares of the costs, in the order `columns` names them."""

    columns: list[str]
    rows: dict[str, list[float]]


@with_config(ConfigDict(extra="forbid"))
class OperatorRow(TypedDict, total=False):
    """One torch.profiler operator by self time."""

    op: str
    self_ms: float
    share: float


@with_config(ConfigDict(extra="forbid"))
class LatencyRow(TypedDict, total=False):
    """One layer by self time."""

    name: str
    type: str
    latency_ms: float
    latency_share: float
    macs_share: float


@with_config(ConfigDict(extra="forbid"))
class MacsRow(TypedDict, total=False):
    """One layer by MACs."""

    name: str
    macs: int
    macs_share: float


class ProfileSummary(Strict):
    """The compact profile kept in the state (the full one is profile.json)."""

    path: str = Field(default="profile.json", description="The full profile, relative to the run folder.")
    totals: dict[str, int | float | None] = Field(default_factory=dict, description="params, macs (None: unknown), ...")
    env: ProfileEnv = Field(default_factory=ProfileEnv, description="Device, threads, batch and input shape.")
    groups: GroupCosts = Field(default_factory=GroupCosts, description="Per prunable group: columns and rows.")
    operators: list[OperatorRow] = Field(default_factory=list, description="Top operators (torch.profiler).")
    top_latency: list[LatencyRow] = Field(default_factory=list, description="Layers by self time.")
    top_macs: list[MacsRow] = Field(default_factory=list, description="Layers by MACs.")
    error: str | None = Field(default=None, description="Why MACs are unknown (the counter failed on this model).")
    backend: BackendSummary | None = Field(default=None, description="The deliverable forms' profile (CPU runs).")


class GroupSensitivity(Strict):
    """How far one prunable group, pruned alone, moves the predictions on the calibration images."""

    kl: float | None = Field(default=None, description="Mean KL divergence from the unpruned model's predictions.")
    agreement: float | None = Field(default=None, description="Percent of predictions unchanged.")
    acc_drop: float | None = Field(default=None, description="Top-1 points lost on the calibration images.")
    damage: float = Field(description="The probe's combined damage score (planners divide cost by it).")
    units_removed: int = Field(default=0, description="Channels or heads the probe removed.")
    ratio: float = Field(description="Ratio the probe pruned at.")
    error: str | None = Field(default=None, description="Why the probe could not prune it: an unprunable group.")


class TokenRate(Strict):
    """One token-merging rate or schedule of the run's token axis: its latency in the planned form and its damage.

    A uniform rate (`rate`, capped per layer as ToMe does) or a front-loaded schedule (`rate` None: merges in the
    first few layers only, which pays better at batch 1 than merging a little in every layer).
    """

    rate: int | None = Field(
        description="Tokens merged after every layer (capped per layer); 0: unmerged; None: a front-loaded schedule."
    )
    schedule: list[int] = Field(description="The per-layer schedule the row stands for.")
    tokens_left: int = Field(description="Tokens the last layer's MLP sees.")
    latency_ms: float = Field(description="The planned form's latency at the run's batch, ms.")
    saved_share: float = Field(description="Share of the unmerged latency saved (negative: slower).")
    dropped: str | None = Field(default=None, description="Why the planners may not use it (it does not pay).")
    drop_pp: float | None = Field(default=None, description="Top-1 points lost on the trial slice (merged baseline).")
    agreement: float | None = Field(default=None, description="Percent of trial-slice predictions unchanged.")
    kl: float | None = Field(default=None, description="Mean KL of its logits from the unmerged model's.")

    def merges(self) -> bool:
        """Return True unless this is the unmerged row (rate 0)."""
        return any(self.schedule)

    def label(self) -> str:
        """Return the row in a few words: "r=8" or "schedule [16, 8, 0, 0]"."""
        return f"r={self.rate}" if self.rate is not None else f"schedule {self.schedule}"


class TokenAxis(Strict):
    """The run's token axis (ViT, DeiT): the planned form's latency and the damage at a few merging rates."""

    form: str = Field(description="The form timed (the planned backend form, or torch).")
    batch: int = Field(description="Images per timed run (the batch a latency target is judged at).")
    base_ms: float = Field(description="The unmerged model's latency in that form, ms.")
    rates: list[TokenRate] = Field(
        default_factory=list, description="Rate 0 first, then the uniform rates and front-loaded schedules measured."
    )
    images: int = Field(default=0, description="Trial-slice images the damage was measured on.")
    protected: int = Field(default=1, description="Leading tokens never merged (CLS; DeiT's distillation token too).")

    def paying(self) -> list[TokenRate]:
        """Return the rows the planners may use: merging, faster than rate 0, with their damage measured."""
        return [r for r in self.rates if r.merges() and r.dropped is None and r.drop_pp is not None]

    def at(self, rate: int) -> TokenRate | None:
        """Return the row of uniform `rate`, or None when it was not measured."""
        return next((r for r in self.rates if r.rate == rate), None)

    def row_for(self, rate: int | None, schedule: Sequence[int] | None) -> TokenRate | None:
        """Return the measured row a plan entry names (its uniform rate, or exactly its schedule), or None."""
        if rate is not None:
            return self.at(rate)
        wanted = list(schedule or [])
        return next((r for r in self.rates if r.rate is None and r.schedule == wanted), None)


class VariantRecord(Strict):
    """One deployable form of a candidate (a backend and quantization method), measured beside the baseline."""

    name: str = Field(description="torch_fp32, torch_qint8, torch_float16, ort_fp32/dynamic/static, ov_fp32/bf16/int8.")
    backend: Literal["torch", "onnxruntime", "openvino"] = Field(description="The runtime that executes it.")
    status: Literal["ok", "failed", "skipped", "unscored"] = Field(
        description="failed: not built/loadable/matching; skipped: not built, and why; unscored: its accuracy pass "
        "was left out (timed, but faster forms within the budget rule it out; or built only as the other forms' "
        "source, not timed either): error says why."
    )
    error: str | None = Field(default=None, description="Why it failed, was skipped or was not scored.")
    accuracy: float | None = Field(default=None, description="Top-1 % on the validation subset.")
    agreement: float | None = Field(default=None, description="% of predictions equal to the baseline's.")
    latency_ms: float | None = Field(default=None, description="Median batch-1 latency, ms (beside the baseline).")
    latency_batch_ms: float | None = Field(default=None, description="Median batch-N latency, ms.")
    speedup: float | None = Field(default=None, description="Baseline over this variant's latency, batch 1.")
    speedup_batch: float | None = Field(default=None, description="Baseline over this variant's latency, batch N.")
    size_mb: float | None = Field(default=None, description="Bytes of its weights file (safetensors or .onnx), MB.")
    path: str | None = Field(default=None, description="Its folder, relative to the run folder.")
    max_abs_diff: float | None = Field(default=None, description="Largest |logit| difference from the torch FP32.")
    recipe: dict[str, Any] = Field(default_factory=dict, description="Exporter, opset and quantization recipe.")
    wall_over_cpu: float | None = Field(default=None, description="Timed wall time over process CPU time.")


class EvalRecord(Strict):
    """Measured quality and cost of one model, taken side by side with the baseline."""

    name: str
    accuracy: float = Field(description="Top-1 accuracy in percent on the seeded subset.")
    agreement: float = Field(description="Percent of predictions equal to the baseline's.")
    n_samples: int
    latency_ms: float = Field(description="Median batch-1 latency, ms.")
    latency_batch_ms: float = Field(description="Median latency of one batch of `batch_size`, ms.")
    batch_size: int
    baseline_latency_ms: float = Field(description="Baseline batch-1 median measured in the same run.")
    baseline_latency_batch_ms: float | None = Field(default=None, description="Its batch-N median, same run.")
    speedup: float = Field(description="baseline_latency_ms / latency_ms, measured side by side.")
    memory_bytes: int = Field(description="Bytes of parameters and buffers (packed weights included).")
    size_mb: float = Field(description="Size of the saved weights file, MB.")
    params: int
    macs: int = Field(description="Multiply-accumulates of one image (pruned architecture, fp32 count).")
    threads: int
    device: str = Field(default="cpu", description="Device every number (accuracy and latency) was measured on.")
    pruned_latency_ms: float | None = Field(default=None, description="Batch-1 latency of the fp32 pruned model.")
    pruned_latency_batch_ms: float | None = Field(default=None, description="Batch-N latency of the fp32 pruned model.")
    quant_speedup: float | None = Field(default=None, description="Pruned fp32 over quantized latency, batch 1.")
    quant_speedup_batch: float | None = Field(default=None, description="Pruned fp32 over quantized latency, batch N.")
    acc_delta_ci: list[float] | None = Field(default=None, description="Paired bootstrap 95% CI of the change, pp.")
    accuracy_before_recovery: float | None = Field(default=None, description="Top-1 before recovery (fp32 pruned), %.")
    agreement_before_recovery: float | None = Field(default=None, description="Its agreement with the baseline, %.")
    before_recovery_note: str | None = Field(default=None, description="Why the accuracy before recovery is missing.")
    variants: list[VariantRecord] = Field(default_factory=list, description="Every backend form, side by side.")
    delivered: str = Field(default="torch", description="The variant the fields above describe (handed over).")
    delivery_note: str = Field(default="", description="Why that variant was delivered (or why ORT was not).")
    peer: dict[str, Any] | None = Field(default=None, description="Fastest form of the unpruned model, timed beside.")
    timing: dict[str, Any] | None = Field(default=None, description="Wall vs CPU time, busy flag, re-measures.")
    predicted_by: str | None = Field(
        default=None,
        description="The FP32 form (same weights, logits within the FP32 tolerance of torch) whose faster accuracy "
        "passes stand for this torch model's, on validation and held-out test; None: torch predicted.",
    )


class RecoveryRecord(Strict):
    """What the recover step did to a pruned candidate, measured on the images it was allowed to see."""

    requested: str = Field(default="none", description="The context's recover setting (none, reconstruct, ...).")
    method: str = Field(default="none", description="What ran: none, reconstruct, distill or reconstruct+distill.")
    note: str = Field(default="", description="Why a step was skipped, or where the training images came from.")
    seconds: float = Field(default=0.0, description="Wall-clock seconds of the whole step.")
    consumers: int = Field(default=0, description="Layers refitted by reconstruction.")
    fit_error_before: float | None = Field(default=None, description="Mean relative output error before the refit.")
    fit_error_after: float | None = Field(default=None, description="Mean relative output error after the refit.")
    train_images: int = Field(default=0, description="Images distillation could train on.")
    steps: int = Field(default=0, description="Distillation steps done.")
    steps_planned: int = Field(default=0, description="Distillation steps planned.")
    resumed_from: int = Field(default=0, description="Step a resumed distillation continued from (0: fresh).")
    loss: float | None = Field(default=None, description="Last distillation loss.")
    calib_agreement_before: float | None = Field(default=None, description="Calibration agreement before, %.")
    calib_agreement_after: float | None = Field(default=None, description="Calibration agreement after, %.")
    curve: str | None = Field(default=None, description="JSON file of the recovery curve, relative to the run.")
    error: str | None = Field(default=None, description="Why recovery was abandoned (the pruned weights go on).")
    stopped: str | None = Field(default=None, description="Why distillation stopped: plateau, cap, steps or time.")
    kept_step: int | None = Field(
        default=None,
        description="The checked step whose weights were kept (0: before distillation), when not the last.",
    )
    trial_curve: list[list[float]] | None = Field(default=None, description="[step, trial-slice top-1 %] checks.")


class RoundCheck(Strict):
    """A round's predictions (calibration trial; latency model of the planned form) beside its measurements."""

    predicted_drop_pp: float | None = None  # the calibration trial's accuracy loss, pp
    measured_drop_pp: float | None = None  # validation's loss after recovery, pp
    expected_drop_pp: float | None = None  # the trial corrected as the round chose its goal (PlannerMeta.expected_drop)
    correction: float | None = None  # measured over predicted loss (later rounds fit error_model's correction)
    latency_form: str | None = None  # the delivered form the latency reduction was measured on
    predicted_latency_reduction: float | None = None  # the plan's estimate on the planned form
    measured_latency_reduction: float | None = None  # against the unpruned model in the same form
    latency_error: float | None = None  # measured minus predicted
    latency_against: str | None = None  # where the unpruned form's latency came from


class AppliedGroup(Strict):
    """What pruning did to one matched group (the removed unit indices stay in the pruned artifact's JSON)."""

    group: str = Field(description="Prunable group name.")
    module: str = Field(description="The group's module.")
    kind: PruneType = Field(description="structured (channels), head (attention heads) or block (a whole block).")
    ratio: float = Field(description="The plan's ratio for it.")
    units_before: int = Field(description="Units (channels or heads) before pruning.")
    units_after: int = Field(description="Units left.")


class Candidate(Strict):
    """One iteration's plan, what pruning actually did, its artifacts and its evaluation."""

    iteration: int
    status: Literal["pending", "ok", "failed", "rejected"] = Field(
        default="pending", description="pending while the iteration runs; then ok, failed or rejected."
    )
    plan: CompressionPlan = Field(default_factory=CompressionPlan, description="The plan applied.")
    planner: str = Field(default="", description="Planner that produced the plan.")
    planner_meta: PlannerMeta = Field(default_factory=PlannerMeta, description="What the planner aimed at.")
    review: Review | None = Field(default=None, description="The human decision, when the run asks for one.")
    applied: list[AppliedGroup] = Field(default_factory=list, description="Per-group pruning as applied.")
    pruned: ArtifactRef | None = Field(default=None, description="The pruned fp32 model.")
    macs: int | None = Field(default=None, description="MACs of one image after pruning.")
    params_before: int | None = Field(default=None, description="Parameters before pruning.")
    params_after: int | None = Field(default=None, description="Parameters after pruning.")
    token_schedule: list[int] | None = Field(default=None, description="Tokens merged after each layer (None: none).")
    recovery: RecoveryRecord | None = Field(default=None, description="What the recover step did.")
    recovered: ArtifactRef | None = Field(default=None, description="The pruned model after recovery (fp32).")
    quantized: list[str] = Field(default_factory=list, description="Modules dynamically quantized.")
    artifact: ArtifactRef | None = Field(default=None, description="The torch candidate (the plan's quantization).")
    delivered: ArtifactRef | None = Field(default=None, description="The delivered form when not `artifact`.")
    eval: EvalRecord | None = Field(default=None, description="Its measurements.")
    error: str | None = Field(default=None, description="Why it failed or was skipped.")
    check: RoundCheck | None = Field(default=None, description="The plan's predictions beside the measurements.")


class Best(Candidate):
    """The best candidate so far, with the rule's verdict on it."""

    rule: str = Field(description="The selection rule (paper or budget).")
    within_budget: bool = Field(description="Its accuracy drop is within max_acc_drop.")
    reduction: float = Field(description="Fractional reduction of the objective's target.")
    accuracy_drop: float = Field(description="Top-1 points lost against the baseline.")
    ci_crosses_budget: bool = Field(default=False, description="Within budget, but its 95% interval reaches past.")


class TestEval(Strict):
    """Baseline and delivered model on the held-out test images, which no plan, probe or selection saw."""

    split: str = Field(description="Split the test images come from.")
    n_samples: int = Field(description="Test images.")
    device: str = Field(default="cpu", description="Device both accuracy passes ran on.")
    baseline_accuracy: float = Field(description="Baseline top-1 on the test images, %.")
    best_iteration: int | None = Field(default=None, description="The delivered candidate (None: none finished).")
    best_accuracy: float | None = Field(default=None, description="Delivered model's top-1 on the test images, %.")
    agreement: float | None = Field(default=None, description="Percent of test predictions equal to the baseline's.")
    delta: float | None = Field(default=None, description="best_accuracy - baseline_accuracy, pp.")
    delta_ci: list[float] | None = Field(default=None, description="Paired bootstrap 95% interval of delta, pp.")


class ReportRef(Strict):
    """Where the report files are, relative to the run folder."""

    markdown: str
    html: str | None = None
    plots: list[str] = Field(default_factory=list)
    result: str = "result.json"
    best: str | None = Field(default=None, description="The delivered model's folder.")
