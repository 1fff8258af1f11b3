"""Recovery agent: win back the accuracy pruning lost (reconstruction, then distillation from the baseline)."""

from __future__ import annotations

import shutil
import time
from typing import Any

from langgraph.runtime import Runtime

from profiling_agent.nodes.common import (
    absolute,
    allowed_ids,
    artifact_ref,
    context_of,
    current_candidate,
    emit,
    event,
    example_input,
    iteration_dir,
    load_artifact_model,
    prepared,
    rel,
    run_dir,
)
from profiling_agent.state import ArtifactRef, Context, RecoveryRecord, State


def _agreement(model, reference_preds, pixels, ids, device: str = "cpu") -> float:
    from profiling_agent.tools.evaluation.metrics import agreement, predict

    return agreement(predict(model, pixels, allowed_ids=ids, device=device), reference_preds)


def training_source(state: State):
    """Find the images recovery may train on (never a validation, test or calibration image), or None."""
    from profiling_agent.tools.data.train_stream import find_train_source
    from profiling_agent.tools.io import read_json

    assert state.labels is not None
    subsets = read_json(run_dir(state) / (state.data.subsets if state.data else "subsets.json"))
    return find_train_source(
        state.dataset.ref,
        state.dataset.split,
        subsets,
        image_column=state.labels.image_column,
        label_column=state.labels.label_column,
        train_split=state.dataset.train_split,
    )


def _distill(state: State, ctx: Context, runtime, student, teacher, source, processor, record) -> dict[str, Any]:
    """Run (or resume) the distillation of one candidate and return distill's summary."""
    from profiling_agent.tools.data.train_stream import TrainBatches
    from profiling_agent.tools.models.sizes import count_params
    from profiling_agent.tools.recovery.distill import DistillConfig, distill
    from profiling_agent.tools.recovery.policy import auto_steps

    assert state.input_shape is not None and state.labels is not None and state.current is not None
    it = state.iteration
    batch = max(1, ctx.recover_batch)
    steps = ctx.recover_steps or auto_steps(len(source.rows), batch, count_params(student))
    config = DistillConfig(steps=steps, lr=ctx.recover_lr, seed=state.dataset.seed, minutes=ctx.recover_minutes)
    batches = TrainBatches(
        source,
        processor,
        state.input_shape.model_dump(),
        state.labels.model_dump(),
        batch=batch,
        seed=state.dataset.seed,
        augmentation=ctx.recover_augment,
    )
    task = f"iteration {it}: distilling"

    def progress(p: dict[str, Any]) -> None:
        label = f"loss {p['loss']:.3f}, agreement {p['agreement']:.0f}%"
        emit(
            runtime,
            kind="progress",
            task=task,
            done=p["step"],
            total=p["total"],
            label=label,
            loss=p["loss"],
            agreement=p["agreement"],
        )

    pruned = state.current.pruned
    fingerprint = {"pruned": pruned.sha256 if pruned else "", "record": record.method, "batch": batch}
    if ctx.recover_procs > 1:  # a torch.distributed job; same steps, same checkpoints (docs/distributed.md)
        from profiling_agent.tools.models.artifacts import read_recipe
        from profiling_agent.tools.recovery.distributed import distill_in_job
        from profiling_agent.tools.recovery.distributed_launch import DEFAULT_LAUNCHER
        from profiling_agent.tools.runtimes.forward import model_device

        assert state.baseline is not None and pruned is not None
        attrs = read_recipe(absolute(state, pruned.path)).get("attrs")
        task = f"iteration {it}: distilling on {ctx.recover_procs} processes"
        folder = iteration_dir(state, it)
        record.note = f"{record.note}; {ctx.recover_procs} processes distilled".lstrip("; ")
        return distill_in_job(
            student, absolute(state, state.baseline.path), batches, config, dataset_ref=state.dataset.ref,
            mapping=state.labels.model_dump(), procs=ctx.recover_procs, job_dir=folder / "recovery_job",
            checkpoint_dir=folder / "recovery_steps", fingerprint=fingerprint,
            launcher=ctx.launcher or DEFAULT_LAUNCHER, device=str(model_device(student).type),
            threads=max(1, ctx.threads), attrs=attrs, progress=progress,
        )  # fmt: skip
    return distill(
        student,
        teacher,
        batches,
        config,
        checkpoint_dir=iteration_dir(state, it) / "recovery_steps",
        fingerprint=fingerprint,
        progress=progress,
    )


DONE = "recovery_done.json"  # in the iteration folder: a finished recovery, so a re-run of the node reuses it


def _done_key(state: State, ctx: Context) -> dict[str, Any]:
    """Return what a finished recovery depends on: the pruned weights and the recovery settings."""
    pruned = state.current.pruned if state.current else None
    return {
        "pruned": pruned.sha256 if pruned else "",
        "settings": [ctx.recover, ctx.recover_steps, ctx.recover_lr, ctx.recover_batch, ctx.recover_augment],
        "seed": state.dataset.seed,
    }


def _finished_before(state: State, ctx: Context, current) -> dict[str, Any] | None:
    """Return the update of a recovery this iteration already finished (same weights and settings), else None."""
    from profiling_agent.tools.io import read_json, sha256_path

    path = iteration_dir(state, state.iteration) / DONE
    if not path.is_file():
        return None
    done = read_json(path)
    recovered = ArtifactRef.model_validate(done["recovered"])
    if done.get("key") != _done_key(state, ctx) or not (run_dir(state) / recovered.path).exists():
        return None
    if sha256_path(run_dir(state) / recovered.path) != recovered.sha256:
        return None
    current.recovered, current.recovery = recovered, RecoveryRecord.model_validate(done["record"])
    message = f"{done['message']} (finished before the interruption: reused, not redone)"
    return {"current": current.model_dump(), "history": event("recover", message, state.iteration)}


def _write_failed(exc: OSError, it: int) -> OSError:
    """Return the OSError that stops the run: a recovery that cannot save its work is not silently skipped."""
    where = f": {exc.filename}" if exc.filename else ""
    reason = exc.strerror or str(exc)
    return OSError(exc.errno, f"iteration {it}'s recovery could not write its files ({reason}){where}")


def recover(state: State, runtime: Runtime[Context]) -> dict[str, Any]:
    """Recover the pruned candidate's accuracy as the context says.

    A recovery that fails to train keeps the one-shot pruned weights (recorded); one that cannot write its files
    (a full disk) stops the run with OSError, so a resume redoes it; one finished before an interruption is reused.
    """
    from profiling_agent.tools.compression.self_check import self_check
    from profiling_agent.tools.device import resolve_device, set_threads
    from profiling_agent.tools.evaluation.metrics import predict
    from profiling_agent.tools.io import write_json_atomic
    from profiling_agent.tools.models.artifacts import save_artifact
    from profiling_agent.tools.recovery import distill_state
    from profiling_agent.tools.recovery.distributed_launch import DistributedJobError
    from profiling_agent.tools.recovery.policy import method_name, recovery_steps
    from profiling_agent.tools.recovery.reconstruct import reconstruct
    from profiling_agent.tools.text import one_line

    ctx = context_of(runtime)
    set_threads(ctx.threads)  # as the other nodes do: a resumed process starts here, with torch's default count
    it, started = state.iteration, time.perf_counter()
    current = current_candidate(state)
    reused = _finished_before(state, ctx, current)
    if reused is not None:
        return reused
    record = RecoveryRecord(requested=ctx.recover)
    loaded = load_artifact_model(state, current.pruned)
    applied = (loaded.recipe.get("extra") or {}).get("applied") or []
    if ctx.recover == "none" or not any(row.get("removed") for row in applied):
        record.note = "recovery off" if ctx.recover == "none" else "nothing was pruned"
        current.recovery = record
        return {"current": current.model_dump(), "history": event("recover", f"{record.note}: weights unchanged", it)}
    source = training_source(state) if ctx.recover in ("distill", "auto") else None
    steps, record.note = recovery_steps(ctx.recover, source is not None)
    record.method = method_name(steps)
    if source is not None and "distill" in steps:
        from profiling_agent.tools.data.train_stream import describe

        record.train_images, record.note = len(source.rows), f"distilled on {describe(source)}"
    device = "cpu" if "distill" not in steps else str(resolve_device(ctx.device))
    teacher = load_artifact_model(state, state.baseline, device=device).model
    student = loaded.model.to(device)
    tensors = prepared(state)
    calib = tensors["calib_pixels"]
    ids = allowed_ids(state)
    reference = predict(teacher, calib, allowed_ids=ids, device=device)
    record.calib_agreement_before = _agreement(student, reference, calib, ids, device)
    curve: dict[str, Any] = {}
    try:
        if "reconstruct" in steps:
            task = f"iteration {it}: reconstructing"
            info = reconstruct(
                teacher,
                student,
                calib,
                applied,
                seed=state.dataset.seed,
                progress=lambda d, n, name: emit(runtime, kind="progress", task=task, done=d, total=n, label=name),
            )
            fits = info["consumers"]
            record.consumers = len(fits)
            record.fit_error_before = round(sum(f["error_before"] for f in fits) / max(1, len(fits)), 5)
            record.fit_error_after = round(sum(f["error_after"] for f in fits) / max(1, len(fits)), 5)
            curve["reconstruct"] = info
        if "distill" in steps:
            info = _distill(state, ctx, runtime, student, teacher, source, loaded.processor, record)
            record.steps, record.steps_planned = info["steps_done"], info["steps_planned"]
            record.resumed_from, record.loss = info["resumed_from"], info["loss"]
            curve["distill"] = info
        student = student.cpu().eval()
        self_check(student, example_input(state), int(student.config.num_labels))
    except OSError as exc:  # a full disk, a vanished folder: stop, so that a resume redoes the recovery
        raise _write_failed(exc, it) from exc
    except DistributedJobError:  # a failed or killed job: stop here; resume continues its steps
        raise
    except Exception as exc:  # recovery that fails to train leaves the one-shot pruned candidate as it was
        record.error = f"recovery abandoned: {one_line(exc)[:400]}"
        record.seconds = round(time.perf_counter() - started, 2)
        current.recovery = record
        return {"current": current.model_dump(), "history": event("recover", record.error, it)}
    record.calib_agreement_after = _agreement(student, reference.cpu(), calib, ids)
    folder = iteration_dir(state, it)
    try:
        write_json_atomic(folder / "recovery.json", {"iteration": it, "method": record.method, **curve})
        record.curve = rel(state, folder / "recovery.json")
        saved = save_artifact(
            student,
            folder / "recovered",
            processor=loaded.processor,
            attrs=loaded.recipe.get("attrs"),
            extra={**(loaded.recipe.get("extra") or {}), "role": "recovered", "recovery": record.method},
        )
    except OSError as exc:
        raise _write_failed(exc, it) from exc
    record.seconds = round(time.perf_counter() - started, 2)
    current.recovered = ArtifactRef.model_validate(artifact_ref(state, saved))
    current.recovery = record
    message = _message(record)
    done = {"key": _done_key(state, ctx), "record": record.model_dump(), "recovered": current.recovered.model_dump()}
    write_json_atomic(folder / DONE, {**done, "message": message})
    distill_state.clear(folder / "recovery_steps")  # the artifact (and DONE) now hold the result
    shutil.rmtree(folder / "recovery_job", ignore_errors=True)  # a distributed job's spec and starting student
    return {"current": current.model_dump(), "history": event("recover", message, it)}


def _message(record: RecoveryRecord) -> str:
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
    if record.note:
        message += f"; {record.note}"
    return message
