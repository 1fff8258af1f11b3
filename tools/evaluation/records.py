"""Typed records handed between the evaluation stages: what to build and measure, how, and what came out."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from profiling_agent.state import Context, Objective, VariantRecord
from profiling_agent.tools.evaluation.scoring import ScoringRule
from profiling_agent.tools.recovery.distributed_launch import DEFAULT_LAUNCHER
from profiling_agent.tools.runtimes.onnx_forms import Variant

TorchForms = Mapping[str, tuple[str, int, str | None]]  # record name -> (model key, size bytes, recorded path)
Scorer = Callable[[list[str]], dict[str, float]]  # scores the named models (not scored yet) and returns all accuracies
Retry = Callable[[dict[str, float], Scorer], dict[str, nn.Module]]  # accuracies, scorer -> models to replace
Predictor = Callable[[Mapping[str, nn.Module]], dict[str, torch.Tensor]]  # models -> predictions on the images


@dataclass(frozen=True)
class MeasureSettings:
    """How models are measured: latency batch and repeats, accuracy batch, where and with how many threads.

    Attributes:
        latency_batch: The larger latency batch.
        eval_batch: Batch size of the accuracy pass.
        warmup: Warm-up passes before timing.
        repeats: Timed repeats (median reported).
        device: Where torch models run (forms run on the CPU).
        threads: Threads of every runtime.
        allowed_ids: Model ids predictions are restricted to.
        procs: Processes the accuracy pass is split over (>1: `sharded.run_pass`, the same predictions).
        launcher: Command starting that job ({procs}).
    """

    latency_batch: int
    eval_batch: int
    warmup: int
    repeats: int
    device: str = "cpu"
    threads: int = 1
    allowed_ids: list[int] | None = None
    procs: int = 1
    launcher: str = DEFAULT_LAUNCHER

    @classmethod
    def of(cls, ctx: Context, device: str, threads: int, allowed_ids: list[int] | None = None) -> MeasureSettings:
        """Take a run's latency, accuracy-batch and process settings from its Context."""
        return cls(
            latency_batch=ctx.latency_batch,
            eval_batch=ctx.eval_batch,
            warmup=ctx.latency_warmup,
            repeats=ctx.latency_repeats,
            device=device,
            threads=threads,
            allowed_ids=allowed_ids,
            procs=ctx.recover_procs,
            launcher=ctx.launcher,
        )


@dataclass(frozen=True)
class MeasureOptions:
    """What `measure_forms` does beyond timing and scoring every model.

    Attributes:
        timed: Names to time (None: all; the baseline always is).
        parallel: Models predicting concurrently in the accuracy pass (1: one after the other).
        retry: Called with every scored model's accuracy after the accuracy pass, and a scorer for a model whose
            pass was left out; returns models to replace (rebuilt forms, e.g. an accuracy-controlled INT8), which
            are predicted again and then timed again with the others.
        time_only: Models timed beside the others but not predicted (their accuracy is known: the peer).
        predict: Predicts models on the images for the accuracy pass (None: `predict_many` in this process; a
            sharded pass gives the same predictions). A retry's rebuilt models are predicted in this process.
        known: Predictions already made on these images (the baseline's): timed but not predicted again.
        scoring: Which models' passes may be left out (None: every model is scored).
        stand_ins: Torch model -> FP32 forms of the same weights whose logits matched it within the FP32
            tolerance: the fastest of them, when timed faster than the torch model, predicts for it (timing
            facts' "predicted_by" names it).
    """

    timed: Sequence[str] | None = None
    parallel: int = 1
    retry: Retry | None = None
    time_only: Mapping[str, nn.Module] | None = None
    predict: Predictor | None = None
    known: Mapping[str, torch.Tensor] | None = None
    scoring: ScoringRule | None = None
    stand_ins: Mapping[str, Sequence[str]] | None = None


@dataclass(frozen=True)
class EvalImages:
    """The images a measurement reads: validation (tensor or ImageStream) with labels, and calibration."""

    pixels: Any
    labels: torch.Tensor
    calib_pixels: torch.Tensor | None = None


@dataclass(frozen=True)
class FormsPlan:
    """What `evaluate_forms` builds, measures and records.

    Attributes:
        fp32: The FP32 model the forms are built from.
        forms: Form names (forms.ALL_FORMS) to build.
        images: Validation and calibration images.
        out_dir: Parent folder of the forms.
        rel: Turns a form folder into the path recorded in state (run-relative).
        objective: The budget (the INT8 retry, the scoring rule) and target.
        torch_forms: Torch forms recorded as variants: record name -> (model key, size bytes, path).
        processor: Saved into each form's folder.
        extra: JSON facts for each recipe.
        check_images: Validation images each form's logits are checked on against torch.
        untimed: Model keys predicted but not timed.
        peer: The quantization-only peer (the baseline's fastest form), timed beside as "unpruned_<name>".
        peer_root: Folder the peer's recorded path is relative to.
        run: The run folder (its prepared images); with `model_paths` and `procs` > 1 the validation pass is
            split over processes (the same predictions).
        model_paths: Where each measured model is saved (every one must be for a split pass).
        known: Predictions already made on these images (the baseline's): not predicted again.
        eligible: The forms the run may deliver (None: all). With a latency target, slow forms are scored only
            while they could still be delivered (`scoring.ScoringRule`); under a size target every form is.
        sources: Forms built only because the others start from their file: recorded, neither timed nor scored.
        source_note: Why the sources were neither timed nor scored (their records' `error`; None: a round's
            `form_eval.SOURCE_ONLY`).
    """

    fp32: nn.Module
    forms: Sequence[str]
    images: EvalImages
    out_dir: Path
    rel: Callable[[Path], str]
    objective: Objective
    torch_forms: TorchForms
    processor: Any = None
    extra: Mapping[str, Any] | None = None
    check_images: int = 32
    untimed: Sequence[str] = ()
    peer: Mapping[str, Any] | None = None
    peer_root: Path | None = None
    run: Path | None = None
    model_paths: Mapping[str, Path] | None = None
    known: Mapping[str, torch.Tensor] | None = None
    eligible: Sequence[str] | None = None
    sources: Sequence[str] = ()
    source_note: str | None = None


@dataclass(frozen=True)
class FormsMeasurement:
    """What `evaluate_forms` measured.

    Attributes:
        measured: `measure_forms`' rows: model key -> preds, accuracy, agreement, latencies and speed-ups.
        timing: The timing facts (busy flag, attempts, left-out passes, the peer's key).
        variants: Every form's record, torch forms first.
        built: The runtime forms as built (status, error, recipe, model).
        peer_key: The peer's key in `measured` ("unpruned_<form>"), None when it was not timed.
        line: One line: each form's speed-up and accuracy.
        notice: What the timing facts say (split pass, busy machine, re-measured), "" when nothing.
        samples: Form name -> its per-repeat batch-1 samples of this timing, ms (`ties.fastest_form`'s tie rule).
    """

    measured: dict[str, dict[str, Any]]
    timing: dict[str, Any]
    variants: list[VariantRecord]
    built: list[Variant]
    peer_key: str | None
    line: str
    notice: str
    samples: dict[str, list[float | None]] = field(default_factory=dict)


@dataclass(frozen=True)
class CandidateModels:
    """What one round measures, loaded: the baseline, the candidate's torch forms and the one-shot weights.

    Attributes:
        models: Model key -> torch model ("baseline", the plan's torch form, torch_fp32, unrecovered).
        paths: Model key -> its saved artifact.
        fp32: The FP32 model the runtimes convert.
        torch_name: The plan's torch form ("torch_fp32" or "torch_<dtype>").
        torch_forms: Torch forms recorded as variants (`FormsPlan.torch_forms`).
        processor: The candidate's image processor.
    """

    models: dict[str, nn.Module]
    paths: dict[str, Path]
    fp32: nn.Module
    torch_name: str
    torch_forms: dict[str, tuple[str, int, str | None]] = field(default_factory=dict)
    processor: Any = None


@dataclass(frozen=True)
class CandidateRound:
    """Where and on what a round's candidate is measured.

    Attributes:
        root: The run folder (artifact paths are relative to it).
        tensors: The run's validation and calibration images (`eval_pixels`, `eval_labels`, `calib_pixels`).
        iteration: This round (its folder holds the forms built).
        seed: Seed of the paired bootstrap.
        allowed_ids: Model ids predictions are restricted to.
        progress: Called with (done, total, label) before and after the measurement.
    """

    root: Path
    tensors: Mapping[str, Any]
    iteration: int
    seed: int = 0
    allowed_ids: list[int] | None = None
    progress: Callable[[int, int, str], None] | None = None
