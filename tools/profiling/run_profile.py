"""The profile step as one tool: the torch profile, the deliverable forms' profile, profile.json and its summary."""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

from profiling_agent.state import ProfileSummary
from profiling_agent.tools.compression.token_merge import has_token_axis
from profiling_agent.tools.io import write_json_atomic
from profiling_agent.tools.profiling import planning_latency
from profiling_agent.tools.profiling.deliverable import profile_deliverable
from profiling_agent.tools.profiling.latency_model import model_digest
from profiling_agent.tools.profiling.planning_latency import (
    cached_record,
    keep_record,
    record_from_profile,
    record_key,
    record_note,
)
from profiling_agent.tools.profiling.summary import planner_profile, summarize_profile
from profiling_agent.tools.profiling.token_latency import measure_token_latency, token_note


def profile_baseline(
    model: nn.Module,
    shape: Sequence[int],
    device: torch.device,
    backend: str,
    target: str,
    out_file: Path,
    depth: bool = False,
    int8: tuple[Path, torch.Tensor] | None = None,
) -> tuple[ProfileSummary, str]:
    """Profile the FP32 baseline, write profile.json and return its summary and a one-line message.

    The torch profile (static MACs and params, per-module latency) always runs; on the CPU, unless the
    `--backend` is torch, the deliverable backend forms are profiled per node too (`deliverable`), with the
    planned form's latency table when the target is latency. The latency the planners read (`planning_latency`:
    the planned form's repeated, snapped shares and curves) is measured here once per run, or read from this
    machine's record of the same model and settings, and kept in profile.json for every round and a resume.

    `depth`: list the blocks depth pruning may remove among the groups (the objective's `prunes_depth`).
    `int8`: the folder and calibration images of the run's INT8 builds (`runtimes.int8_reuse`): the profiled INT8
    form is calibrated on them and kept there, and `measure_baseline` measures that build instead of another.

    Raises:
        ValueError: A MACs target on a model whose MACs cannot be counted (bad input: the run cannot judge it).
    """
    full = planner_profile(model.to(device), shape, device=str(device), depth=depth)
    groups = full["groups"]
    if full["totals"].get("macs") is None and target == "macs":
        raise ValueError(f"--target macs cannot be judged: this model's MACs cannot be counted ({full.get('error')})")
    on_backend = backend != "torch" and device.type == "cpu"
    digest = f"{model_digest(model)}-{','.join(g['name'] for g in groups)}"  # the groups the shares are of
    where = backend if on_backend else f"torch-{device.type}"
    tokens = target == "latency" and has_token_axis(model) is None  # the planners weigh token merging too
    key = record_key(digest, where, torch.get_num_threads(), shape, target == "latency", tokens=tokens)
    kept = cached_record(planning_latency.records_dir(), key)
    backend_note = ""
    if on_backend:
        torch_ms = float(full.get("totals", {}).get("latency_ms", 0.0))
        full["backend_profile"], backend_note = profile_deliverable(
            model, shape, groups, backend, torch_ms, target == "latency", kept, int8=int8
        )
    elif tokens and kept is None:  # eager torch is the delivered form: its latency at a few rates
        backend_note = torch_token_latency(model, shape, device, full)
    full["planning_latency"] = kept or record_from_profile(full)
    if kept is None:
        keep_record(planning_latency.records_dir(), key, full["planning_latency"])
    backend_note += record_note(full["planning_latency"])
    write_json_atomic(out_file, full)
    summary = summarize_profile(full, groups)
    summary["path"] = out_file.name
    totals = full.get("totals", {})
    macs = f"{totals['macs']:,} MACs" if totals.get("macs") is not None else f"MACs unknown ({full.get('error')})"
    message = (
        f"{totals.get('params', 0):,} params, {macs}, "
        f"{totals.get('latency_ms', 0):.2f} ms batch-1 on {device}; {len(groups)} prunable groups"
    )
    return ProfileSummary.model_validate(summary), message + backend_note


def torch_token_latency(model: nn.Module, shape: Sequence[int], device: torch.device, full: dict) -> str:
    """Measure eager torch's latency at a few token-merging rates into profile.json's `token_latency`; a note."""
    example = torch.randn((1, *shape), generator=torch.Generator().manual_seed(0)).to(device)
    try:
        with tempfile.TemporaryDirectory(prefix="token-latency-") as scratch:
            full["token_latency"] = measure_token_latency(model.to(device), example, None, Path(scratch))
    except Exception as exc:  # noqa: BLE001 - the planners then leave tokens alone
        return f"; token latency on torch failed ({type(exc).__name__}: {str(exc)[:120]})"
    return token_note(full["token_latency"])
