"""Measure every deployable form of a candidate beside the baseline and turn the numbers into variant records."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from profiling_agent.state import VariantRecord
from profiling_agent.tools.evaluation import latency
from profiling_agent.tools.evaluation.metrics import accuracy_batch, agreement, predict_many, top1
from profiling_agent.tools.evaluation.records import EvalImages, MeasureOptions, MeasureSettings
from profiling_agent.tools.evaluation.scoring import Scores, left_out_reason, passes_needed

BASELINE = "baseline"
ROW_KEYS = ("accuracy", "agreement", "latency_ms", "latency_batch_ms", "speedup", "speedup_batch", "wall_over_cpu")


def ratio(numerator: float, denominator: float) -> float:
    """Return numerator / denominator, 0 when the denominator is not positive (a speedup, a size ratio)."""
    return numerator / denominator if denominator > 0 else 0.0


def measure_forms(
    models: dict[str, nn.Module],
    images: EvalImages,
    settings: MeasureSettings,
    options: MeasureOptions | None = None,
) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """Time every model interleaved in one `measure_latency` call, then predict with them on the same images.

    Timing comes first and runs alone; the accuracy pass follows (reading the images once per pass, streamed,
    `options.parallel` models at a time), so nothing runs beside a timed forward pass. Timing is taken again when
    the machine looked busy (`latency.measure_latency_checked`). With a scoring rule, the forms it makes optional
    are scored fastest first, and a slow one is left out once it can no longer be delivered (`scoring`).

    Args:
        models: Name -> model; must include "baseline". Models a retry replaces are replaced in place.
        images: Validation images (N, C, H, W) or an ImageStream of them, and their labels (model ids).
        settings: Latency batch, warm-up and repeats, accuracy batch, device and label restriction.
        options: Which models are timed, the retry, stand-ins, known predictions and the scoring rule.

    Returns:
        ({name: {"preds", "accuracy", "agreement", "latency_ms", "latency_batch_ms", "speedup", "speedup_batch",
        "wall_over_cpu", "samples_ms"}}, timing facts), ratios against the baseline measured in the same run
        (latency fields absent for untimed models, prediction fields for models left out). The timing facts'
        "unscored" maps each model left out to why.
    """
    if BASELINE not in models:
        raise ValueError("measure_forms needs a 'baseline' model")
    run = _FormsPass(models, images, settings, options or MeasureOptions())
    run.first_pass()
    run.apply_retry()
    run.finish_timing()
    return run.rows(), run.timing


class _FormsPass:
    """One `measure_forms` call: the timings, the predictions so far and the stand-ins, between its stages."""

    def __init__(
        self, models: dict[str, nn.Module], images: EvalImages, settings: MeasureSettings, options: MeasureOptions
    ) -> None:
        self.models, self.images, self.settings, self.options = models, images, settings, options
        self.labels = images.labels
        self.batch = accuracy_batch(settings.eval_batch, settings.device)
        self.preds: dict[str, torch.Tensor] = {}
        self.standing: dict[str, str] = {}
        self.lat: dict[str, dict[str, Any]] = {}
        self.timing: dict[str, Any] = {}

    def run_pass(self, chosen: list[str], in_process: bool = False) -> dict[str, torch.Tensor]:
        """Predict the chosen models (through `options.predict` unless `in_process`)."""
        subset = {n: self.models[n] for n in chosen}
        if not subset:
            return {}
        if self.options.predict is not None and not in_process:
            return self.options.predict(subset)
        return predict_many(
            subset,
            self.images.pixels,
            batch_size=self.batch,
            device=self.settings.device,
            allowed_ids=self.settings.allowed_ids,
            parallel=max(1, min(self.options.parallel, len(subset))),
        )

    def time_all(self) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
        """Time the timed models and the time-only ones side by side (taken again on a busy machine)."""
        timed = self.options.timed
        names = [n for n in self.models if timed is None or n in timed or n == BASELINE]
        settings = self.settings
        return latency.measure_latency_checked(  # through the module, so tests can stand in for the clock
            {**{n: self.models[n] for n in names}, **dict(self.options.time_only or {})},
            self.images.pixels[: settings.latency_batch],
            batch_size=settings.latency_batch,
            warmup=settings.warmup,
            repeats=settings.repeats,
            device=settings.device,
            budget_s=latency.RUN_BUDGET_S,
        )

    def accuracies(self) -> dict[str, float]:
        """Return every scored model's top-1."""
        return {name: top1(p, self.labels) for name, p in self.preds.items()}

    def score(self, names: list[str]) -> dict[str, float]:
        """Predict the named models not scored yet (a stand-in predicts for its torch model); return accuracies."""
        standing, preds = self.standing, self.preds
        wanted = [n for n in names if n in self.models and n not in preds]
        ran = self.run_pass(list(dict.fromkeys(standing.get(n, n) for n in wanted if standing.get(n, n) not in preds)))
        preds.update(ran)
        preds.update({n: preds[standing[n]] for n in wanted if n in standing and standing[n] in preds})
        return self.accuracies()

    def score_optional(self) -> None:
        """Score the optional models the scoring rule still needs, fastest first, `parallel` at a time."""
        scoring, parallel = self.options.scoring, self.options.parallel
        tried: set[str] = set()  # a model whose pass gave no predictions is not asked again
        while scoring is not None:
            reference = top1(self.preds[BASELINE], self.labels)
            scores = Scores(self.accuracies(), reference, self.lat, len(self.labels))
            needed = passes_needed(scoring, scores, self.models)
            need = [n for n in needed if n not in tried]
            if not need:
                return
            tried.update(need[: max(1, parallel)])
            self.score(need[: max(1, parallel)])

    def first_pass(self) -> None:
        """Time every model, then score the required ones (and the fastest optional ones in the free slots)."""
        options, models = self.options, self.models
        self.lat, self.timing = self.time_all()
        self.preds = {n: p for n, p in (options.known or {}).items() if n in models}
        self.standing = stand_in_forms(options.stand_ins or {}, self.lat, models)
        scoring = options.scoring
        optional = scoring.optional if scoring is not None else frozenset()
        required = [n for n in models if n not in self.preds and n not in optional]
        spare = max(0, options.parallel - len(required))  # the fastest optional forms share the first pass's slots
        unscored = Scores({}, 0.0, self.lat, len(self.labels))
        fastest = passes_needed(scoring, unscored, models)[:spare] if scoring else []
        self.score(required + fastest)
        self.score_optional()

    def apply_retry(self) -> None:
        """Let the retry replace models (a rebuilt INT8 form): predict them and time everything again."""
        if self.options.retry is None:
            return
        replaced = self.options.retry(self.accuracies(), self.score)
        if replaced:
            self.models.update(replaced)
            self.preds.update(self.run_pass(list(replaced), in_process=True))
            self.lat, self.timing = self.time_all()  # the rebuilt form is timed beside the others, as the first was
            self.timing["retimed"] = sorted(replaced)
            self.score_optional()

    def finish_timing(self) -> None:
        """Add to the timing facts: the passes left out and why, the stand-ins used, wall and CPU seconds."""
        scoring, preds, lat = self.options.scoring, self.preds, self.lat
        if scoring is not None:
            scores = Scores(self.accuracies(), top1(preds[BASELINE], self.labels), lat, len(self.labels))
            self.timing["unscored"] = {
                n: left_out_reason(scoring, scores, n) for n in self.models if n not in preds and n in scoring.optional
            }
        used = {n: f for n, f in self.standing.items() if n in preds and f in preds and preds[n] is preds[f]}
        if used:
            self.timing["predicted_by"] = used
        self.timing["wall_s"] = round(sum(r.get("wall_s", 0.0) for r in lat.values()), 3)
        self.timing["cpu_s"] = round(sum(r.get("cpu_s", 0.0) for r in lat.values()), 3)

    def rows(self) -> dict[str, dict[str, Any]]:
        """Return every model's row: predictions and accuracy when scored, latencies and speed-ups when timed."""
        preds, lat = self.preds, self.lat
        base = lat[BASELINE]
        out: dict[str, dict[str, Any]] = {}
        for name in [*self.models, *(self.options.time_only or {})]:
            row: dict[str, Any] = {}
            if name in preds:
                row.update(
                    preds=preds[name],
                    accuracy=top1(preds[name], self.labels),
                    agreement=agreement(preds[name], preds[BASELINE]),
                )
            if name in lat:
                row.update(
                    latency_ms=lat[name]["latency_ms"],
                    latency_batch_ms=lat[name]["latency_batch_ms"],
                    speedup=ratio(base["latency_ms"], lat[name]["latency_ms"]),
                    speedup_batch=ratio(base["latency_batch_ms"], lat[name]["latency_batch_ms"]),
                    wall_over_cpu=latency.wall_over_cpu({name: lat[name]}),
                    samples_ms=lat[name].get("samples_ms"),  # per repeat: the tie rule's paired intervals
                )
            out[name] = row
        return out


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
) -> VariantRecord:
    """Build a VariantRecord from `measure_forms`' row (None: the variant failed with `error`)."""
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
        record.update({key: measured.get(key) for key in ROW_KEYS})
    return VariantRecord.model_validate(record)


def backend_of(name: str) -> str:
    """Return the runtime of a form name: ort_* onnxruntime, ov_* openvino, else torch."""
    return "onnxruntime" if name.startswith("ort_") else "openvino" if name.startswith("ov_") else "torch"


RECIPE_KEYS = (
    "method",
    "per_channel",
    "calibration",
    "op_types",
    "excluded_nodes",
    "format",
    "model_type",
    "preset",
    "ignored_scope",
    "quantized_ops",
)


def recipe_summary(recipe: Mapping[str, Any]) -> dict[str, Any]:
    """Keep what a person or a planner needs from an ONNX recipe: exporter, opset, quantization and check."""
    quant = recipe.get("quantization") or {}
    summary = {**(recipe.get("export") or {})}
    summary.pop("seconds", None)
    for key in RECIPE_KEYS:
        if key in quant:
            summary[key] = quant[key]
    summary.setdefault("method", recipe.get("method"))
    runtime = recipe.get("runtime")
    if isinstance(runtime, dict) and runtime.get("precision_hint"):
        summary["precision_hint"] = runtime["precision_hint"]
    if recipe.get("accuracy_control"):
        summary["accuracy_control"] = recipe["accuracy_control"]
    return summary
