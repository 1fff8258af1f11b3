"""Build a model's backend forms and measure them beside the baseline: the shared work of the evaluation nodes.

`evaluate_forms` is what `measure_baseline` (the unpruned model in every form) and `evaluate` (a candidate in the
forms its round builds, with the quantization-only peer timed beside it) call: build, check, predict, retry an
INT8 form that lost more than the budget, time everything interleaved on a quiet-enough machine, and turn the
numbers into VariantRecords (stages: `build_stage`, `open_peer`, `measure_options`, `measure_forms`,
`record_variants`; typed inputs and output in `records.py`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from profiling_agent.state import Objective, VariantRecord
from profiling_agent.tools.evaluation.contention import flag_reason, flagged, use_run
from profiling_agent.tools.evaluation.delivery import PEER_PREFIX
from profiling_agent.tools.evaluation.metrics import accuracy_batch, concurrent_models
from profiling_agent.tools.evaluation.records import (
    FormsMeasurement,
    FormsPlan,
    MeasureOptions,
    MeasureSettings,
    Retry,
    Scorer,
)
from profiling_agent.tools.evaluation.scoring import ScoringRule
from profiling_agent.tools.evaluation.sharded import run_pass
from profiling_agent.tools.evaluation.variants import measure_forms, recipe_summary, variant_record
from profiling_agent.tools.runtimes.forms import (
    FP32_REFERENCES,
    AccuracyControl,
    build_forms,
    fp32_reference,
    load_form,
    rebuild_int8,
    source_settings,
)
from profiling_agent.tools.runtimes.onnx_forms import FormFiles, Variant
from profiling_agent.tools.runtimes.onnx_model import ONNX_FILE
from profiling_agent.tools.runtimes.openvino_model import OV_FILE

# One thread unless --threads says otherwise: every runtime then gets the same single core (no thread-pool or
# spin-wait differences between torch's OpenMP, ONNX Runtime and OpenVINO), wall time over process CPU time
# measures exactly how busy the machine was, and on a shared 2-core machine the other core is left to the other
# processes (or to the concurrent accuracy pass) instead of making a 2-thread forward collapse.
DEFAULT_THREADS = 1
ACCURACY_CONTROL_IMAGES = 300  # validation images NNCF's accuracy control ranks layers and checks the drop on
SOURCE_ONLY = (
    "built as the source of the other forms only: the unpruned model's form of this kind was not among the forms "
    "that can win (neither timed nor scored)"
)


@contextlib.contextmanager
def eval_threads(threads: int | None) -> Iterator[int]:
    """Set torch's threads for measuring (`threads`, else DEFAULT_THREADS) and restore the previous count after."""
    before = torch.get_num_threads()
    torch.set_num_threads(int(threads or DEFAULT_THREADS))
    try:
        yield torch.get_num_threads()
    finally:
        torch.set_num_threads(before)


def int8_retry(
    built: Sequence[Variant],
    calib: torch.Tensor,
    pixels: Any,
    labels: torch.Tensor,
    objective: Objective,
    allowed: list[int] | None,
    threads: int,
    model_type: str | None,
) -> Retry:
    """Return measure_forms' retry hook: rebuild ov_int8 with NNCF's accuracy control when it lost past the budget.

    The loss is taken against the INT8 form's own FP32 form. When that form's accuracy pass was left out (a slow
    form that cannot ship, `scoring`), it is scored now only if the INT8 form is also outside the run's budget
    against the baseline: within it, the INT8 form can ship as it is, and a rebuild would only make it slower.
    """
    by_name = {v.name: v for v in built}

    def retry(accuracies: dict[str, float], score: Scorer | None = None) -> dict[str, nn.Module]:
        int8 = by_name.get("ov_int8")
        if int8 is None or int8.status != "ok" or "ov_int8" not in accuracies:
            return {}
        own = FP32_REFERENCES[:3]  # the model's own FP32 forms, best first ("baseline" may be another model)
        if score is not None and not any(n in accuracies for n in own):
            base = accuracies.get("baseline")
            if base is not None and base - accuracies["ov_int8"] <= objective.max_acc_drop + 1e-9:
                return {}
            for name in own:  # the first one this round has (a form built only as a source is not among them)
                accuracies = score([name])
                if name in accuracies:
                    break
        ref = fp32_reference({k: v for k, v in accuracies.items() if k != "ov_int8"})
        if ref is None:
            return {}
        drop = accuracies[ref] - accuracies["ov_int8"]
        if drop <= objective.max_acc_drop + 1e-9:
            return {}
        fp32 = by_name.get("ov_fp32")
        source = by_name.get("ort_fp32")
        if fp32 is not None and fp32.status == "ok" and fp32.path:
            fp32_file = Path(fp32.path) / OV_FILE
        elif source is not None and source.status == "ok" and source.path:
            fp32_file = Path(source.path) / ONNX_FILE
        else:
            return {}
        n = min(ACCURACY_CONTROL_IMAGES, len(labels))
        before = int8.model
        rebuild_int8(
            int8,
            fp32_file,
            calib,
            (pixels[:n], labels[:n]),
            control=AccuracyControl(objective.max_acc_drop, drop, model_type, allowed),
            threads=threads,
        )
        int8.recipe["accuracy_control"]["reference"] = ref
        return {"ov_int8": int8.model} if int8.model is not before else {}

    return retry


def sharded_predictor(
    run: Path, paths: Mapping[str, Path], settings: MeasureSettings, job_dir: Path
) -> Callable[[Mapping[str, nn.Module]], dict[str, torch.Tensor]]:
    """Return measure_forms' `predict`: the run's validation images split over `settings.procs` processes.

    Every rank opens the saved models (`paths`: model key -> artifact or form folder) and predicts whole batches
    of its shard in the batches one process uses, so the predictions are the single process's exactly
    (docs/distributed.md).
    """

    def predict(models: Mapping[str, nn.Module]) -> dict[str, torch.Tensor]:
        return run_pass(run, "eval", {name: paths[name] for name in models}, settings, job_dir=job_dir)

    return predict


def forms_line(variants: Sequence[VariantRecord]) -> str:
    """One line per run step: each form's speed-up and accuracy, or failed / skipped / not scored."""
    parts = []
    for v in variants:
        if v.status == "ok" and v.speedup is not None:
            parts.append(f"{v.name} {v.speedup:.2f}x {v.accuracy:.1f}%")
        elif v.status == "unscored" and v.speedup is not None:
            parts.append(f"{v.name} {v.speedup:.2f}x (slower, not scored)")
        elif v.status == "unscored":
            parts.append(f"{v.name} not timed or scored (built as a source only)")
        else:
            parts.append(f"{v.name} {v.status}")
    return ", ".join(parts)


def timing_notice(timing: Mapping[str, Any] | None) -> str:
    """Say when the validation pass was split over processes and when the timings were busy or taken again.

    Timings taken on a busy machine are flagged; a first busy attempt that was re-measured is said.
    """
    if not timing:
        return ""
    procs = timing.get("accuracy_procs")
    split = f"; validation pass on {procs} processes" if procs else ""

    ratio = timing.get("wall_over_cpu")
    if flagged(timing):
        times = f"measured {len(timing.get('attempts') or [])} times"
        if timing.get("not_remeasured"):
            times = f"measured once: {timing['not_remeasured']}"
        return split + f"; TIMINGS FLAGGED: {flag_reason(timing)} ({times})"
    if timing.get("remeasured"):
        return split + f"; timings re-measured (first attempt busy or contended), kept at wall/CPU {ratio:.2f}"
    return split


def fp32_stand_ins(models: Mapping[str, Any], fp32: Any, built: Sequence[Variant], device: str) -> dict[str, list[str]]:
    """Return the torch model the forms were built from -> its FP32 forms (`measure_forms` stand-ins).

    Those forms' logits matched it on the check images within the FP32 tolerance (or they failed), and the
    fastest of them predicts for it when it was timed faster. Only on the CPU, where the forms run beside it;
    none when no model is `fp32` itself.
    """
    forms = [v.name for v in built if v.status == "ok" and v.method == "fp32" and v.name in models]
    key = next((name for name, model in models.items() if model is fp32), None)
    return {key: forms} if key is not None and forms and str(device).startswith("cpu") else {}


def evaluate_forms(models: dict[str, nn.Module], plan: FormsPlan, settings: MeasureSettings) -> FormsMeasurement:
    """Build the plan's forms of `plan.fp32`, measure them with `models` (which hold "baseline"), record every form.

    Stages: build and check the forms (`build_stage`), open the peer, set up the scoring rule, the retry and the
    split pass (`measure_options`), time and score (`measure_forms`), record (`record_variants`).

    Args:
        models: Name -> torch model measured beside the forms ("baseline" required); updated in place.
        plan: What to build, the images, the torch forms recorded beside, the peer and the known predictions.
        settings: Latency and accuracy settings, device, threads, label restriction and processes.

    Returns:
        The rows, timing facts, VariantRecords (torch forms first), built forms, the peer's key and the summary.
    """
    use_run(plan.run)  # the run's quiet reference: calibrated at its first timing block, kept in its folder
    built = build_stage(models, plan, settings.threads)
    peer_name, time_only = open_peer(plan, settings.threads)
    options = measure_options(models, plan, settings, built, time_only)
    measured, timing = measure_forms(models, plan.images, settings, options)
    if options.predict is not None:
        timing["accuracy_procs"] = settings.procs
    variants = record_variants(plan, measured, timing, built, settings)
    if peer_name and peer_name in measured:
        timing["peer"] = peer_name
    return FormsMeasurement(
        measured=measured,
        timing=timing,
        variants=variants,
        built=built,
        peer_key=peer_name,
        line=forms_line(variants),
        notice=timing_notice(timing),
        samples=form_samples(plan, measured, variants),
    )


def form_samples(
    plan: FormsPlan, measured: Mapping[str, Mapping[str, Any]], variants: Sequence[VariantRecord]
) -> dict[str, list[float | None]]:
    """Return form name -> its per-repeat batch-1 samples (a torch form's under its model key, e.g. "baseline")."""
    keys = {name: key for name, (key, _, _) in plan.torch_forms.items()}
    rows = {v.name: measured.get(keys.get(v.name, v.name)) or {} for v in variants}
    return {name: list(row["samples_ms"]) for name, row in rows.items() if row.get("samples_ms")}


def build_stage(models: dict[str, nn.Module], plan: FormsPlan, threads: int) -> list[Variant]:
    """Build and check the plan's forms (logits against torch on the check images); add the working ones to `models`.

    A form built only as the others' source (`plan.sources`) is not measured.
    """
    images = plan.images
    assert images.calib_pixels is not None  # the forms' calibration images
    built = build_forms(
        plan.fp32,
        images.calib_pixels,
        images.pixels[: plan.check_images],
        plan.out_dir,
        forms=plan.forms,
        threads=threads,
        files=FormFiles(processor=plan.processor, extra=plan.extra),
        ort=source_settings(plan.sources),
    )
    models.update({v.name: v.model for v in built if v.status == "ok" and v.name not in plan.sources})
    return built


def open_peer(plan: FormsPlan, threads: int) -> tuple[str | None, dict[str, nn.Module]]:
    """Open the quantization-only peer's form to be timed beside ("unpruned_<name>"); (None, {}) when there is none.

    It is timed, not predicted again: its accuracy was measured with the baseline.
    """
    peer, root = plan.peer, plan.peer_root
    if not peer or not peer.get("path") or root is None or not str(peer.get("name", "")).startswith(("ort_", "ov_")):
        return None, {}
    name = PEER_PREFIX + str(peer["name"])
    try:
        return name, {name: load_form(root / str(peer["path"]), threads)}
    except Exception:  # noqa: BLE001 - a peer that no longer opens is not timed; the round goes on
        return None, {}


def measure_options(
    models: Mapping[str, nn.Module],
    plan: FormsPlan,
    settings: MeasureSettings,
    built: Sequence[Variant],
    time_only: Mapping[str, nn.Module],
) -> MeasureOptions:
    """Set up `measure_forms` for the plan: the INT8 retry, the split pass, the scoring rule and the stand-ins."""
    images, objective = plan.images, plan.objective
    assert images.calib_pixels is not None
    config = getattr(plan.fp32, "config", None)
    retry = int8_retry(
        built,
        images.calib_pixels,
        images.pixels,
        images.labels,
        objective,
        settings.allowed_ids,
        settings.threads,
        getattr(config, "model_type", None),
    )
    paths = {**(plan.model_paths or {}), **{v.name: Path(v.path) for v in built if v.status == "ok" and v.path}}
    predict = None
    if settings.procs > 1 and plan.run is not None and set(models) <= set(paths):
        predict = sharded_predictor(plan.run, paths, settings, plan.out_dir / "eval_job")
    scoring = None
    if objective.target != "size":  # the smallest form ships under a size target: every accuracy may matter
        optional = {v.name for v in built if v.status == "ok"} | {k for k in plan.torch_forms if k != "baseline"}
        scoring = ScoringRule(
            optional=frozenset(optional & set(models)),
            budget=objective.max_acc_drop,
            eligible=frozenset(plan.eligible) if plan.eligible is not None else None,
        )
    return MeasureOptions(
        timed=[n for n in models if n not in plan.untimed],
        parallel=concurrent_models(settings.device, settings.threads, len(models)),  # accuracy passes only
        retry=retry,
        time_only=time_only,
        predict=predict,
        known=plan.known,
        scoring=scoring,
        stand_ins=fp32_stand_ins(models, plan.fp32, built, settings.device),
    )


def record_variants(
    plan: FormsPlan,
    measured: Mapping[str, Mapping[str, Any]],
    timing: Mapping[str, Any],
    built: Sequence[Variant],
    settings: MeasureSettings,
) -> list[VariantRecord]:
    """Turn the rows into VariantRecords: the torch forms first, then every built form (failed ones included)."""
    note = plan.source_note or SOURCE_ONLY
    unscored = {**{name: note for name in plan.sources}, **(timing.get("unscored") or {})}
    variants = [
        variant_record(
            name,
            measured[key],
            size_bytes=size,
            path=path,
            error=unscored.get(key),
            status="unscored" if key in unscored else None,
        )
        for name, (key, size, path) in plan.torch_forms.items()
    ]
    for v in built:
        variants.append(
            variant_record(
                v.name,
                measured.get(v.name) if v.status == "ok" else None,
                size_bytes=v.size_bytes,
                path=plan.rel(Path(v.path)) if v.path else None,
                error=v.error or unscored.get(v.name),
                max_abs_diff=v.max_abs_diff,
                recipe=recipe_summary(v.recipe),
                status=v.status if v.status != "ok" else "unscored" if v.name in unscored else None,
            )
        )
    batch = accuracy_batch(settings.eval_batch, settings.device)
    for record in variants:  # dynamic quantization scales activations per batch: its accuracy depends on the batch
        if record.name == "ort_dynamic" and record.status == "ok":
            record.recipe["eval_batch"] = batch
    return variants
