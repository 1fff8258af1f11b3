"""Recover one pruned candidate: reconstruction, then distillation from the baseline; the result saved once."""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from profiling_agent.state import ArtifactRef, Context, RecoveryRecord
from profiling_agent.tools import run_layout
from profiling_agent.tools.compression.self_check import self_check
from profiling_agent.tools.compression.units import PrunedGroup
from profiling_agent.tools.data.train_stream import TrainBatches, describe
from profiling_agent.tools.io import MachineFault, failed_file, machine_fault, read_json, sha256_path, write_json_atomic
from profiling_agent.tools.models.artifacts import read_recipe, save_artifact
from profiling_agent.tools.models.sizes import count_params
from profiling_agent.tools.recovery import distill_state
from profiling_agent.tools.recovery.distill import DistillConfig, Team, distill
from profiling_agent.tools.recovery.distributed import JobData, JobFiles, JobLaunch, distill_in_job
from profiling_agent.tools.recovery.distributed_launch import DEFAULT_LAUNCHER, DistributedJobError
from profiling_agent.tools.recovery.early_stop import check_every, stop_reason
from profiling_agent.tools.recovery.policy import (
    auto_cap_steps,
    auto_recipe,
    auto_steps,
    cap_steps_note,
    distill_precision,
    method_name,
    recovery_steps,
    scaled_cap_steps,
)
from profiling_agent.tools.recovery.reconstruct import reconstruct
from profiling_agent.tools.runtimes.forward import model_device
from profiling_agent.tools.text import one_line

WRITE_FAILED = "iteration {}'s recovery could not write its files"  # a MachineFault's `what`
DONE = "recovery_done.json"  # in the iteration folder: a finished recovery, so a re-run of the node reuses it


@dataclass
class DistillJob:
    """What a distillation needs besides the two models: where the data, the run and its files are."""

    source: Any  # the training images (train_stream.find_train_source)
    processor: Any
    shape: dict[str, Any]
    labels: dict[str, Any]
    seed: int
    iteration: int
    folder: Path  # the iteration folder
    pruned: ArtifactRef | None
    pruned_path: Path
    baseline_path: Path
    dataset_ref: str
    emit: Callable[..., None]  # sends a progress event (nodes.common.emit bound to the runtime)
    macs: int | None = None  # the student's MACs per image (decides bf16 distillation on the CPU)
    removed_blocks: int = 0  # whole blocks the plan removed (auto's learning rate and batch: `policy.auto_recipe`)
    removed: float | None = None  # the share of parameters or MACs the plan removed (`policy.removed_share`)
    # cap steps -> the early-stopping monitor of an automatic step count (`early_stop.plateau_monitor`), or None
    monitor: Callable[[int], Any] | None = None


def write_failed(exc: OSError | MachineFault, it: int, folder: Path) -> MachineFault:
    """Return the fault that stops the run, naming the file (else the iteration folder `folder`).

    A recovery that cannot save its work (a full disk, a vanished folder) is not silently skipped.
    """
    code = exc.errno or errno.EIO
    reason = exc.strerror or os.strerror(code)
    return MachineFault(code, reason, failed_file(exc, folder), WRITE_FAILED.format(it))


@dataclass(frozen=True)
class DistillSetup:
    """A candidate's distillation as the recipe chose it: the loop's config, its batches and its resume key."""

    config: DistillConfig
    batches: TrainBatches
    fingerprint: dict[str, Any]  # what saved steps must match to be resumed (the pruned weights, the batch ...)
    monitor: Any | None  # the early-stopping monitor of an automatic step count (`early_stop.PlateauMonitor`)


def distill_setup(student: nn.Module, job: DistillJob, ctx: Context, record: RecoveryRecord) -> DistillSetup:
    """Choose the recipe (learning rate, batch, steps, precision) and note its automatic choices in `record`.

    An automatic step count starts the early-stopping monitor here (in a single process): the student's trial-slice
    loss before distillation is the first point, and one of the two measures the step cap scales with.
    """
    params = count_params(student)
    lr, batch = auto_recipe(ctx.recover_lr, ctx.recover_batch, params, job.removed_blocks)
    # an explicit step count runs in full (only the time cap cuts it); the automatic one, scaled to the plan's
    # damage, stops on a plateau
    # (its checking pace is set below, once the step cap is known)
    monitor = job.monitor(0) if job.monitor is not None and not ctx.recover_steps else None
    loss_before = None
    if monitor is not None and ctx.recover_procs <= 1:  # the student before distillation: the first point
        monitor.start(student)
        loss_before = float(monitor.curve[0][2])
    steps = ctx.recover_steps or auto_distill_steps(job, batch, params, record, loss_before)
    if monitor is not None:
        monitor.every = check_every(steps)
    precision = distill_precision(str(model_device(student).type), job.macs)
    # a monitored (automatic) run's schedule spans its cap whatever the machine's speed; the time cap only stops it
    config = DistillConfig(
        steps=steps,
        lr=lr,
        seed=job.seed,
        minutes=ctx.recover_minutes,
        precision=precision,
        budget_stops=monitor is not None and ctx.recover_procs <= 1,
    )
    if (lr, batch) != (ctx.recover_lr, ctx.recover_batch):
        record.note = f"{record.note}; lr {lr:g}, batch {batch} (auto)".lstrip("; ")
    if precision == "bf16":
        record.note = f"{record.note}; distilled in bf16 autocast (native on this CPU)".lstrip("; ")
    batches = TrainBatches(
        job.source, job.processor, job.shape, job.labels, batch=batch, seed=job.seed, augmentation=ctx.recover_augment
    )
    fingerprint = {"pruned": job.pruned.sha256 if job.pruned else "", "record": record.method, "batch": batch}
    return DistillSetup(config, batches, fingerprint, monitor)


def auto_distill_steps(
    job: DistillJob, batch: int, params: int, record: RecoveryRecord, loss_before: float | None
) -> int:
    """Return auto's step cap, scaled to what the plan removed and lost (`policy.scaled_cap_steps`); note it."""
    images = len(job.source.rows)
    cap = auto_cap_steps(images, batch, params)
    floor = auto_steps(images, batch, params)
    steps = scaled_cap_steps(cap, floor, job.removed, loss_before, job.removed_blocks)
    note = cap_steps_note(steps, cap, job.removed, loss_before)
    if note:
        record.note = f"{record.note}; {note}".lstrip("; ")
    return steps


def distill_student(
    student: nn.Module, teacher: nn.Module, job: DistillJob, ctx: Context, record: RecoveryRecord
) -> dict[str, Any]:
    """Run (or resume) the distillation of one candidate, in this process or a distributed job; return its summary.

    Both run the one loop, `distill.distill` (here, or on every rank of the job, `distributed.distill_ranked`),
    with the config `distill_setup` chose.
    """
    setup = distill_setup(student, job, ctx, record)
    if ctx.recover_procs > 1:  # a torch.distributed job; same steps, same checkpoints (docs/distributed.md)
        record.note = f"{record.note}; {ctx.recover_procs} processes distilled".lstrip("; ")
        return _distill_in_job(student, job, ctx, setup)
    monitor = setup.monitor
    if monitor is not None:  # started by distill_setup: the student before distillation may be the one kept
        monitor.folder = job.folder / run_layout.RECOVERY_STEPS
    info = distill(
        student,
        teacher,
        setup.batches,
        setup.config,
        checkpoint_dir=job.folder / run_layout.RECOVERY_STEPS,
        fingerprint=setup.fingerprint,
        progress=_progress_events(job, f"iteration {job.iteration}: distilling"),
        team=Team(monitor=monitor) if monitor is not None else None,
    )
    if monitor is None:
        return info
    kept = monitor.finish(student, info["steps_done"])  # the student stays in eval mode, as distill left it
    return {**info, "trial_curve": monitor.curve, "kept": kept}


def _distill_in_job(student: nn.Module, job: DistillJob, ctx: Context, setup: DistillSetup) -> dict[str, Any]:
    """Run the distillation as a torch.distributed job of `ctx.recover_procs` processes; return its summary."""
    attrs = read_recipe(job.pruned_path).get("attrs")
    task = f"iteration {job.iteration}: distilling on {ctx.recover_procs} processes"
    return distill_in_job(
        student,
        job.baseline_path,
        setup.batches,
        setup.config,
        data=JobData(job.dataset_ref, job.labels, attrs),
        files=JobFiles(job.folder / run_layout.RECOVERY_JOB, job.folder / run_layout.RECOVERY_STEPS, setup.fingerprint),
        launch=JobLaunch(
            ctx.recover_procs,
            ctx.launcher or DEFAULT_LAUNCHER,
            device=str(model_device(student).type),
            threads=max(1, ctx.threads),
        ),
        progress=_progress_events(job, task),
    )


def _progress_events(job: DistillJob, task: str) -> Callable[[dict[str, Any]], None]:
    """Return the loop's progress callback: a "progress" event of `task` per step, with its loss and agreement."""

    def progress(p: dict[str, Any]) -> None:
        label = f"loss {p['loss']:.3f}, agreement {p['agreement']:.0f}%"
        figures = {"loss": p["loss"], "agreement": p["agreement"]}
        job.emit(kind="progress", task=task, done=p["step"], total=p["total"], label=label, **figures)

    return progress


def cap_note(record: RecoveryRecord, ctx: Context) -> str:
    """Say that the time cap (wall-clock, or CPU per thread for auto) cut distillation short, and how to lift it."""
    asked = f"--recover-steps {ctx.recover_steps}" if ctx.recover_steps else "the automatic step count"
    clock = "" if ctx.recover_steps else " (CPU time per thread)"
    return (
        f"the {ctx.recover_minutes:g}-minute cap per candidate{clock} (--recover-minutes) cut distillation to "
        f"{record.steps} of {record.steps_planned} steps ({asked}); run them all with --recover-minutes 0 (no cap) "
        "or a larger value"
    )


def kept_note(kept: tuple[int, float, float], steps: int) -> str:
    """Say which checked student was kept instead of the last step's, and why."""
    step, best, last = kept
    when = "before distillation" if step == 0 else f"of step {step}"
    return f"kept the student {when}: trial slice top-1 {best:.2f}% against {last:.2f}% after the last step ({steps})"


def pruned_groups(recipe: dict[str, Any]) -> list[PrunedGroup]:
    """Return the groups a pruned artifact's recipe records as applied, with their removed unit indices."""
    return [PrunedGroup.model_validate(row) for row in (recipe.get("extra") or {}).get("applied") or []]


@dataclass
class Recovery:
    """The models and probes one candidate's recovery works on."""

    teacher: nn.Module  # the baseline
    student: Any  # the pruned Hugging Face classifier (its config says the number of labels); changed in place
    calib: Any  # the calibration images reconstruction regresses on
    applied: list[PrunedGroup]  # the pruned groups, with their removed units
    example: Any  # an input the self-check runs the recovered student on
    agree: Callable[[nn.Module, str], float]  # calibration agreement with the baseline, on a device
    device: str = "cpu"
    trial_refit: Callable[[nn.Module], dict[str, Any] | None] | None = None  # see `recover_student`


def recover_student(
    work: Recovery, steps: list[str], record: RecoveryRecord, *, job: DistillJob, ctx: Context
) -> tuple[nn.Module | None, dict[str, Any]]:
    """Run the recovery steps on `work.student` and fill `record`; return the recovered student and its curves.

    `work.trial_refit` loads the planning trial's refit of the same pruned units on the same images into the
    student and returns its facts (None: not the same, the refit runs; `tools/recovery/refit_cache.py`).

    A recovery that fails to train returns None (the one-shot weights are kept, `record.error` says why); one that
    cannot write its files raises `MachineFault` and a failed distributed job raises, so that a resume redoes them.
    """
    student = work.student
    record.calib_agreement_before = work.agree(student, work.device)
    curve: dict[str, Any] = {}
    try:
        if "reconstruct" in steps:
            curve["reconstruct"] = _reconstruct_step(work, job, record)
        if "distill" in steps:
            info = distill_student(student, work.teacher, job, ctx, record)
            record.steps, record.steps_planned = info["steps_done"], info["steps_planned"]
            if info.get("capped"):  # an explicit --recover-steps too: say which setting cut it and how to lift it
                record.note = f"{record.note}; {cap_note(record, ctx)}".lstrip("; ")
            record.resumed_from, record.loss = info["resumed_from"], info["loss"]
            record.stopped, record.trial_curve = stop_reason(info, not ctx.recover_steps), info.get("trial_curve")
            if info.get("kept"):
                record.kept_step = int(info["kept"][0])
                record.note = f"{record.note}; {kept_note(info['kept'], record.steps)}".lstrip("; ")
            curve["distill"] = info
        student = student.cpu().eval()
        self_check(student, work.example, int(student.config.num_labels))
    except (OSError, MachineFault) as exc:  # a full disk, a vanished folder: stop; a resume redoes the recovery
        raise write_failed(exc, job.iteration, job.folder) from exc
    except DistributedJobError:  # a failed or killed job: stop here; resume continues its steps
        raise
    except Exception as exc:  # recovery that fails to train leaves the one-shot pruned candidate as it was
        machine_fault(exc, failed_file(exc, job.folder), WRITE_FAILED.format(job.iteration))
        record.error = f"recovery abandoned: {one_line(exc)[:400]}"
        return None, curve
    record.calib_agreement_after = work.agree(student, "cpu")
    return student, curve


def _reconstruct_step(work: Recovery, job: DistillJob, record: RecoveryRecord) -> dict[str, Any]:
    """Refit the consumers of the pruned channels (or reuse the planning trial's refit); record the fit errors."""
    task = f"iteration {job.iteration}: reconstructing"
    info = work.trial_refit(work.student) if work.trial_refit is not None else None
    if info is not None:
        record.note = f"{record.note}; refit reused from the planning trial of this plan".lstrip("; ")
    else:
        info = reconstruct(
            work.teacher,
            work.student,
            work.calib,
            work.applied,
            seed=job.seed,
            progress=lambda d, n, name: job.emit(kind="progress", task=task, done=d, total=n, label=name),
        )
    fits = info["consumers"]
    record.consumers = len(fits)
    record.fit_error_before = round(sum(f["error_before"] for f in fits) / max(1, len(fits)), 5)
    record.fit_error_after = round(sum(f["error_after"] for f in fits) / max(1, len(fits)), 5)
    return info


def save_recovered(
    student: nn.Module,
    loaded: Any,
    record: RecoveryRecord,
    curve: dict[str, Any],
    *,
    folder: Path,
    iteration: int,
    root: Path,
) -> dict[str, Any]:
    """Write recovery.json and the recovered artifact (`record.curve` set); return save_artifact's result."""
    try:
        write_json_atomic(folder / run_layout.RECOVERY, {"iteration": iteration, "method": record.method, **curve})
        record.curve = str((folder / run_layout.RECOVERY).resolve().relative_to(root.resolve()))
        return save_artifact(
            student,
            folder / run_layout.RECOVERED,
            processor=loaded.processor,
            attrs=loaded.recipe.get("attrs"),
            extra={**(loaded.recipe.get("extra") or {}), "role": "recovered", "recovery": record.method},
        )
    except (OSError, MachineFault) as exc:
        raise write_failed(exc, iteration, folder) from exc


def mark_done(folder: Path, key: dict[str, Any], record: RecoveryRecord, recovered: ArtifactRef, message: str) -> None:
    """Record a finished recovery (so a re-run reuses it) and drop its step checkpoints and job files."""
    done = {"key": key, "record": record.model_dump(), "recovered": recovered.model_dump()}
    write_json_atomic(folder / DONE, {**done, "message": message})
    distill_state.clear(folder / run_layout.RECOVERY_STEPS)  # the artifact (and DONE) now hold the result
    shutil.rmtree(folder / run_layout.RECOVERY_JOB, ignore_errors=True)  # a distributed job's spec and starting student


def finished_recovery(folder: Path, root: Path, key: dict[str, Any]) -> tuple[ArtifactRef, RecoveryRecord, str] | None:
    """Return the recovery this iteration already finished with the same weights and settings, else None."""
    path = folder / DONE
    if not path.is_file():
        return None
    done = read_json(path)
    recovered = ArtifactRef.model_validate(done["recovered"])
    if done.get("key") != key or not (root / recovered.path).exists():
        return None
    if sha256_path(root / recovered.path) != recovered.sha256:
        return None
    return recovered, RecoveryRecord.model_validate(done["record"]), done["message"]


def recovery_message(record: RecoveryRecord) -> str:
    """Describe a finished recovery in one line."""
    message = (
        f"{record.method}: calibration agreement with the baseline {record.calib_agreement_before:.1f}% -> "
        f"{record.calib_agreement_after:.1f}% in {record.seconds:.1f} s"
    )
    if record.consumers:
        message += f"; {record.consumers} layers refitted (output error {record.fit_error_before:.3f} -> "
        message += f"{record.fit_error_after:.3f})"
    if record.steps:
        resumed = f", resumed at step {record.resumed_from}" if record.resumed_from else ""
        message += f"; {record.steps}/{record.steps_planned} distillation steps{resumed}"
        message += f" (stopped: {record.stopped})" if record.stopped else ""
    if record.note:
        message += f"; {record.note}"
    return message


def recovery_plan(requested: str, source: Any) -> tuple[list[str], RecoveryRecord]:
    """Return the recovery steps to run (reconstruct, distill) and the record they start from."""
    record = RecoveryRecord(requested=requested)
    steps, record.note = recovery_steps(requested, source is not None)
    record.method = method_name(steps)
    if source is not None and "distill" in steps:
        record.train_images, record.note = len(source.rows), f"distilled on {describe(source)}"
    return steps, record
