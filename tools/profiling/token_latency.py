"""The token axis, measured: the delivered form's latency at a few token-merging rates, and their trial-slice damage.

Merging tokens (`compression.token_merge`) shrinks every later layer's GEMMs along M, but adds a few small ops per
layer, which at batch 1 can cost as much as the smaller GEMMs save (docs/tokens.md). So the profile step measures
the planned form's whole-model latency at rate 0, at `token_rates` (uniform, up to ToMe's maximum) and at
`front_schedules` (merging in the first few layers only: at batch 1 a merge's cost is per merge site, so few sites
with a large r pay where a small r in every layer does not), at batch 1 (the batch a latency target is judged at),
timed twice in opposite orders with each form's faster median kept, as the per-group latency table is. A row that is
not faster than rate 0 by `MIN_SAVING` is dropped with the reason. The probe step then measures each kept row's
accuracy loss on the trial slice (`token_damage`); both go to the run's `TokenAxis` record, which the planners weigh
against pruning.
"""

from __future__ import annotations

import copy
import functools
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from profiling_agent.state import TokenAxis, TokenRate
from profiling_agent.tools.compression.token_merge import (
    apply_token_merging,
    has_token_axis,
    resolve_schedule,
    schedule_from_rate,
    tokens_per_layer,
)
from profiling_agent.tools.models.merged_tokens import PROTECTED, token_count, token_layers
from profiling_agent.tools.profiling.backend_profile import BackendForm
from profiling_agent.tools.runtimes.forward import batched_logits, native_call
from profiling_agent.tools.runtimes.kept_compiled import compile_file
from profiling_agent.tools.runtimes.onnx_model import OrtClassifier
from profiling_agent.tools.runtimes.openvino_model import Precision, compile_config

MIN_SAVING = 0.05  # a rate must save at least 5% of rate 0's time: the timing precision of the planned latency
RATE_STEPS = 3  # rates measured beside 0: evenly up to ToMe's maximum
FRONT_STEPS = 2  # front-loaded schedules measured: merging half and all of what each front layer may merge
FRONT_SHARE = 4  # a front-loaded schedule merges in the first quarter of the layers (at least two, at most all)
BATCH = 1  # the batch a latency target is judged at (`latency_ms`)


def max_rate(model: nn.Module) -> int:
    """Return ToMe's largest useful rate: the one that merges every layer evenly down to the protected tokens."""
    model_type, layers = token_layers(model)
    return max(1, (token_count(model) - PROTECTED[model_type]) // max(1, len(layers)))


def token_rates(model: nn.Module, steps: int = RATE_STEPS) -> list[int]:
    """Return the rates the profile measures beside 0: `steps` rates spread evenly up to `max_rate` (distinct)."""
    top = max_rate(model)
    return sorted({max(1, round(top * k / steps)) for k in range(1, steps + 1)})


def front_schedules(model: nn.Module, steps: int = FRONT_STEPS) -> list[list[int]]:
    """Return the front-loaded schedules the profile measures: merging in the first few layers only.

    The first `max(2, layers // FRONT_SHARE)` layers (all of them in a model that small) each merge `k / steps` of
    what they may (half their unprotected tokens, ToMe's cap), for k = 1..steps; later layers merge none. A
    12-layer ViT-B/16: [49, 36, 27, 0, ...] and [98, 49, 24, 0, ...]. Distinct from the uniform rates.
    """
    model_type, layers = token_layers(model)
    protected, sites = PROTECTED[model_type], min(len(layers), max(2, len(layers) // FRONT_SHARE))
    uniform = [schedule_from_rate(model, r) for r in token_rates(model)]
    out: list[list[int]] = []
    for k in range(1, steps + 1):
        tokens, schedule = token_count(model), []
        for i in range(len(layers)):
            r = (tokens - protected) // 2 * k // steps if i < sites else 0
            schedule.append(r)
            tokens -= r
        if any(schedule) and schedule not in uniform and schedule not in out:
            out.append(schedule)
    return out


def _time_torch(model: nn.Module, example: torch.Tensor, repeats: int) -> float:
    """Return the median wall time of one eager forward, in ms (after two warm-up runs)."""
    sync = torch.cuda.synchronize if example.device.type == "cuda" else (lambda: None)
    with torch.inference_mode():
        for _ in range(2):
            model(pixel_values=example)
        times = []
        for _ in range(repeats):
            sync()
            start = time.perf_counter()
            model(pixel_values=example)
            sync()
            times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def _timers(
    models: list[nn.Module],
    example: torch.Tensor,
    form: BackendForm | None,
    folder: Path,
    repeats: int,
    base_path: Path | None = None,
) -> list[Callable[[], float]]:
    """Return one timer per model: the built form's whole-run wall time, or eager torch's.

    `base_path`, when given, is the first (unmerged) model already built in `form`: it is timed, not built again.
    """
    if form is None:
        return [functools.partial(_time_torch, m, example, repeats) for m in models]
    paths = [
        base_path if i == 0 and base_path is not None else form.build(m, example, folder / f"tokens{i}")
        for i, m in enumerate(models)
    ]
    return [functools.partial(time_built_form, form, p, example, repeats) for p in paths]


SAMPLE_MS = 20.0  # a timed sample runs enough calls to last about this long (a small model's call is ~1 ms)


def _native_call(form: BackendForm, path: Path, example: torch.Tensor) -> Callable[[], Any]:
    """Return one run of the built file on `example`, on one thread, as `runtimes.forward.native_call` runs a form.

    An OpenVINO file is compiled as `OvClassifier.native_call` compiles it (the static shape where that pays, the
    side-by-side timing's precision), once within `kept_compiled`.
    """
    if form.backend == "openvino":
        precision: Precision = "f32" if form.name == "ov_fp32" else "default"
        compiled = compile_file(path, tuple(example.shape), compile_config(precision, 1))
        infer = compiled.create_infer_request().infer
        feeds = {0: example.detach().to("cpu", torch.float32).contiguous().numpy()}
        return lambda: infer(feeds, share_inputs=False)

    return native_call(OrtClassifier(path, threads=1), example)


def time_built_form(form: BackendForm, path: Path, example: torch.Tensor, repeats: int) -> float:
    """Return the median wall time of one run of a built form file on `example`, in ms, as the forms are timed.

    The whole run, not the sum of the node profile: the profiler's cost per node is about what a merge's many small
    nodes take, and summed node times made every rate of the zoo's 196-token ViT 30-80% slower on ort_dynamic where
    the side-by-side timing measured it 10-20% faster. One thread; an OpenVINO form compiled for the static shape,
    in the precision its side-by-side timing uses.
    """
    call = _native_call(form, path, example)
    start = time.perf_counter()
    for _ in range(2):
        call()
    calls = max(1, int(SAMPLE_MS / max(1e-3, (time.perf_counter() - start) * 1e3 / 2)))
    samples = []
    for _ in range(max(3, repeats)):
        start = time.perf_counter()
        for _ in range(calls):
            call()
        samples.append((time.perf_counter() - start) * 1e3 / calls)
    return statistics.median(samples)


def measure_token_latency(
    model: nn.Module,
    example: torch.Tensor,
    form: BackendForm | None,
    folder: Path,
    *,
    rates: Sequence[int] | None = None,
    schedules: Sequence[Sequence[int]] | None = None,
    repeats: int = 5,
    base_path: Path | None = None,
) -> dict[str, Any]:
    """Measure the model's latency in `form` (None: eager torch) at rate 0, each rate and each front-loaded schedule.

    Rows that do not save `MIN_SAVING` are dropped with the reason. `rates` and `schedules` default to `token_rates`
    and `front_schedules`. `base_path` is the unmerged model already built in `form` (the profile's build): rate 0
    is timed on it instead of a new build.

    Returns:
        {"form", "batch", "base_ms", "rates": [{"rate" (None for a schedule), "schedule", "tokens_left",
        "latency_ms", "saved_share", "dropped" (None, or why the planners may not use it)}]} (rate 0 first), or
        {"error"} for a model without a token axis.
    """
    reason = has_token_axis(model)
    if reason is not None:
        return {"error": reason}
    uniform = [0, *[r for r in (rates if rates is not None else token_rates(model)) if r > 0]]
    fronts = [list(s) for s in (schedules if schedules is not None else front_schedules(model))]
    keys: list[int | None] = [*uniform, *[None] * len(fronts)]
    plans = [schedule_from_rate(model, r) for r in uniform] + [resolve_schedule(model, s) for s in fronts]
    models = []
    for schedule in plans:
        merged = copy.deepcopy(model).eval()
        apply_token_merging(merged, schedule)
        models.append(merged)
    timers = _timers(models, example[:BATCH], form, folder, repeats, base_path)
    ms = [float("inf")] * len(plans)
    for order in (range(len(plans)), reversed(range(len(plans)))):  # opposite orders, the faster median kept
        for i in order:
            ms[i] = min(ms[i], timers[i]())
    name = form.name if form is not None else "torch"
    rows = []
    for r, schedule, t in zip(keys, plans, ms, strict=True):
        saved = 1.0 - t / ms[0] if ms[0] > 0 else 0.0
        dropped = None
        if any(schedule) and saved < MIN_SAVING:
            what = f"rate {r}" if r is not None else f"schedule {schedule}"
            dropped = (
                f"{what} does not pay on {name} at batch {BATCH}: {t:.3f} ms against {ms[0]:.3f} ms unmerged "
                f"({saved:+.1%}; at least {MIN_SAVING:.0%} must be saved)"
            )
        rows.append(
            {
                "rate": r,
                "schedule": schedule,
                "tokens_left": tokens_per_layer(model, schedule)[-1],
                "latency_ms": round(t, 5),
                "saved_share": round(saved, 4),
                "dropped": dropped,
            }
        )
    protected = PROTECTED[token_layers(model)[0]]
    return {"form": name, "batch": BATCH, "base_ms": round(ms[0], 5), "rates": rows, "protected": protected}


def needs_damage(row: dict[str, Any]) -> bool:
    """Return True for a token row whose trial-slice damage is measured: it merges and was not dropped."""
    return any(row["schedule"]) and not row.get("dropped")


def token_damage(
    model: nn.Module,
    rows: Sequence[dict[str, Any]],
    pixels: torch.Tensor,
    labels: torch.Tensor,
    allowed_ids: list[int] | None = None,
    baseline_logits: torch.Tensor | None = None,
) -> list[dict[str, Any]]:
    """Return the rows with each kept row's trial-slice damage added (`drop_pp`, `agreement`, `kl`, as the probe's).

    Rate 0 and dropped rows are returned as they were. Merging is training-free, so this is the merged baseline's
    loss; pruning on top adds its own. `baseline_logits` are the model's own logits on `pixels` when already known.
    """
    from profiling_agent.tools.profiling.sensitivity import (
        compare_logits,
        restrict_logits,
    )  # lazy: transformers; nodes.probe loads this module without it

    logits = baseline_logits if baseline_logits is not None else batched_logits(model, pixels)
    reference = restrict_logits(logits, allowed_ids)
    out = []
    for row in rows:
        if not needs_damage(row):
            out.append(dict(row))
            continue
        merged = copy.deepcopy(model).eval()
        apply_token_merging(merged, list(row["schedule"]))
        with torch.inference_mode():
            logits = restrict_logits(batched_logits(merged, pixels), allowed_ids)
        stats = compare_logits(reference, logits, labels)
        out.append(
            {
                **row,
                "drop_pp": round(stats["acc_drop"], 3),
                "agreement": round(stats["agreement"], 3),
                "kl": round(stats["kl"], 5),
            }
        )
    return out


def token_note(table: dict[str, Any]) -> str:
    """Say in one console clause what merging tokens saves in the timed form, and which rows were dropped."""
    if "error" in table:
        return ""
    rates = table["rates"][1:]
    saved = ", ".join(f"{TokenRate.model_validate(r).label()} {r['saved_share']:+.0%}" for r in rates)
    dropped = sum(r["dropped"] is not None for r in rates)
    return f"; token merging on {table['form']} at batch {table['batch']}: {saved} ({dropped} dropped: no gain)"


def token_axis(
    model: nn.Module,
    table: dict[str, Any] | None,
    pixels: torch.Tensor,
    labels: torch.Tensor,
    allowed_ids: list[int] | None = None,
    baseline_logits: torch.Tensor | None = None,
) -> TokenAxis | None:
    """Return the run's token axis: the profile's latency `table` with each kept rate's trial-slice damage.

    None without a table (no token axis, or no latency target). `baseline_logits`: as `token_damage` reads them.
    """
    if not table or "error" in table:
        return None
    rows = token_damage(model, table["rates"], pixels, labels, allowed_ids, baseline_logits)
    return TokenAxis(
        form=table["form"],
        batch=table["batch"],
        base_ms=table["base_ms"],
        rates=[TokenRate.model_validate(r) for r in rows],
        images=int(len(labels)),
        protected=int(table.get("protected", 1)),
    )
