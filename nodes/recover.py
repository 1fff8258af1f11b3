"""Recovery agent: win back the accuracy pruning lost (reconstruction, then distillation from the baseline)."""

from __future__ import annotations

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
    load_artifact_model,
    prepared,
    run_dir,
    training_source,
)
from profiling_agent.state import ArtifactRef, Candidate, Context, RecoveryRecord, State
from profiling_agent.tools import run_layout
from profiling_agent.tools.planning.error_model import beyond_budget, trial_interval
from profiling_agent.tools.recovery.policy import removed_share


def done_key(state: State, ctx: Context) -> dict[str, Any]:
    """Return what a finished recovery depends on: the pruned weights and the recovery settings."""
    pruned = state.current.pruned if state.current else None
    return {
        "pruned": pruned.sha256 if pruned else "",
        "settings": [ctx.recover, ctx.recover_steps, ctx.recover_lr, ctx.recover_batch, ctx.recover_augment],
        "seed": state.dataset.seed,
    }


REJECTED = "; rejected: "  # in the recover step's message, before the reason (a resume reads it back)


class TrialSlice:
    """The trial slice the recover step judges by: its images, labels and the baseline's predictions there."""

    def __init__(self, state: State, teacher: Any) -> None:
        """Open the slice (`subsets.open_trial_slice`); its baseline predictions are the run's kept logits there."""
        from profiling_agent.tools.data.trial_slice import open_trial_slice  # lazy: torch; steps load without it
        from profiling_agent.tools.evaluation.baseline_logits import (
            kept_baseline_logits,
        )  # lazy: torch; steps load without it
        from profiling_agent.tools.evaluation.metrics import class_ids, top1  # lazy: torch; steps load without it
        from profiling_agent.tools.models.artifact_load import load_processor  # lazy: torch; steps load without it

        assert state.data is not None and state.baseline is not None  # the teacher is the baseline
        processor = load_processor(absolute(state, state.baseline.path))
        self.pixels, self.labels = open_trial_slice(
            run_dir(state),
            seed=state.dataset.seed,
            processor=processor,
            data_file=state.data.path,
            image_column=state.data.image_column,
        )
        self.ids = allowed_ids(state)
        logits = kept_baseline_logits(run_dir(state), self.pixels, state.baseline.sha256, teacher)  # read by each
        self.base = class_ids(logits, self.ids)
        self.baseline = top1(self.base, self.labels)

    def predict(self, model: Any) -> Any:
        """Return the model's predictions on the slice, on its own device."""
        from profiling_agent.tools.evaluation.metrics import predict  # lazy: torch; steps load without it
        from profiling_agent.tools.runtimes.forward import model_device  # lazy: torch; steps load without it

        return predict(model, self.pixels, allowed_ids=self.ids, device=str(model_device(model)))

    def score(self, model: Any) -> float:
        """Return the model's top-1 on the slice, %."""
        from profiling_agent.tools.evaluation.metrics import top1  # lazy: torch; steps load without it

        return top1(self.predict(model), self.labels)

    def monitor(self, cap_steps: int) -> Any:
        """Return the early-stopping monitor of a distillation of at most `cap_steps` steps."""
        from profiling_agent.tools.recovery.early_stop import plateau_monitor  # lazy: torch; steps load without it

        return plateau_monitor(self.score, len(self.labels), self.baseline, cap_steps)

    def judge(self, student: Any, record: RecoveryRecord, budget: float) -> str:
        """Score the recovered student, note its loss interval in `record`; return a rejection reason ('' or why)."""
        preds = self.predict(student)
        loss, low, high = trial_interval(self.base, preds, self.labels)
        curve = record.trial_curve = list(record.trial_curve or [])
        if not curve or curve[-1][0] != record.steps:  # the recovered student's own point
            acc = float((preds == self.labels).float().mean()) * 100
            curve.append([record.steps, round(acc, 3), round(self.baseline - acc, 3)])
        note = f"trial slice after recovery: {loss:.2f} pp lost ({low:.2f} to {high:.2f})"
        record.note = f"{record.note}; {note}".lstrip("; ")
        return beyond_budget(loss, low, high, budget)


def distill_job(state: State, runtime: Runtime[Context], source: Any, processor: Any):
    """Describe this iteration's distillation for the recovery tools: data, folders and progress events."""
    from profiling_agent.tools.recovery.candidate import DistillJob  # lazy: torch; steps load without it

    assert state.input_shape is not None and state.labels is not None and state.current is not None
    pruned, base, cur = state.current.pruned, state.baseline, state.current
    macs_before = state.profile.totals.get("macs") if state.profile else None
    return DistillJob(
        source=source,
        processor=processor,
        shape=state.input_shape.model_dump(),
        labels=state.labels.model_dump(),
        seed=state.dataset.seed,
        iteration=state.iteration,
        folder=run_layout.iteration_dir(run_dir(state), state.iteration),
        pruned=pruned,
        pruned_path=absolute(state, pruned.path if pruned else "."),
        baseline_path=absolute(state, base.path if base else "."),
        dataset_ref=state.dataset.ref,
        emit=lambda **payload: emit(runtime, **payload),
        macs=state.current.macs,
        removed_blocks=sum(a.kind == "block" for a in state.current.applied),
        removed=removed_share(cur.params_before, cur.params_after, int(macs_before or 0), cur.macs),
    )


def recovery_work(state: State, student: Any, applied: list[Any], device: str) -> Any:
    """Return the `Recovery` of the current candidate: the baseline as teacher, calibration images and probes."""
    from profiling_agent.tools.evaluation.baseline_logits import (
        kept_baseline_logits,
    )  # lazy: torch; steps load without it
    from profiling_agent.tools.evaluation.metrics import (  # lazy: torch; steps load without it
        agreement_probe,
        class_ids,
    )
    from profiling_agent.tools.recovery import candidate, refit_cache  # lazy: torch; steps load without it

    teacher = load_artifact_model(state, state.baseline, device=device).model
    calib, folder = prepared(state)["calib_pixels"], run_layout.iteration_dir(run_dir(state), state.iteration)
    base_sha = state.baseline.sha256 if state.baseline else ""
    ids = allowed_ids(state)
    reference = class_ids(kept_baseline_logits(run_dir(state), calib, base_sha, teacher), ids) if base_sha else None
    return candidate.Recovery(
        teacher,
        student.to(device),
        calib,
        applied,
        example=example_input(state),
        agree=agreement_probe(teacher, calib, allowed_ids=ids, device=device, reference=reference),  # the baseline's
        device=device,
        trial_refit=lambda model: refit_cache.load(
            folder, refit_cache.refit_key(applied, calib, state.dataset.seed, base_sha), model
        ),  # the key is hashed only when a refit would run
    )


def recovered(state: State, current: Candidate, record: RecoveryRecord, message: str) -> dict[str, Any]:
    """Return the node's update: the candidate with its recovery record, and the history line."""
    current.recovery = record
    return {"current": current.model_dump(), "history": event("recover", message, state.iteration)}


def recover(state: State, runtime: Runtime[Context]) -> dict[str, Any]:
    """Recover the pruned candidate's accuracy as the context says.

    A recovery that fails to train keeps the one-shot pruned weights (recorded); one that cannot write its files
    (a full disk) stops the run (a MachineFault naming the file), so a resume redoes it; one finished before an
    interruption is reused.
    """
    from profiling_agent.tools.device import measure_device  # lazy: torch; steps load without it
    from profiling_agent.tools.recovery import candidate, refit_cache  # lazy: torch; steps load without it

    ctx = context_of(runtime)  # applies the thread count: a resumed process starts here, with torch's default
    it, started = state.iteration, time.perf_counter()
    folder = run_layout.iteration_dir(run_dir(state), it)
    current = current_candidate(state)
    reused = candidate.finished_recovery(folder, run_dir(state), done_key(state, ctx))
    if reused is not None:
        current.recovered = reused[0]
        if REJECTED in reused[2]:  # its recovered trial missed the budget: still not evaluated in full
            current.status, current.error = "rejected", reused[2].split(REJECTED, 1)[1]
        return recovered(
            state, current, reused[1], f"{reused[2]} (finished before the interruption: reused, not redone)"
        )
    loaded = load_artifact_model(state, current.pruned)
    applied = candidate.pruned_groups(loaded.recipe)
    if ctx.recover == "none" or not any(row.removed for row in applied):
        note = "recovery off" if ctx.recover == "none" else "nothing was pruned"
        return recovered(state, current, RecoveryRecord(requested=ctx.recover, note=note), f"{note}: weights unchanged")
    source = training_source(state) if ctx.recover in ("distill", "auto") else None
    steps, record = candidate.recovery_plan(ctx.recover, source)
    device = "cpu" if "distill" not in steps else measure_device(ctx.device)
    work = recovery_work(state, loaded.model, applied, device)
    job = distill_job(state, runtime, source, loaded.processor)
    trial = TrialSlice(state, work.teacher)  # judges early stopping and the recovered candidate
    job.monitor = trial.monitor
    student, curve = candidate.recover_student(work, steps, record, job=job, ctx=ctx)
    record.seconds = round(time.perf_counter() - started, 2)
    if student is None:  # training failed: the one-shot pruned candidate stays as it was
        return recovered(state, current, record, str(record.error))
    reason = trial.judge(student, record, state.objective.max_acc_drop)
    reason = "" if current.planner_meta.baseline else reason  # a uniform baseline is measured whatever it lost
    if reason:  # its whole interval misses the budget: not carried to a full evaluation as if it might pass
        current.status, current.error = "rejected", reason
    saved = candidate.save_recovered(student, loaded, record, curve, folder=folder, iteration=it, root=run_dir(state))
    record.seconds = round(time.perf_counter() - started, 2)
    current.recovered = ArtifactRef.model_validate(artifact_ref(state, saved))
    message = candidate.recovery_message(record) + (f"{REJECTED}{reason}" if reason else "")
    candidate.mark_done(folder, done_key(state, ctx), record, current.recovered, message)
    refit_cache.discard(folder)
    return recovered(state, current, record, message)
