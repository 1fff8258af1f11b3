"""Measure every deployable form of a candidate beside the baseline and turn the numbers into variant records."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from profiling_agent.tools.evaluation import latency
from profiling_agent.tools.evaluation.metrics import accuracy_batch, agreement, predict_many, top1
from profiling_agent.tools.evaluation.scoring import ScoringRule, left_out_reason, passes_needed

BASELINE = "baseline"
Scorer = Callable[[list[str]], dict[str, float]]  # scores the named models (not scored yet) and returns all accuracies
Retry = Callable[[dict[str, float], Scorer], dict[str, nn.Module]]  # accuracies, scorer -> models to replace


def _ratio(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator > 0 else 0.0


def measure_forms(
    models: dict[str, nn.Module],
    pixels: Any,
    labels: torch.Tensor,
    *,
    batch_size: int,
    eval_batch: int,
    warmup: int,
    repeats: int,
    device: str = "cpu",
    allowed_ids: list[int] | None = None,
    timed: list[str] | None = None,
    parallel: int = 1,
    retry: Retry | None = None,
    time_only: Mapping[str, nn.Module] | None = None,
    predict: Callable[[Mapping[str, nn.Module]], dict[str, torch.Tensor]] | None = None,
    known: Mapping[str, torch.Tensor] | None = None,
    scoring: ScoringRule | None = None,
    stand_ins: Mapping[str, Sequence[str]] | None = None,
) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """Time every model interleaved in one `measure_latency` call, then predict with them on the same images.

    Timing comes first and runs alone; the accuracy pass follows (reading the images once per pass, streamed,
    `parallel` models at a time), so nothing runs beside a timed forward pass. Timing is taken again when the
    machine looked busy (`latency.measure_latency_checked`). With a `scoring` rule, the forms it makes optional
    are scored fastest first, and a slow one is left out once it can no longer be delivered (`scoring`).

    Args:
        models: Name -> model; must include "baseline". Models a retry replaces are replaced in place.
        pixels: Validation images (N, C, H, W), or an ImageStream of them.
        labels: Their labels (model ids).
        batch_size: The larger latency batch.
        eval_batch: Batch size of the accuracy pass.
        warmup: Warm-up passes before timing.
        repeats: Timed repeats (median reported).
        device: Where every model runs.
        allowed_ids: Model ids predictions are restricted to.
        timed: Names to time (default: all).
        parallel: Models predicting concurrently in the accuracy pass (1: one after the other).
        retry: Called with every scored model's accuracy after the accuracy pass, and a scorer for a model whose
            pass was left out; returns models to replace (rebuilt forms, e.g. an accuracy-controlled INT8), which
            are predicted again and then timed again with the others.
        time_only: Models timed beside the others but not predicted (their accuracy is known: the peer).
        predict: Predicts `models` on `pixels` for the accuracy pass (default: `predict_many` in this process;
            a sharded pass gives the same predictions). A retry's rebuilt models are predicted in this process.
        known: Predictions already made on these images (the baseline's, from the run's first measurement): those
            models are timed but not predicted again.
        scoring: Which models' passes may be left out (None: every model is scored).
        stand_ins: Torch model -> FP32 forms of the same weights whose logits matched it within the FP32
            tolerance: the fastest of them, when timed faster than the torch model, predicts for it (its
            predictions are the torch model's; timing facts' "predicted_by" names it).

    Returns:
        ({name: {"preds", "accuracy", "agreement", "latency_ms", "latency_batch_ms", "speedup", "speedup_batch",
        "wall_over_cpu"}}, timing facts), ratios against the baseline measured in the same run (latency fields
        absent for untimed models, prediction fields for models left out). The timing facts' "unscored" maps each
        model left out to why.
    """
    if BASELINE not in models:
        raise ValueError("measure_forms needs a 'baseline' model")
    batch = accuracy_batch(eval_batch, device)

    def run_pass(chosen: list[str], in_process: bool = False) -> dict[str, torch.Tensor]:
        subset = {n: models[n] for n in chosen}
        if not subset:
            return {}
        if predict is not None and not in_process:
            return predict(subset)
        return predict_many(subset, pixels, batch_size=batch, device=device, allowed_ids=allowed_ids,
                            parallel=max(1, min(parallel, len(subset))))  # fmt: skip

    def time_all() -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
        names = [n for n in models if timed is None or n in timed or n == BASELINE]
        return latency.measure_latency_checked(  # through the module, so tests can stand in for the clock
            {**{n: models[n] for n in names}, **dict(time_only or {})},
            pixels[:batch_size],
            batch_size=batch_size,
            warmup=warmup,
            repeats=repeats,
            device=device,
            budget_s=latency.RUN_BUDGET_S,
        )

    def accuracies() -> dict[str, float]:
        return {name: top1(p, labels) for name, p in preds.items()}

    def score(names: list[str]) -> dict[str, float]:
        wanted = [n for n in names if n in models and n not in preds]
        ran = run_pass(list(dict.fromkeys(standing.get(n, n) for n in wanted if standing.get(n, n) not in preds)))
        preds.update(ran)
        preds.update({n: preds[standing[n]] for n in wanted if n in standing and standing[n] in preds})
        return accuracies()

    def score_optional() -> None:
        tried: set[str] = set()  # a model whose pass gave no predictions is not asked again
        while scoring is not None:
            reference = top1(preds[BASELINE], labels)
            need = [n for n in passes_needed(scoring, accuracies(), reference, lat, len(labels), models)
                    if n not in tried]  # fmt: skip
            if not need:
                return
            tried.update(need[: max(1, parallel)])
            score(need[: max(1, parallel)])

    lat, timing = time_all()
    preds = {n: p for n, p in (known or {}).items() if n in models}
    standing = stand_in_forms(stand_ins or {}, lat, models)
    optional = scoring.optional if scoring is not None else frozenset()
    required = [n for n in models if n not in preds and n not in optional]
    spare = max(0, parallel - len(required))  # the fastest optional forms share the first pass's free slots
    score(required + (passes_needed(scoring, {}, 0.0, lat, len(labels), models)[:spare] if scoring else []))
    score_optional()
    if retry is not None:
        replaced = retry(accuracies(), score)
        if replaced:
            models.update(replaced)
            preds.update(run_pass(list(replaced), in_process=True))
            lat, timing = time_all()  # the rebuilt form is timed beside the others, as the first one was
            timing["retimed"] = sorted(replaced)
            score_optional()
    if scoring is not None:
        reference = top1(preds[BASELINE], labels)
        timing["unscored"] = {
            n: left_out_reason(scoring, accuracies(), reference, lat, len(labels), n)
            for n in models
            if n not in preds and n in scoring.optional
        }
    used = {n: form for n, form in standing.items() if n in preds and form in preds and preds[n] is preds[form]}
    if used:
        timing["predicted_by"] = used
    timing["wall_s"] = round(sum(r.get("wall_s", 0.0) for r in lat.values()), 3)
    timing["cpu_s"] = round(sum(r.get("cpu_s", 0.0) for r in lat.values()), 3)
    base = lat[BASELINE]
    out: dict[str, dict[str, Any]] = {}
    for name in [*models, *(time_only or {})]:
        row: dict[str, Any] = {}
        if name in preds:
            row.update(preds=preds[name], accuracy=top1(preds[name], labels),
                       agreement=agreement(preds[name], preds[BASELINE]))  # fmt: skip
        if name in lat:
            row.update(
                latency_ms=lat[name]["latency_ms"],
                latency_batch_ms=lat[name]["latency_batch_ms"],
                speedup=_ratio(base["latency_ms"], lat[name]["latency_ms"]),
                speedup_batch=_ratio(base["latency_batch_ms"], lat[name]["latency_batch_ms"]),
                wall_over_cpu=latency.wall_over_cpu({name: lat[name]}),
            )
        out[name] = row
    return out, timing


def stand_in_forms(
    stand_ins: Mapping[str, Sequence[str]], lat: Mapping[str, Mapping[str, Any]], models: Mapping[str, Any]
) -> dict[str, str]:
    """Return torch model -> the fastest of its timed FP32 forms when that form was timed faster than it."""
    chosen = {}
    for name, forms in stand_ins.items():
        timed = [f for f in forms if f in lat and f in models]
        if name not in lat or not timed:
            continue
        fastest = min(timed, key=lambda f: float(lat[f]["latency_batch_ms"]))
        if float(lat[fastest]["latency_batch_ms"]) < float(lat[name]["latency_batch_ms"]):
            chosen[name] = fastest
    return chosen


def variant_record(
    name: str,
    measured: Mapping[str, Any] | None,
    *,
    size_bytes: int,
    path: str | None = None,
    error: str | None = None,
    max_abs_diff: float | None = None,
    recipe: Mapping[str, Any] | None = None,
    status: str | None = None,
) -> dict[str, Any]:
    """Build a VariantRecord dict from `measure_forms`' row (None: the variant failed with `error`)."""
    record: dict[str, Any] = {
        "name": name,
        "backend": backend_of(name),
        "status": status or ("ok" if measured is not None and error is None else "failed"),
        "error": error,
        "path": path,
        "max_abs_diff": max_abs_diff,
        "recipe": dict(recipe or {}),
        "size_mb": size_bytes / 1e6 if size_bytes else None,
    }
    if measured is not None:
        for key in ("accuracy", "agreement", "latency_ms", "latency_batch_ms", "speedup", "speedup_batch",
                    "wall_over_cpu"):  # fmt: skip
            record[key] = measured.get(key)
    return record


def backend_of(name: str) -> str:
    """Return the runtime of a form name: ort_* onnxruntime, ov_* openvino, else torch."""
    return "onnxruntime" if name.startswith("ort_") else "openvino" if name.startswith("ov_") else "torch"


def recipe_summary(recipe: Mapping[str, Any]) -> dict[str, Any]:
    """Keep what a person or a planner needs from an ONNX recipe: exporter, opset, quantization and check."""
    quant = recipe.get("quantization") or {}
    summary = {**(recipe.get("export") or {})}
    summary.pop("seconds", None)
    for key in ("method", "per_channel", "calibration", "op_types", "excluded_nodes", "format", "model_type",
                "preset", "ignored_scope", "quantized_ops"):  # fmt: skip
        if key in quant:
            summary[key] = quant[key]
    summary.setdefault("method", recipe.get("method"))
    runtime = recipe.get("runtime")
    if isinstance(runtime, dict) and runtime.get("precision_hint"):
        summary["precision_hint"] = runtime["precision_hint"]
    if recipe.get("accuracy_control"):
        summary["accuracy_control"] = recipe["accuracy_control"]
    return summary
