"""Distillation as a torch.distributed job: DDP over ranks that each read a slice of every step's global batch.

The recover node calls `distill_in_job`, which saves the starting student, writes a job spec and runs the job
through a launcher (`torchrun --standalone --nproc-per-node N` by default); each rank runs `main` (this module as
`python -m profiling_agent.tools.recovery.distributed SPEC`). Step s reads the same global batch as the
single-process `distill` (rows and augmentation depend only on (seed, s)); rank r decodes only its slice of it, its
loss is scaled so that DDP's averaged gradient is the gradient of the global batch's mean loss, and rank 0 saves
the steps with `distill_state` in the format (and with the resume key) of the single-process run, so either kind of
run continues the other's steps. BatchNorm statistics stay frozen, as in `distill`; dropout draws differ by rank.
"""

from __future__ import annotations

import dataclasses
import inspect
import statistics
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from profiling_agent.tools.data.train_stream import TrainBatches, TrainSource
from profiling_agent.tools.recovery import distill_state
from profiling_agent.tools.recovery.distill import PROBE_STEPS, DistillConfig, distill_loss, fresh_parameters, lr_at
from profiling_agent.tools.recovery.distributed_launch import (
    DEFAULT_LAUNCHER,
    DistributedJobError,
    Rank,
    close_group,
    init_group,
    launcher_command,
    parent_alive,
    record_failure,
    report_progress,
    run_job,
)

MODULE = "profiling_agent.tools.recovery.distributed"
SPEC = "job.json"


def shard_bounds(n: int, rank: int, world: int) -> tuple[int, int]:
    """Return [start, stop) of rank's contiguous slice of n items (sizes differ by at most one)."""
    return rank * n // world, (rank + 1) * n // world


class ShardBatches(TrainBatches):
    """A TrainBatches that returns only this rank's slice of each step's global batch.

    The rows of step s are the single-process run's rows; the slice is augmented with the random numbers the
    single-process run draws for those positions (the whole batch's draws are replayed), so the slices of all
    ranks, put together, are the single-process batch.
    """

    def __init__(self, *args: Any, rank: int = 0, world: int = 1, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.rank, self.world = rank, world
        self.counts: tuple[int, int] = (0, 0)  # the last step's global batch: images, labelled images
        column = self.source.ds[self.source.label_column]  # every label once (8 bytes a row): no read per step
        self.model_ids = np.array([self.table.get(self.to_index(v), -1) for v in column], dtype=np.int64)

    def __call__(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Return (pixels, labels) of this rank's slice of step `step`; `counts` then holds the global batch's."""
        rows = self.rows(step)
        lo, hi = shard_bounds(len(rows), self.rank, self.world)
        every = self.model_ids[rows]
        self.counts = (len(every), int((every >= 0).sum()))
        labels = every[lo:hi].tolist()
        images = self.source.ds.select(rows[lo:hi].tolist())[self.source.image_column]
        from profiling_agent.tools.data.preprocess import preprocess_images

        pixels = preprocess_images(images, self.processor, self.shape)
        if self.augmentation:
            generator = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
            pixels = augment_slice(pixels, generator, self.flip, self.scale, lo, len(rows))
        return pixels, torch.tensor(labels, dtype=torch.long)


def augment_slice(
    pixels: torch.Tensor, generator: torch.Generator, flip: bool, scale: tuple[float, float], start: int, total: int
) -> torch.Tensor:
    """Augment images start.. of a `total`-image batch as `train_stream.augment` augments the whole batch.

    The random numbers of every image of the batch are drawn, in `augment`'s order, so each image of the slice gets
    the crop and flip it gets in a single process; only the slice is cropped and resized.
    (`tests/test_distributed.py` checks the slices against `augment` itself.)
    """
    n, _, height, width = pixels.shape
    out = torch.empty_like(pixels)
    for i in range(total):
        area = float(torch.empty(1).uniform_(*scale, generator=generator))
        h, w = max(1, round(height * area**0.5)), max(1, round(width * area**0.5))
        top = int(torch.randint(0, height - h + 1, (1,), generator=generator))
        left = int(torch.randint(0, width - w + 1, (1,), generator=generator))
        flipped = flip and bool(torch.rand(1, generator=generator) < 0.5)
        if start <= i < start + n:
            crop = pixels[i - start : i - start + 1, :, top : top + h, left : left + w]
            image = F.interpolate(crop, size=(height, width), mode="bilinear", align_corners=False)
            out[i - start] = image[0].flip(-1) if flipped else image[0]
    return out


def _frozen_bn_train(student: nn.Module) -> None:
    student.train()
    for module in student.modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            module.eval()


def _sum(values: list[float], world: int) -> list[float]:
    """All-reduce (sum) a few floats across ranks (a no-op with one process)."""
    if world == 1:
        return values
    import torch.distributed as dist

    tensor = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(tensor)
    return tensor.tolist()


def _inputs(student: nn.Module, pixels: torch.Tensor) -> Any:
    takes = "pixel_values" in inspect.signature(student.forward).parameters
    return {"pixel_values": pixels} if takes else pixels


def distill_ranked(
    student: nn.Module,
    teacher: nn.Module,
    batches: Callable[[int], tuple[torch.Tensor, torch.Tensor]],
    config: DistillConfig,
    rank: Rank,
    *,
    checkpoint_dir: Path | None = None,
    fingerprint: dict[str, Any] | None = None,
    progress: Callable[[dict[str, Any]], None] | None = None,
    keep_going: Callable[[], bool] = lambda: True,
) -> dict[str, Any]:
    """Run `distill`'s schedule on this rank's slices, gradients averaged by DistributedDataParallel.

    Args:
        student: The starting student (the same on every rank); trained in place.
        teacher: The baseline.
        batches: This rank's (pixels, labels) of a step.
        config: The single-process run's config (steps, lr, seed, cap ...).
        rank: This process's place in the job.
        checkpoint_dir: Where rank 0 saves steps (distill_state format; read by every rank on resume).
        fingerprint: The resume key's facts (as the single-process run's).
        progress: Rank 0's per-step callback ({"step", "total", "loss", "agreement"}).
        keep_going: Rank 0's check between steps; False stops every rank after saving the step.

    Returns:
        distill's summary plus {"procs": world}.
    """
    device, world = rank.device, rank.world
    teacher.to(device).eval()
    student.to(device)
    fresh_parameters(student)
    params = [p for p in student.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay)
    key = {"config": config.fingerprint(), **(fingerprint or {})}
    state: dict[str, Any] = {"total": config.steps, "spent": 0.0, "curve": [], "agreement": None, "loss": None}
    state["fitted"] = False
    start = 0
    if checkpoint_dir is not None:
        peeked = distill_state.peek(checkpoint_dir)
        if peeked is not None and peeked.get("key") == key:
            saved = distill_state.load_latest(checkpoint_dir, student, optimizer)
            assert saved is not None
            state = {k: saved[k] for k in state}
            start = int(saved["step"]) + 1
        elif peeked is not None and rank.rank == 0:
            distill_state.clear(checkpoint_dir)
    model: nn.Module = student
    if world > 1:
        from torch.nn.parallel import DistributedDataParallel

        ids = [device.index] if device.type == "cuda" else None
        model = DistributedDataParallel(student, device_ids=ids, broadcast_buffers=False)
    every = config.save_every or max(1, config.steps // 20)
    cap_s = config.minutes * 60.0
    cast = device.type == "cuda"
    began, spent0, timings, cpu0 = time.perf_counter(), float(state["spent"]), [], time.process_time()
    step, stop = start, False
    _frozen_bn_train(student)
    while step < state["total"] and not stop:
        tick = time.perf_counter()
        torch.manual_seed(config.seed * 1_000_003 + step)
        pixels, labels = batches(step)
        pixels, labels = pixels.to(device), labels.to(device)
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, state["total"], config.lr, config.warmup)
        n_local, lab_local = len(labels), int((labels >= 0).sum())
        if isinstance(batches, ShardBatches):  # the global batch's counts without a collective
            n_all, lab_all = (float(c) for c in batches.counts)
        else:
            n_all, lab_all = _sum([float(n_local), float(lab_local)], world)
        with torch.no_grad():
            teacher_logits = _logits(teacher, pixels)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=cast):
            student_logits = _logits(model, pixels, student).float()
        kl, _ = distill_loss(student_logits, teacher_logits, labels, dataclasses.replace(config, ce_weight=0.0))
        loss = kl * (n_local * world / n_all)
        if config.ce_weight > 0 and lab_local > 0:  # CE: a mean over the global batch's labelled images
            ce, _ = distill_loss(student_logits, teacher_logits, labels, dataclasses.replace(config, kl_weight=0.0))
            loss = loss + ce * (lab_local * world / lab_all)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, config.clip)
        optimizer.step()
        agree = float((student_logits.argmax(-1) == teacher_logits.argmax(-1)).sum())
        state["spent"] = spent0 + time.perf_counter() - began
        timings.append(time.perf_counter() - tick)
        total, halt = float(state["total"]), 0.0
        if rank.rank == 0:
            if cap_s > 0 and not state["fitted"] and len(timings) == PROBE_STEPS:
                total = float(_fit(state["total"], step, state["spent"], statistics.median(timings), cap_s))
            halt = float((cap_s > 0 and state["spent"] >= cap_s) or not keep_going())
        mine = [float(loss.detach()), agree, total if rank.rank == 0 else 0.0, halt]
        loss_sum, agree_sum, total, halt = _sum(mine, world)
        if len(timings) == PROBE_STEPS and cap_s > 0 and not state["fitted"]:
            state["fitted"] = True
        state["total"] = int(total)
        stop = halt > 0
        ema_new = agree_sum / n_all * 100
        ema = ema_new if state["agreement"] is None else 0.9 * state["agreement"] + 0.1 * ema_new
        state.update(loss=round(loss_sum / world, 6), agreement=round(ema, 3))
        state["curve"].append([step, state["loss"], state["agreement"]])
        last = step + 1 >= state["total"] or stop
        if rank.rank == 0 and checkpoint_dir is not None and ((step + 1) % every == 0 or last):
            distill_state.save_step(checkpoint_dir, step, student, optimizer, {**state, "key": key})
        if progress is not None and rank.rank == 0:
            progress(
                {"step": step + 1, "total": state["total"], "loss": state["loss"], "agreement": state["agreement"]}
            )
        step += 1
    student.eval()
    return {
        "steps_planned": config.steps,
        "steps_done": step,
        "resumed_from": start,
        "seconds": round(float(state["spent"]), 3),
        "loss": state["loss"],
        "agreement": state["agreement"],
        "curve": state["curve"],
        "capped": step < config.steps,
        "procs": world,
        "cpu_seconds": round(time.process_time() - cpu0, 3),  # this rank's CPU time in the loop (this attempt)
    }


def _logits(model: nn.Module, pixels: torch.Tensor, inner: nn.Module | None = None) -> torch.Tensor:
    from profiling_agent.tools.models.forward import logits_of

    inputs = _inputs(inner or model, pixels)  # a DDP wrapper's forward takes *args: ask the wrapped model
    return logits_of(model(**inputs) if isinstance(inputs, dict) else model(inputs)).float()


def _fit(total: int, step: int, spent: float, step_seconds: float, cap_s: float) -> int:
    """Shrink the planned steps so the rest fits the wall-clock cap (distill's rule)."""
    if step_seconds <= 0:
        return total
    return max(step + 1, min(total, step + int((cap_s - spent) / step_seconds)))


# ---------------------------------------------------------------- the job: one process per rank


def main(argv: list[str] | None = None) -> int:
    """Run one rank of a distillation job described by the spec file argv[0] (what the launcher starts)."""
    from profiling_agent.tools.data.sources import load_split
    from profiling_agent.tools.io import read_json, write_json_atomic
    from profiling_agent.tools.models.artifact_load import load_artifact

    spec_path = Path((argv if argv is not None else sys.argv[1:])[0])
    spec = read_json(spec_path)
    job_dir = spec_path.parent
    torch.set_num_threads(max(1, int(spec.get("threads") or 1)))
    rank = Rank(0, 1, 0, torch.device("cpu"))
    try:
        rank = init_group(spec["device"], job_dir)
        loaded = load_artifact(spec["student"])
        teacher = load_artifact(spec["teacher"]).model
        data = spec["data"]
        ds = load_split(data["ref"], data["split"])
        rows = np.load(job_dir / "rows.npy")
        source = TrainSource(ds, data["split"], rows, data["image_column"], data["label_column"])
        batches = ShardBatches(
            source, loaded.processor, spec["shape"], spec["mapping"], batch=int(spec["batch"]),
            seed=int(spec["seed"]), augmentation=bool(spec["augment"]), rank=rank.rank, world=rank.world,
        )  # fmt: skip
        config = DistillConfig(**spec["config"])
        info = distill_ranked(
            loaded.model,
            teacher,
            batches,
            config,
            rank,
            checkpoint_dir=Path(spec["checkpoint_dir"]),
            fingerprint=spec["fingerprint"],
            progress=report_progress,
            keep_going=lambda: parent_alive(spec.get("watch")),
        )
        if rank.rank == 0:
            from safetensors.torch import save_file

            weights = {k: v.detach().cpu().contiguous() for k, v in loaded.model.state_dict().items()}
            save_file(weights, str(job_dir / "student.safetensors"))
            write_json_atomic(job_dir / "result.json", info)
        close_group()
    except BaseException as exc:  # noqa: BLE001 - every failure becomes the one-line reason the parent reports
        record_failure(job_dir, rank.rank, exc)
        return 1
    return 0


# ---------------------------------------------------------------- the parent: the recover node's side


def distill_in_job(
    student: nn.Module,
    teacher_dir: Path,
    batches: TrainBatches,
    config: DistillConfig,
    *,
    dataset_ref: str,
    mapping: Mapping[str, Any],
    procs: int,
    job_dir: Path,
    checkpoint_dir: Path,
    fingerprint: dict[str, Any],
    launcher: str = DEFAULT_LAUNCHER,
    device: str = "cpu",
    threads: int = 1,
    attrs: Mapping[str, Any] | None = None,
    progress: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Distill `student` in a torch.distributed job of `procs` processes and load the result into it.

    The starting student is saved to `job_dir/start` (an artifact), the training rows to `job_dir/rows.npy` and
    the job to `job_dir/job.json`; the launcher runs `procs` ranks of `main`. Rank 0 saves resumable steps to
    `checkpoint_dir` as the single-process `distill` does, so a failed job leaves a state that either kind of
    run continues.

    Args:
        student: The starting student; receives the distilled weights.
        teacher_dir: The baseline's artifact folder.
        batches: What the single-process run would read (source, processor, shape, batch, seed, augmentation).
        config: The distillation config.
        dataset_ref: The dataset the training split is loaded from.
        mapping: The run's label mapping (dataset_to_model).
        procs: Ranks to start.
        job_dir: The job's folder (spec, starting student, rank pids and errors, result).
        checkpoint_dir: Where steps are saved and resumed from.
        fingerprint: The resume key's facts, as for `distill`.
        launcher: Launcher template (`{procs}` is replaced); `-m MODULE SPEC` is appended.
        device: "cpu" (gloo) or "cuda" (NCCL, one GPU per local rank).
        threads: torch threads per rank.
        attrs: The student artifact's size attributes (pruned heads), so it rebuilds.
        progress: Called with rank 0's progress items.

    Returns:
        distill's summary plus {"procs"}.

    Raises:
        DistributedJobError: The job failed or was killed (one line; the saved steps stay for a resume).
    """
    import os
    import socket

    from profiling_agent.tools.io import write_json_atomic
    from profiling_agent.tools.models.artifacts import save_artifact

    job_dir.mkdir(parents=True, exist_ok=True)
    for old in ("result.json", "student.safetensors"):
        (job_dir / old).unlink(missing_ok=True)
    save_artifact(student.cpu(), job_dir / "start", processor=batches.processor, attrs=attrs)
    np.save(job_dir / "rows.npy", np.asarray(batches.source.rows, dtype=np.int64))
    spec = {
        "student": str(job_dir / "start"),
        "teacher": str(teacher_dir),
        "data": {
            "ref": dataset_ref,
            "split": batches.source.split,
            "image_column": batches.source.image_column,
            "label_column": batches.source.label_column,
        },
        "shape": batches.shape,
        "mapping": dict(mapping),
        "batch": batches.batch,
        "seed": batches.seed,
        "augment": batches.augmentation,
        "config": dataclasses.asdict(config),
        "fingerprint": fingerprint,
        "checkpoint_dir": str(checkpoint_dir),
        "device": device,
        "threads": threads,
        "watch": {"pid": os.getpid(), "host": socket.gethostname()},
    }
    write_json_atomic(job_dir / SPEC, spec)
    command = launcher_command(launcher, procs, MODULE, [str(job_dir / SPEC)])
    what = f"distributed distillation ({procs} processes)"
    try:
        run_job(command, job_dir, progress=progress, what=what)
    except DistributedJobError as exc:
        saved = distill_state.peek(checkpoint_dir)
        kept = f"steps up to {int(saved['step']) + 1} of {saved['total']} are saved" if saved else "no step was saved"
        raise DistributedJobError(f"{exc}; {kept} in {checkpoint_dir}: resume continues from there") from None
    from profiling_agent.tools.io import read_json

    if not (job_dir / "result.json").is_file():
        raise DistributedJobError(f"{what} ended without writing {job_dir / 'result.json'}")
    from safetensors.torch import load_file

    student.load_state_dict(load_file(str(job_dir / "student.safetensors")))
    return dict(read_json(job_dir / "result.json"))


if __name__ == "__main__":
    sys.exit(main())
