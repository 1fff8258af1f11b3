"""Measure every deployable form of a candidate beside the baseline and turn the numbers into variant records."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from profiling_agent.tools.evaluation import latency
from profiling_agent.tools.evaluation.metrics import accuracy_batch, agreement, predict_many, top1

BASELINE = "baseline"


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
    retry: Callable[[dict[str, float]], dict[str, nn.Module]] | None = None,
    time_only: Mapping[str, nn.Module] | None = None,
    predict: Callable[[Mapping[str, nn.Module]], dict[str, torch.Tensor]] | None = None,
) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """Predict with every model on the same images, then time them interleaved in one `measure_latency` call.

    The accuracy pass reads the images once (streamed) and feeds each batch to every model, `parallel` of them at
    a time; timing starts only after it (and any retry) has finished, so nothing runs beside a timed forward pass.
    Timing is taken again when the machine looked busy (`latency.measure_latency_checked`).

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
        retry: Called with every model's accuracy after the accuracy pass; returns models to replace (rebuilt
            forms, e.g. an accuracy-controlled INT8), which are predicted again before timing.
        time_only: Models timed beside the others but not predicted (their accuracy is known: the peer).
        predict: Predicts `models` on `pixels` for the accuracy pass (default: `predict_many` in this process;
            a sharded pass gives the same predictions). A retry's rebuilt models are predicted in this process.

    Returns:
        ({name: {"preds", "accuracy", "agreement", "latency_ms", "latency_batch_ms", "speedup", "speedup_batch",
        "wall_over_cpu"}}, timing facts), ratios against the baseline measured in the same run (latency fields
        absent for untimed models).
    """
    if BASELINE not in models:
        raise ValueError("measure_forms needs a 'baseline' model")
    batch = accuracy_batch(eval_batch, device)
    if predict is not None:
        preds = predict(models)
    else:
        preds = predict_many(models, pixels, batch_size=batch, device=device, allowed_ids=allowed_ids,
                             parallel=parallel)  # fmt: skip
    if retry is not None:
        replaced = retry({name: top1(p, labels) for name, p in preds.items()})
        if replaced:
            models.update(replaced)
            again = predict_many(replaced, pixels, batch_size=batch, device=device, allowed_ids=allowed_ids,
                                 parallel=parallel)  # fmt: skip
            preds.update(again)
    names = [n for n in models if timed is None or n in timed or n == BASELINE]
    lat, timing = latency.measure_latency_checked(  # through the module, so tests can stand in for the clock
        {**{n: models[n] for n in names}, **dict(time_only or {})},
        pixels[:batch_size],
        batch_size=batch_size,
        warmup=warmup,
        repeats=repeats,
        device=device,
        budget_s=latency.RUN_BUDGET_S,
    )
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
