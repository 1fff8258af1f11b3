"""Typed, JSON-only shared state of the graph and the schemas of plans, records and artifacts."""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_serializer, model_validator

EMBEDDED_MODEL = "embedded:vit-digits"
EMBEDDED_DATASET = "embedded:digits"

PruneType = Literal["structured", "head", "block"]
QuantDtype = Literal["qint8", "float16"]
QuantizeChoice = Literal["qint8", "float16", "none"]
PlannerChoice = Literal["deterministic", "llm", "auto", "l1", "l2", "random"]
BaselinePlanner = Literal["l1", "l2", "random"]
BASELINE_PLANNERS: tuple[BaselinePlanner, ...] = ("l1", "l2", "random")  # uniform baselines (compression/baselines.py)
SelectRule = Literal["paper", "budget"]
TargetMetric = Literal["params", "macs", "latency", "size"]
BackendChoice = Literal["torch", "onnxruntime", "auto"]


def _subset_size(value: int) -> int:
    if 0 < value < 8:
        raise ValueError("Input should be 0 (the whole split) or at least 8")
    return value


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _Ref(_Strict):
    """A reference that may also be given as its bare string."""

    @model_validator(mode="before")
    @classmethod
    def _from_string(cls, data: Any) -> Any:
        return {"ref": data} if isinstance(data, str) else data


# ---------------------------------------------------------------- run inputs ("what")


class ModelRef(_Ref):
    """Which model to compress."""

    ref: str = Field(default=EMBEDDED_MODEL, description="Hub id, save_pretrained/artifact folder, embedded:NAME.")
    revision: str | None = Field(default=None, description="Hub revision (branch, tag or commit).")
    trust_remote_code: bool = Field(default=False, description="Allow custom modelling code from the hub.")


class DatasetRef(_Ref):
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


class Objective(_Strict):
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
    quantize: QuantizeChoice = Field(default="qint8", description="Dynamic quantization added to each plan.")
    planner: PlannerChoice = Field(default="auto", description="deterministic, llm, auto, or l1/l2/random + ratio.")
    ratio: float | None = Field(
        default=None, gt=0.0, lt=1.0, description="Uniform ratio of the l1/l2/random baselines (required by them)."
    )
    approve: bool = Field(default=False, description="Pause before each plan: approve, edit or reject it.")
    depth: bool | None = Field(default=None, description="Remove whole blocks too (None: under a latency target).")

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
    type: PruneType = Field(description="structured: conv/MLP channels; head: attention heads; block: a whole block.")
    ratio: float = Field(gt=0.0, le=1.0, description="Fraction of channels or heads removed per group; 1.0: a block.")
    justification: str = Field(default="", description="Why, grounded in the profile.")

    @model_validator(mode="after")
    def _whole_blocks(self) -> PruneEntry:
        if (self.type == "block") != (self.ratio == 1.0):  # a block goes whole; channels and heads never all go
            must = "1.0 (a block is removed whole)" if self.type == "block" else "below 1.0 (type 'block' removes one)"
            raise ValueError(f"a {self.type} entry's ratio must be {must}, not {self.ratio:g}")
        return self


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
# Everything below moves through the graph as plain JSON (nodes return `model_dump()` dicts, so checkpoints
# hold JSON); the State validates it back into these models, so every field that flows is declared here.


class ArtifactRef(_Strict):
    """A model saved on disk, described well enough to check and reload it."""

    path: str = Field(description="Folder, relative to the run folder.")
    sha256: str = Field(description="sha256 over the folder's files (sorted names and contents).")
    size_bytes: int = Field(description="Bytes of the weights file on disk.")
    params: int = Field(description="Logical parameter count (quantized weights counted once).")


class LabelMap(_Strict):
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


class DataRef(_Strict):
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


class InputShape(_Strict):
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


class BackendSummary(_Strict):
    """The deliverable forms' per-node profile, condensed (the full one is profile.json's backend_profile)."""

    planned_on: str = "torch"  # the form whose latency shares the planners read
    forms_ms: dict[str, float] = Field(default_factory=dict)  # batch-1 node-time total per profiled form, ms
    failed: dict[str, str] = Field(default_factory=dict)  # forms that could not be profiled, and why
    latency_table: str | None = None  # the form a per-group latency table was measured on
    notes: list[str] = Field(default_factory=list)  # runtimes left out, and why


class ProfileSummary(_Strict):
    """The compact profile kept in the state (the full one is profile.json)."""

    path: str = Field(default="profile.json", description="The full profile, relative to the run folder.")
    totals: dict[str, int | float | None] = Field(default_factory=dict, description="params, macs (None: unknown), ...")
    env: dict[str, Any] = Field(default_factory=dict, description="Device, threads, batch and input shape.")
    groups: dict[str, Any] = Field(default_factory=dict, description="Per prunable group: columns and rows.")
    operators: list[dict[str, Any]] = Field(default_factory=list, description="Top operators (torch.profiler).")
    top_latency: list[dict[str, Any]] = Field(default_factory=list, description="Layers by self time.")
    top_macs: list[dict[str, Any]] = Field(default_factory=list, description="Layers by MACs.")
    error: str | None = Field(default=None, description="Why MACs are unknown (the counter failed on this model).")
    backend: BackendSummary | None = Field(default=None, description="The deliverable forms' profile (CPU runs).")


class GroupSensitivity(_Strict):
    """How far one prunable group, pruned alone, moves the predictions on the calibration images."""

    kl: float | None = Field(default=None, description="Mean KL divergence from the unpruned model's predictions.")
    agreement: float | None = Field(default=None, description="Percent of predictions unchanged.")
    acc_drop: float | None = Field(default=None, description="Top-1 points lost on the calibration images.")
    damage: float = Field(description="The probe's combined damage score (planners divide cost by it).")
    units_removed: int = Field(default=0, description="Channels or heads the probe removed.")
    ratio: float = Field(description="Ratio the probe pruned at.")
    error: str | None = Field(default=None, description="Why the probe could not prune it: an unprunable group.")


class VariantRecord(_Strict):
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


class EvalRecord(_Strict):
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


class LLMStep(_Strict):
    """What one LLM planning step did (never the API key): its model, outcome, transcript and token usage."""

    model: str = Field(default="", description="The chat model.")
    planner: str = Field(default="", description="llm, or deterministic when the LLM's plan was refused.")
    transcript: str | None = Field(default=None, description="The step's JSONL transcript, relative to the run.")
    usage: dict[str, int] = Field(default_factory=dict, description="calls, input/output/total tokens.")
    tool_errors: list[dict[str, str]] = Field(default_factory=list, description="Tool calls refused or failed.")
    structured: dict[str, Any] = Field(default_factory=dict, description="Structured-output mode tried and found.")
    vs_proposal: str | None = Field(default=None, description="The applied plan against the proposal, in words.")
    applied: str = Field(default="", description="applied, edited, copied or replaced (the LLM's plan), and why.")


class ProposalDiff(_Strict):
    """What the LLM's applied plan changed relative to the closest proposal it was offered this step.

    verdict: "copied" (no change), "edited" (at most one change per proposed group) or "own" (more, or no proposal).
    """

    verdict: Literal["copied", "edited", "own"] = Field(description="copied, edited or own.")
    changes: int = Field(default=0, description="Groups added or removed, ratios changed, quantization changed.")
    proposals: int = Field(default=0, description="Proposals the LLM asked for in this step.")
    goal: float | None = Field(default=None, description="Goal of the proposal compared against.")
    emphasis: str | None = Field(default=None, description="Emphasis of that proposal.")
    added: list[str] = Field(default_factory=list, description="Groups the LLM pruned that the proposal did not.")
    removed: list[str] = Field(default_factory=list, description="Proposed groups the LLM left unpruned.")
    ratios: dict[str, list[float]] = Field(default_factory=dict, description="Group -> [proposed, LLM's] ratio.")
    quantization: str = Field(default="", description="How quantization changed ('' when it did not).")

    def label(self) -> str:
        """Return "copied", "edited (n changes)" or "own" for tables and the console."""
        return f"edited ({self.changes} changes)" if self.verdict == "edited" else self.verdict


class BackoffTrial(_Strict):
    """One round-1 trial of a whole plan on the calibration images (`planning/backoff.py`)."""

    goal: float = Field(description="The goal the plan was made for.")
    calib_drop_pp: float = Field(description="Calibration accuracy lost, pp.")
    params_reduction: float | None = Field(default=None, description="Parameters removed, fraction.")


class BackoffRecord(_Strict):
    """Round 1's back-off: the goal kept, the calibration drop allowed, and the trials that chose it."""

    cap_pp: float = Field(description="Largest calibration accuracy drop accepted, pp.")
    kept_goal: float = Field(description="The goal round 1 planned for.")
    trials: list[BackoffTrial] = Field(default_factory=list, description="The trials, the planner's own goal first.")


class SearchTrial(_Strict):
    """One calibration trial of a searching round (`planning/search.py`)."""

    goal: float = Field(description="The goal the plan was made for.")
    predicted_pp: float = Field(description="Calibration accuracy lost, pp.")
    corrected_pp: float = Field(description="That loss times the correction, pp.")


class SearchRecord(_Strict):
    """A searching round: the measured interval, the correction of the trials' loss, the trials and the goal."""

    goal: float = Field(description="The goal planned for.")
    interval: list[float] = Field(description="[largest goal that kept the budget, smallest that missed it].")
    correction: float = Field(description="Validation loss / calibration trial loss, from the rounds so far.")
    cap_pp: float = Field(description="The calibration loss a trial may show, pp.")
    trials: list[SearchTrial] = Field(default_factory=list, description="The calibration trials.")
    why: str = Field(default="", description="One sentence for the plan's rationale.")


class BlockTrial(_Strict):
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


class PlannerMeta(_Strict):
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
    predicted_drop: float | None = Field(default=None, description="Calibration trial's loss of this plan, pp.")
    search: SearchRecord | None = Field(default=None, description="Searching round: interval, correction, trials.")
    block_trials: list[BlockTrial] | None = Field(default=None, description="Round 1's block sets tried.")


class Review(_Strict):
    """A human decision on a plan (objective.approve)."""

    decision: Literal["approve", "reject", "edit"]
    proposed_by: str = Field(description="Planner that proposed the plan.")
    estimate: dict[str, float] | None = Field(default=None, description="Estimated reductions of an edited plan.")


class RecoveryRecord(_Strict):
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


class RoundCheck(_Strict):
    """A round's predictions (calibration trial; latency model of the planned form) beside its measurements."""

    predicted_drop_pp: float | None = None  # the calibration trial's accuracy loss, pp
    measured_drop_pp: float | None = None  # validation's loss after recovery, pp
    correction: float | None = None  # measured over predicted loss, carried to the next round
    latency_form: str | None = None  # the delivered form the latency reduction was measured on
    predicted_latency_reduction: float | None = None  # the plan's estimate on the planned form
    measured_latency_reduction: float | None = None  # against the unpruned model in the same form
    latency_error: float | None = None  # measured minus predicted
    latency_against: str | None = None  # where the unpruned form's latency came from


class AppliedGroup(_Strict):
    """What pruning did to one matched group (the removed unit indices stay in the pruned artifact's JSON)."""

    group: str = Field(description="Prunable group name.")
    module: str = Field(description="The group's module.")
    kind: PruneType = Field(description="structured (channels), head (attention heads) or block (a whole block).")
    ratio: float = Field(description="The plan's ratio for it.")
    units_before: int = Field(description="Units (channels or heads) before pruning.")
    units_after: int = Field(description="Units left.")


class Candidate(_Strict):
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


class TestEval(_Strict):
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


class Fallback(_Strict):
    """A round whose LLM plan was refused, and why (the deterministic plan was applied instead)."""

    iteration: int = Field(default=0, description="The round.")
    stage: str = Field(description="parse, guard, timeout, error or tool_loop.")
    reason: str = Field(description="What was wrong.")
    rejected: list[dict[str, Any]] = Field(default_factory=list, description="The refused answers and reasons.")
    tool_errors: list[dict[str, Any]] = Field(default_factory=list, description="Tool calls refused or failed.")
    model: str = Field(default="", description="The LLM.")


class ReportRef(_Strict):
    """Where the report files are, relative to the run folder."""

    markdown: str
    html: str | None = None
    plots: list[str] = Field(default_factory=list)
    result: str = "result.json"
    best: str | None = Field(default=None, description="The delivered model's folder.")


class PlannerMode(_Strict):
    """How the objective's planner choice resolved against the configuration."""

    requested: str = Field(description="The objective's planner (auto, llm, deterministic, l1/l2/random).")
    mode: str = Field(description="What plans the rounds: llm (beside the deterministic reference) or that planner.")
    note: str = Field(default="", description="Why, in words (the endpoint, or the missing setting).")


class StateSchemaError(Exception):
    """A checkpoint holds a key this version does not know (written by another version, or damaged): one line."""


# keys older versions wrote in history events -> today's field
LEGACY_HISTORY_KEYS = {"planner": "planner_choice"}


class HistoryEvent(_Strict):
    """One node step: which node, which iteration, when, what it did, and the facts some nodes add."""

    node: str
    iteration: int = 0
    time: float
    message: str
    rationale: str | None = Field(default=None, description="analyze: the plan's rationale.")
    planner_choice: PlannerMode | None = Field(default=None, description="analyze: how the planner choice resolved.")
    llm: LLMStep | None = Field(default=None, description="analyze: the round's LLM step, when an LLM was asked.")
    safe_adapter: bool | None = Field(default=None, description="acquire: the family adapter is a tested one.")

    @model_validator(mode="before")
    @classmethod
    def _known_keys(cls, data: Any) -> Any:
        """Map the keys older versions wrote to today's fields; refuse an unknown key in one line naming it."""
        if not isinstance(data, dict):
            return data
        data = {LEGACY_HISTORY_KEYS.get(k, k): v for k, v in data.items()}
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
    threads: int = _ctx(0, "Threads for profiling (0: torch's default) and for measuring forms (0: one, fair).")
    llm_model: str = _ctx("gpt-4o", "Chat model name on the OpenAI-compatible endpoint.")
    llm_base_url: str = _ctx("", "OpenAI-compatible base URL (default: $OPENAI_BASE_URL).")
    llm_api_key_env: str = _ctx("OPENAI_API_KEY", "Environment variable holding the API key (never stored).")
    llm_temperature: float = _ctx(0.0, "Sampling temperature of the LLM planner.")
    llm_timeout: float = _ctx(60.0, "Seconds before one LLM request times out.")
    llm_retries: int = _ctx(2, "Times an invalid LLM plan goes back to the LLM before the fallback.")
    llm_tool_rounds: int = _ctx(6, "Tool-call rounds allowed per planning step.")
    llm_max_tokens: int = _ctx(2048, "Most tokens one LLM reply may have (a rambling small model stops there).")
    llm_structured: Literal["auto", "json_schema", "json_object", "off"] = _ctx(
        "auto", "Schema-constrained final answers (json_schema, json_object + schema, off); auto asks the server."
    )
    latency_warmup: int = _ctx(3, "Warm-up forward passes before timing.")
    latency_repeats: int = _ctx(15, "Timed repeats; the median is reported.")
    latency_batch: int = _ctx(16, "Batch size of the larger-batch latency.")
    eval_batch: int = _ctx(64, "Batch size for accuracy evaluation.")
    probe_ratio: float = _ctx(0.3, "Ratio each group is pruned at by the sensitivity probe.")
    importance: str = _ctx("l2", "Channel/head importance: l2, l1 or random.")
    recover: str = _ctx("auto", "Recovery after pruning: none, reconstruct, distill or auto (both when it can).")
    recover_steps: int = _ctx(0, "Distillation steps (0: scaled to the training images and the model size).")
    recover_minutes: float = _ctx(2.0, "Wall-clock cap of one candidate's distillation, minutes (0: none).")
    recover_lr: float = _ctx(0.0, "Peak AdamW learning rate of distillation (0: 3e-4, 1e-3 after removing blocks).")
    recover_batch: int = _ctx(0, "Images per distillation step (0: 32, 64 after removing blocks).")
    recover_augment: bool = _ctx(True, "Augment training images (random resized crop; flips for RGB images).")
    recover_procs: int = _ctx(1, "Processes distillation runs on (>1: a torch.distributed job; docs/distributed.md).")
    launcher: str = _ctx("torchrun --standalone --nproc-per-node {procs}", "Command starting that job ({procs}).")
    backend: str = _ctx("auto", "torch, onnxruntime, openvino or auto (every form): the fastest within budget ships.")

    @classmethod
    def of(cls, values: dict[str, Any]) -> Context:
        """Build from a dict; keys that are not settings (another version's) are ignored."""
        return cls(**{k: v for k, v in values.items() if k in cls.__dataclass_fields__})
