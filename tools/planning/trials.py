"""Trials of whole plans on the validation trial slice: what they need (TrialSetup), the recipe, and the evaluators."""

from __future__ import annotations

import hashlib
import json
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from profiling_agent.state import ArtifactRef, CompressionPlan, DataRef, DatasetRef, InputShape, LabelMap, Trial
from profiling_agent.tools.compression.quantization import quantize_model
from profiling_agent.tools.compression.self_check import self_check
from profiling_agent.tools.compression.token_merge import layer_count, merge_planned
from profiling_agent.tools.compression.units import as_importance
from profiling_agent.tools.data.stream import open_run_data
from profiling_agent.tools.data.train_stream import TrainBatches, run_train_source
from profiling_agent.tools.data.trial_slice import open_trial_slice
from profiling_agent.tools.evaluation.baseline_logits import kept_baseline_logits
from profiling_agent.tools.evaluation.metrics import agreement, class_ids, mean_kl, predict, top1
from profiling_agent.tools.io import hash_tensor
from profiling_agent.tools.models.artifact_load import load_artifact, load_processor
from profiling_agent.tools.models.sizes import count_params
from profiling_agent.tools.planning.block_trials import TRIAL_STEPS
from profiling_agent.tools.planning.error_model import trial_interval
from profiling_agent.tools.recovery import refit_cache
from profiling_agent.tools.recovery.distill import DistillConfig
from profiling_agent.tools.recovery.distill import distill as distill_model
from profiling_agent.tools.recovery.policy import LARGE_MODEL, auto_recipe
from profiling_agent.tools.recovery.reconstruct import reconstruct
from profiling_agent.tools.runtimes.forward import batched_logits

MAX_EVALUATIONS = 3  # evaluate_plan calls allowed per planning step (each one prunes a copy of the model)
# a plan in, its trial on the trial slice out (`PlanEvaluator`)
Evaluate = Callable[[CompressionPlan], Trial]
# recover(pruned model, applied rows) and on_trial(plan, model, applied rows): `PlanEvaluator`'s hooks
RecoverHook = Callable[[Any, list[Any]], None]
TrialHook = Callable[[CompressionPlan, Any, list[Any]], None]


@dataclass
class Reference:
    """The baseline's predictions and logits on the trial slice and its parameter count (`PlanEvaluator.reference`)."""

    preds: Any
    logits: Any
    params: int


REFERENCES_KEPT = 4  # baseline references held in this process (a run's round builds several evaluators)
_references: OrderedDict[str, Reference] = OrderedDict()


def reference_key(baseline_sha: str, pixels: Any, allowed_ids: list[int] | None, with_kl: bool) -> str:
    """Return what the baseline's reference on a slice depends on, hashed.

    That is the baseline, the images, the labels the argmax may choose and whether logits are kept: evaluators with
    one key predict the baseline once in this process.
    """
    digest = hashlib.sha256()
    digest.update(json.dumps({"baseline": baseline_sha, "allowed": allowed_ids, "kl": with_kl}).encode())
    hash_tensor(digest, pixels)
    return digest.hexdigest()


def trial_key(plan: CompressionPlan) -> str:
    """Return what a plan's trial depends on, as canonical JSON: its entries without their words.

    The pruning rows as the refit cache keys them (`refit_cache.plan_key`), the quantization and token entries:
    two plans that prune, quantize and merge alike have the same trial, whatever their justification or rationale.
    """
    words = {"justification"}
    quantization = [e.model_dump(mode="json", exclude=words) for e in plan.quantization]
    tokens = plan.tokens.model_dump(mode="json", exclude=words) if plan.tokens else None
    return json.dumps([refit_cache.plan_key(plan.pruning), quantization, tokens], sort_keys=True)


@dataclass(frozen=True)
class RecipeSettings:
    """The run's distillation settings; 0 leaves a value to the recipe rule (`trial_recipe`)."""

    lr: float = 0.0  # peak learning rate
    batch: int = 0  # images per step
    steps: int = 0  # distillation steps of a candidate
    augment: bool = True  # random resized crops (and flips) of the training images


@dataclass(frozen=True)
class TrialSetup:
    """What a trial of a plan needs, read from the run by the analyze step.

    Attributes:
        run_path: The run folder (artifact and data paths are relative to it).
        baseline: The untouched baseline artifact (folder, sha256, parameters); None before acquire.
        data: The prepared images (validation and calibration rows); None before prepare_data (a trial then fails).
        dataset: The dataset (seed, splits: where the training images come from).
        labels: Dataset labels -> model class ids (allowed ids, image and label columns).
        input_shape: The model's input shape (the training images' size).
        importance: Channel/head importance of pruning (l2, l1, random).
        recover: The run's recovery (none, reconstruct, distill, auto): trials do at least its refit.
        recipe: The run's distillation settings.
    """

    run_path: Path
    baseline: ArtifactRef | None
    data: DataRef | None
    dataset: DatasetRef
    labels: LabelMap | None = None
    input_shape: InputShape | None = None
    importance: str = "l2"
    recover: str = "auto"
    recipe: RecipeSettings = field(default_factory=RecipeSettings)

    @property
    def seed(self) -> int:
        """The run's seed (pruning, refit and distillation of every trial)."""
        return self.dataset.seed

    @property
    def allowed_ids(self) -> list[int] | None:
        """The model ids predictions are restricted to (the dataset's classes), or None for all."""
        return self.labels.allowed_ids if self.labels else None

    @property
    def distills(self) -> bool:
        """True when the run's recovery distils (auto or distill)."""
        return self.recover in ("auto", "distill")


def baseline_dir(setup: TrialSetup) -> Path:
    """Return the baseline artifact's folder."""
    if setup.baseline is None:
        raise RuntimeError("no artifact to load: the step that saves it has not run")
    return Path(setup.run_path) / setup.baseline.path


def load_baseline(setup: TrialSetup) -> Any:
    """Load a fresh copy of the untouched baseline model."""
    return load_artifact(baseline_dir(setup), device="cpu").model


def calibration(setup: TrialSetup) -> tuple[Any, Any]:
    """Return the calibration images (N, C, H, W), preprocessed as the baseline's processor does, and their labels."""
    if setup.data is None:
        raise RuntimeError("no prepared data: the prepare_data node has not run")
    processor = load_processor(baseline_dir(setup)) if setup.baseline else None
    tensors = open_run_data(
        setup.run_path,
        parts=("calib",),
        processor=processor,
        data_file=setup.data.path,
        image_column=setup.data.image_column,
    )
    return tensors["calib_pixels"], tensors["calib_labels"]


def trial_slice(setup: TrialSetup) -> tuple[Any, Any]:
    """Return the trial slice's images (N, C, H, W) and labels: the validation rows subsets.json names `trial`.

    Every accuracy prediction that steers a plan is measured here, on images the model never trained on (the
    calibration images may come from the training split); the rows are `subsets.trial_rows` of the validation rows.
    """
    if setup.data is None:
        raise RuntimeError("no prepared data: the prepare_data node has not run")
    processor = load_processor(baseline_dir(setup)) if setup.baseline else None
    return open_trial_slice(
        setup.run_path,
        seed=setup.seed,
        processor=processor,
        data_file=setup.data.path,
        image_column=setup.data.image_column,
    )


def training_source(setup: TrialSetup) -> Any:
    """Find the images distillation may train on (never a validation, test or calibration image), or None."""
    assert setup.labels is not None
    return run_train_source(setup.run_path, setup.data, setup.dataset, setup.labels)


def trial_recipe(setup: TrialSetup, params: int) -> tuple[float, int, int]:
    """Return a block-set trial's (learning rate, batch, steps): the recipe rule of its short distillation.

    The learning rate and batch are the run's, else those of a plan that removed blocks (`auto_recipe`); the steps
    are TRIAL_STEPS, never more than the run's own.
    """
    lr, batch = auto_recipe(setup.recipe.lr, setup.recipe.batch, params, removed_blocks=1)
    steps = min(TRIAL_STEPS, setup.recipe.steps) if setup.recipe.steps else TRIAL_STEPS
    return lr, batch, steps


@dataclass
class PlanEvaluator:
    """evaluate_plan: apply a plan to a fresh copy of the baseline and measure it on the trial slice.

    Each call loads a fresh baseline, prunes it by the plan (self-checked), quantizes it as the plan says, and
    measures top-1 and agreement on the trial slice (validation rows the model never trained on: `trial_slice`),
    the paired 95% interval of its loss (`error_model.paired_interval`) and the parameter count.

    Attributes:
        load_baseline: Returns a fresh copy of the untouched baseline model.
        pixels: The trial slice's images (N, C, H, W).
        labels: Their labels (model label ids).
        allowed_ids: Label ids the argmax may choose from (None: all).
        importance: Channel/head importance for pruning.
        seed: Seed for pruning.
        max_calls: Evaluations allowed; later calls raise RuntimeError (returned to the LLM as an error).
        recover: Called as recover(pruned model, applied rows) after pruning and before quantization (the run's
            reconstruction), so the metrics are those of a recovered candidate.
        on_trial: Called as on_trial(plan, model, applied rows) after that, before quantization (the analyze step
            keeps the refitted weights for the recover step: `tools/recovery/refit_cache.py`).
        with_kl: Also return `kl_to_baseline`, the mean KL divergence of the trial's logits from the baseline's on
            the trial slice (`metrics.mean_kl`; the predictions then come from the same logits).
        recovery: What a trial does after pruning, as its record says (none, refit, refit+distill).
    """

    load_baseline: Callable[[], Any]
    pixels: Any
    labels: Any
    allowed_ids: list[int] | None = None
    importance: str = "l2"
    seed: int = 0
    max_calls: int = MAX_EVALUATIONS
    recover: RecoverHook | None = None
    on_trial: TrialHook | None = None
    with_kl: bool = False
    recovery: str = "none"
    reference_key: str = ""  # `reference_key`: the baseline's reference is shared by evaluators with this key
    run_path: Path | None = None  # the run folder: the baseline's trial-slice logits are kept there (`baseline_logits`)
    memo: dict[str, Trial] | None = None  # `trial_key` -> its trial, shared by a round's evaluators (`TrialFactory`)
    baseline_sha: str = ""  # the baseline artifact's sha256 (what the kept logits were made by)
    calls: int = field(default=0, init=False)
    _reference: Reference | None = field(default=None, init=False, repr=False)

    def predictions(self, model: Any) -> tuple[Any, Any]:
        """Return the model's predictions on the trial slice, and its logits there when KL is asked for."""
        if not self.with_kl:
            return predict(model, self.pixels, allowed_ids=self.allowed_ids), None
        with torch.inference_mode():
            logits = batched_logits(model, self.pixels)
        return class_ids(logits, self.allowed_ids), logits

    def baseline_predictions(self, model: Any) -> tuple[Any, Any]:
        """Return `predictions` of the baseline, from the logits the run keeps when it has a folder."""
        if self.run_path is None or not self.baseline_sha:
            return self.predictions(model)
        logits = kept_baseline_logits(self.run_path, self.pixels, self.baseline_sha, model)
        return class_ids(logits, self.allowed_ids), logits if self.with_kl else None

    def reference(self) -> Reference:
        """Return the baseline's predictions, logits and parameter count (computed once per `reference_key`)."""
        if self._reference is None:
            held = _references.get(self.reference_key) if self.reference_key else None
            if held is None:
                model = self.load_baseline()
                held = Reference(*self.baseline_predictions(model), count_params(model))
                if self.reference_key:
                    _references[self.reference_key] = held
                    while len(_references) > REFERENCES_KEPT:
                        _references.popitem(last=False)
            self._reference = held
        return self._reference

    def pruned(self, plan: CompressionPlan) -> tuple[Any, list[Any]]:
        """Return a fresh baseline pruned by `plan` (and recovered, then merging its tokens), and the applied rows."""
        from profiling_agent.tools.compression.pruning import (
            prune_model,
        )  # lazy: torch_pruning; nodes.analyze loads this module without it

        model = self.load_baseline()
        example = self.pixels[:1].clone()
        importance = as_importance(self.importance)
        layers = layer_count(model)  # a token schedule names the unpruned layers
        report = prune_model(model, plan.pruning, example, importance=importance, seed=self.seed)
        self_check(model, example, int(model.config.num_labels))
        if self.recover is not None:
            self.recover(model, report.applied)
            self_check(model, example, int(model.config.num_labels))
            if self.on_trial is not None:
                self.on_trial(plan, model, report.applied)
        if merge_planned(model, plan.tokens, layers) is not None:  # after the refit, as the recover step sees it
            self_check(model, example, int(model.config.num_labels))
        return model, report.applied

    def __call__(self, plan: CompressionPlan) -> Trial:
        """Prune, recover and quantize a baseline copy by `plan`; return its trial on the trial slice.

        The accuracy fields keep their names (`calib_accuracy`, ...) for the planners that read them; `judged_on`
        says which images they are, and `interval_pp` is the loss's paired 95% interval.
        """
        if self.calls >= self.max_calls:
            raise RuntimeError(f"evaluation budget used up ({self.max_calls} per step); answer with your plan")
        self.calls += 1
        key = trial_key(plan)
        if self.memo is not None and key in self.memo:  # the same plan, tried earlier in the round: the same trial
            return self.memo[key].model_copy(update={"evaluations_left": self.max_calls - self.calls})
        trial = self.tried(plan)
        if self.memo is not None:
            self.memo[key] = trial
        return trial

    def tried(self, plan: CompressionPlan) -> Trial:
        """Prune, recover and quantize a baseline copy by `plan` and judge it on the trial slice (`__call__`)."""
        started = time.perf_counter()
        ref = self.reference()
        model, applied = self.pruned(plan)
        params = count_params(model)
        quantized, layers = quantize_model(model, plan.quantization)
        preds, logits = self.predictions(quantized)
        base_acc, acc = top1(ref.preds, self.labels), top1(preds, self.labels)
        _, low, high = trial_interval(ref.preds, preds, self.labels)
        return Trial(
            kl_to_baseline=mean_kl(ref.logits, logits, self.allowed_ids) if self.with_kl else None,
            images=int(len(self.labels)),
            judged_on="trial slice of the validation images",
            calib_accuracy=acc,
            baseline_calib_accuracy=base_acc,
            accuracy_drop_pp=base_acc - acc,
            interval_pp=[round(low, 3), round(high, 3)],
            agreement=agreement(preds, ref.preds),
            params=params,
            params_reduction=1 - params / max(ref.params, 1),
            groups_pruned=sum(a.units_before != a.units_after for a in applied),
            quantized_linear_layers=len(layers),
            evaluations_left=self.max_calls - self.calls,
            recovery=self.recovery,
            seconds=round(time.perf_counter() - started, 3),
        )


@dataclass
class TrialRecovery:
    """The recovery a trial does: the refit the recover step will at least do, then (block trials) a distillation.

    The refitted weights of each trial are kept in `refits` for the recover step. The reconstruction fits the
    baseline's activations on the calibration images, never their labels.
    """

    setup: TrialSetup
    calib: Any
    refits: Any = None  # a refit_cache.TrialRefits
    distill: tuple[Any, int, float] | None = None  # (training batches, steps, learning rate)
    last: dict[str, Any] = field(default_factory=dict)

    def recover(self, model: Any, applied: list[Any]) -> None:
        """Refit the pruned model to the baseline's activations, then distil it when asked."""
        teacher = load_baseline(self.setup)
        self.last["info"] = reconstruct(teacher, model, self.calib, applied, seed=self.setup.seed)
        if self.distill is not None:
            batches, steps, lr = self.distill
            distill_model(model, teacher, batches, DistillConfig(steps=steps, lr=lr, seed=self.setup.seed))
            model.eval()

    def on_trial(self, plan: CompressionPlan, model: Any, applied: list[Any]) -> None:
        """Keep the trial's refitted weights under the key the recover step checks."""
        if self.refits is not None and self.setup.baseline is not None:
            key = refit_cache.refit_key(applied, self.calib, self.setup.seed, self.setup.baseline.sha256)
            self.refits.remember(plan.pruning, key, model, self.last.pop("info", {}))


def plan_evaluator(
    setup: TrialSetup,
    max_calls: int | None = None,
    refits: Any = None,
    distill: tuple[Any, int, float] | None = None,
    memo: dict[str, Trial] | None = None,
) -> PlanEvaluator:
    """Build evaluate_plan: a plan on a fresh baseline copy, refit on the calibration images, judged on the trial slice.

    `refits` (a `refit_cache.TrialRefits`) keeps the refitted weights of the last trials for the recover step. With
    `distill` ((training batches, steps, learning rate): `block_evaluator`) each trial is then distilled that many
    steps and also scored by its KL divergence from the baseline. `memo` holds the trials of evaluators built alike:
    a plan tried by one of them is not pruned and refitted again by another.
    """
    pixels, labels = trial_slice(setup)
    hooks = TrialRecovery(setup, calibration(setup)[0], refits, distill) if setup.recover != "none" else None
    return PlanEvaluator(
        lambda: load_baseline(setup),
        pixels,
        labels,
        allowed_ids=setup.allowed_ids,
        importance=setup.importance,
        seed=setup.seed,
        max_calls=max_calls or MAX_EVALUATIONS,
        recover=hooks.recover if hooks else None,
        on_trial=hooks.on_trial if hooks else None,
        with_kl=distill is not None,
        recovery="none" if hooks is None else ("refit+distill" if distill is not None else "refit"),
        reference_key=""
        if setup.baseline is None
        else reference_key(setup.baseline.sha256, pixels, setup.allowed_ids, distill is not None),
        run_path=Path(setup.run_path),
        memo=memo,
        baseline_sha=setup.baseline.sha256 if setup.baseline is not None else "",
    )


def block_evaluator(setup: TrialSetup, calls: int) -> PlanEvaluator | None:
    """Build the evaluator of round 1's block-set trials (refit, then a short distillation: `trial_recipe`), or None.

    None where recovery does not distil, the dataset has no training images, or the baseline has LARGE_MODEL
    parameters or more (a distillation step costs seconds there: `recovery/policy.py`).
    """
    if not setup.distills or setup.baseline is None or setup.labels is None:
        return None
    if setup.baseline.params >= LARGE_MODEL or setup.input_shape is None:
        return None
    source = training_source(setup)
    if source is None:
        return None
    lr, batch, steps = trial_recipe(setup, setup.baseline.params)
    processor = load_processor(baseline_dir(setup))  # the images' preprocessing, not the weights
    batches = TrainBatches(
        source,
        processor,
        setup.input_shape.model_dump(),
        setup.labels.model_dump(),
        batch=batch,
        seed=setup.seed,
        augmentation=setup.recipe.augment,
    )
    return plan_evaluator(setup, max_calls=calls, distill=(batches, steps, lr))


@dataclass(frozen=True)
class TrialFactory:
    """Builds a planning round's evaluators from the run's trial setup (`round.planning_round` calls them).

    Attributes:
        setup: What the trials read from the run.
        refits: Keeps the last trials' refitted weights for the recover step (a `refit_cache.TrialRefits`), or None.
        memo: The round's trials by plan (`plans`).
    """

    setup: TrialSetup
    refits: Any = None
    memo: dict[str, Trial] = field(default_factory=dict)  # the round's trials by plan: tried once, read by each

    def plans(self, calls: int | None) -> PlanEvaluator:
        """Return evaluate_plan allowed `calls` trials (None: MAX_EVALUATIONS), its refits kept in `refits`.

        A plan another of the round's evaluators tried returns that trial (counted as a call, not run again): round
        1 weighs its plan with token merging against pruning alone, then backs off the kept one, whose first trial
        is that same plan (on a full-size ViT-B/16 a trial's prune and refit cost about 130 s on one core).
        """
        return plan_evaluator(self.setup, max_calls=calls, refits=self.refits, memo=self.memo)

    def blocks(self, calls: int) -> PlanEvaluator | None:
        """Return round 1's block-set evaluator allowed `calls` trials, or None where it cannot run."""
        return block_evaluator(self.setup, calls)
