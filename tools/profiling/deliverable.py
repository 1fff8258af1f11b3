"""Profile the forms a run can deliver and the latency table of the one the planners will read.

The profile node calls `profile_deliverable` once: every backend form the `--backend` choice can deliver
(ONNX Runtime's with `onnxruntime`, OpenVINO's with `openvino`, both with `auto`) is built and profiled per node,
the planned form is named (the fastest), and with a latency target its per-group latency table is measured or read
from the cache. A form that cannot be built is recorded with its reason; a missing runtime is a note, not a fault.
"""

from __future__ import annotations

import contextlib
import logging
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from profiling_agent.tools.compression.token_merge import has_token_axis
from profiling_agent.tools.models.embedded_data import cache_dir
from profiling_agent.tools.profiling import latency_model, token_latency
from profiling_agent.tools.profiling.backend_profile import (
    ORT_FORMS,
    BackendForm,
    form_profile,
    planned_form,
    profile_backends,
)
from profiling_agent.tools.profiling.node_samples import sample_calls
from profiling_agent.tools.profiling.openvino_profile import OV_PROFILE_FORMS
from profiling_agent.tools.profiling.planning_latency import repeated_shares
from profiling_agent.tools.profiling.token_latency import measure_token_latency, token_note
from profiling_agent.tools.runtimes.int8_reuse import int8_reuse
from profiling_agent.tools.runtimes.kept_compiled import kept_compiled
from profiling_agent.tools.runtimes.onnx_model import onnxruntime_missing
from profiling_agent.tools.runtimes.openvino_model import nncf_missing

log = logging.getLogger(__name__)


def deliverable_forms(backend: str) -> tuple[list[BackendForm], list[str]]:
    """Return the profiled forms the `--backend` choice can deliver, and why others are left out."""
    forms: list[BackendForm] = []
    notes: list[str] = []
    if backend in ("onnxruntime", "auto"):
        missing = onnxruntime_missing()
        forms += [] if missing else list(ORT_FORMS)
        notes += [missing] if missing else []
    if backend in ("openvino", "auto"):
        missing = nncf_missing()
        if missing:
            notes.append(missing)
        else:
            forms += list(OV_PROFILE_FORMS)
    return forms, notes


def latency_table_of(
    model: nn.Module,
    example: torch.Tensor,
    backend: dict[str, Any],
    forms: Sequence[BackendForm],
    built: Mapping[str, Path] | None = None,
) -> str:
    """Measure (or read from the cache) the planned form's per-group latency table into `backend`; one-line note.

    `built` holds the forms the profile built of `model`: the planned one is the table's ratio 0.
    """
    form = next((f for f in forms if f.name == backend.get("planned_on")), None)
    if form is None:
        return ""
    base = (built or {}).get(form.name)
    try:
        backend["latency_table"] = latency_model.cached_table(
            model, example, form, cache_dir() / "latency", base_path=base
        )
    except Exception as exc:  # noqa: BLE001 - planning falls back to the profile's shares
        return f"; latency table of {form.name} failed ({type(exc).__name__}: {str(exc)[:120]})"
    return f"; latency table of {form.name} at ratios {backend['latency_table']['ratios']}"


def profile_deliverable(
    model: nn.Module,
    shape: Sequence[int],
    groups: list[Mapping[str, Any]],
    backend: str,
    torch_ms: float,
    latency_target: bool,
    kept: Mapping[str, Any] | None = None,
    *,
    int8: tuple[Path, torch.Tensor] | None = None,
) -> tuple[dict[str, Any], str]:
    """Profile the deliverable forms of the FP32 baseline per node and name the one the planners read.

    Args:
        model: The FP32 baseline (moved to the CPU).
        shape: The input (C, H, W).
        groups: The torch profile's prunable groups.
        backend: The `--backend` choice (torch, onnxruntime, openvino, auto).
        torch_ms: The torch profile's batch-1 total (torch is a candidate under auto).
        latency_target: Measure the planned form's latency table too.
        kept: A planning record this machine already measured for this model (`planning_latency`): its form is
            the planned one, and neither the repeats nor the latency table are measured again.
        int8: The folder and calibration images of the run's INT8 builds (`runtimes.int8_reuse`): only the
            baseline's profiled INT8 form is calibrated on them and kept for `measure_baseline`; the latency
            table's and the token rates' INT8 builds are timed only (calibrated on copies of one example).

    Returns:
        (profile.json's `backend_profile`: forms, planned_on, notes, and unless `kept`, `planned_repeats` (the
        planned form's repeated shares) and with a latency target the `latency_table`; a console note).
    """
    forms, notes = deliverable_forms(backend)
    if not forms:
        return {"forms": {}, "planned_on": "torch", "notes": notes}, ""
    model = model.cpu()
    example = torch.randn((1, *shape), generator=torch.Generator().manual_seed(0))
    # each file below is compiled once (`kept_compiled`), and the profiled forms are the latency table's ratio 0
    # and the token rates' rate 0 (`built`)
    with tempfile.TemporaryDirectory(prefix="backend-profile-") as scratch, kept_compiled():
        built: dict[str, Path] = {}
        with int8_reuse(*int8) if int8 is not None else contextlib.nullcontext():
            out = profile_backends(model, example, groups, forms, folder=Path(scratch), built=built)
        out["planned_on"], out["notes"] = planned_form(out, backend, torch_ms), notes
        if kept is not None:
            out["planned_on"] = str(kept["form"])
        else:
            form = next((f for f in forms if f.name == out["planned_on"] and f.name in built), None)
            if form is not None:
                out["planned_repeats"] = planned_repeats(form, built[form.name], example, groups, out)
        times = ", ".join(f"{n} {row['total_ms']:.2f} ms" for n, row in out["forms"].items() if "total_ms" in row)
        note = f"; backend profile: {times}"
        if kept is None and latency_target:
            note += latency_table_of(model, example, out, forms, built)
            note += token_latency_of(model, example, out, forms, built)
    return out, note


def token_latency_of(
    model: nn.Module,
    example: torch.Tensor,
    backend: dict[str, Any],
    forms: Sequence[BackendForm],
    built: Mapping[str, Path] | None = None,
) -> str:
    """Measure the planned form's latency at a few token-merging rates into `backend` (ViT, DeiT); one-line note.

    `built` holds the forms the profile built of `model`: the planned one is timed as rate 0.
    """
    form = next((f for f in forms if f.name == backend.get("planned_on")), None)
    if form is None or has_token_axis(model) is not None:
        return ""
    try:
        with tempfile.TemporaryDirectory(prefix="token-latency-") as scratch:
            base = (built or {}).get(form.name)
            backend["token_latency"] = measure_token_latency(model, example, form, Path(scratch), base_path=base)
    except Exception as exc:  # noqa: BLE001 - the planners then leave tokens alone
        return f"; token latency on {form.name} failed ({type(exc).__name__}: {str(exc)[:120]})"
    return token_note(backend["token_latency"])


def planned_repeats(
    form: BackendForm, path: Path, example: torch.Tensor, groups: list[Mapping[str, Any]], out: Mapping[str, Any]
) -> dict[str, Any]:
    """Repeat the planned form's node profile to `planning_latency.PRECISION`; the profile's own run counts first.

    Identical layers are pooled in every sample (`out["identical_layers"]`); the node times' sum is then compared
    with one whole-model timing of the same file (`token_latency.time_built_form`).

    Returns:
        {"shares": each group's median share, "repeats": samples taken, "spread": their relative spread,
        "whole_ms": one whole-model timing (None when it failed), "nodes_vs_whole": the profiled node times' sum
        over it, "calls_per_sample" and "sample_ms": the calls a sample of a form this fast averages, and its length}.
    """
    classes = out.get("identical_layers", [])

    def sample() -> dict[str, float]:
        node_ms = form.time_nodes(path, example, 2, 5)
        return form_profile(node_ms, groups, form.module_path, classes)["group_latency_share"]

    shares, n, spread = repeated_shares(sample, out["forms"][form.name]["group_latency_share"])
    nodes_ms = float(out["forms"][form.name]["total_ms"])
    try:
        whole_ms: float | None = token_latency.time_built_form(form, path, example, 5)
    except Exception as exc:  # noqa: BLE001 - the check is reported missing, the shares stand
        log.warning("whole-model timing of %s failed: %s", form.name, exc)
        whole_ms = None
    run_ms = whole_ms or nodes_ms
    calls = sample_calls(run_ms / 1e3)
    return {
        "shares": shares,
        "repeats": n,
        "spread": spread,
        "whole_ms": round(whole_ms, 5) if whole_ms else None,
        "nodes_vs_whole": round(nodes_ms / whole_ms, 3) if whole_ms else None,
        "calls_per_sample": calls,
        "sample_ms": round(calls * run_ms, 3),
    }
