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
import os
import socket
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from safetensors.torch import load_file, save
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from profiling_agent.tools import interrupt
from profiling_agent.tools.data.preprocess import preprocess_images
from profiling_agent.tools.data.sources import load_split
from profiling_agent.tools.data.train_stream import TrainBatches, TrainSource, augment
from profiling_agent.tools.io import read_json, write_bytes_atomic, write_json_atomic
from profiling_agent.tools.models.artifact_load import load_artifact
from profiling_agent.tools.models.artifacts import save_artifact
from profiling_agent.tools.recovery import distill_state
from profiling_agent.tools.recovery.distill import DistillConfig, Team, distill
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

        pixels = preprocess_images(images, self.processor, self.shape)
        if self.augmentation:
            generator = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
            pixels = augment(pixels, generator, self.flip, self.scale, lo, len(rows))
        return pixels, torch.tensor(labels, dtype=torch.long)


def _sum(values: list[float]) -> list[float]:
    """All-reduce (sum) a few floats across the job's ranks."""
    tensor = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(tensor)
    return [float(v) for v in tensor.tolist()]


@dataclasses.dataclass(frozen=True)
class Lead:
    """What rank 0 alone does in a job: report each step, and check after it whether the job goes on."""

    progress: Callable[[dict[str, Any]], None] | None = None  # {"step", "total", "loss", "agreement"}
    keep_going: Callable[[], bool] = lambda: True  # False: the step is saved and every rank stops (Interrupted)


def distill_ranked(
    student: nn.Module,
    teacher: nn.Module,
    batches: Callable[[int], tuple[torch.Tensor, torch.Tensor]],
    config: DistillConfig,
    rank: Rank,
    *,
    checkpoint_dir: Path | None = None,
    fingerprint: dict[str, Any] | None = None,
    lead: Lead | None = None,
) -> dict[str, Any]:
    """Run `distill` as this rank of the job: its loop and checkpoints, gradients all-reduced by DDP.

    Args:
        student: The starting student (the same on every rank); trained in place.
        teacher: The baseline.
        batches: This rank's (pixels, labels) of a step (a ShardBatches knows the global batch's counts).
        config: The single-process run's config (steps, lr, seed, budget ...).
        rank: This process's place in the job.
        checkpoint_dir: Where rank 0 saves steps (distill's format; read by every rank on resume).
        fingerprint: The resume key's facts (as the single-process run's).
        lead: What rank 0 alone does: report each step, and check whether the job goes on.

    Returns:
        distill's summary plus {"procs": world, "cpu_seconds": this rank's CPU time in this attempt}.
    """
    device, world = rank.device, rank.world
    lead = lead or Lead()
    teacher.to(device)
    student.to(device)

    def wrap(model: nn.Module) -> nn.Module:
        ids = [device.index] if device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=ids, broadcast_buffers=False)

    def scales(labels: torch.Tensor) -> tuple[float, float]:
        """Each rank's share of the global batch's images and labelled images, times the world size."""
        n, labelled = len(labels), int((labels >= 0).sum())
        if isinstance(batches, ShardBatches):  # the global batch's counts without a collective
            n_all, labelled_all = (float(c) for c in batches.counts)
        else:
            n_all, labelled_all = _sum([float(n), float(labelled)])
        return n * world / n_all, (labelled * world / labelled_all if labelled else 0.0)

    team = Team(rank.rank, world, _sum, wrap, scales, halt=lambda: not lead.keep_going())
    if world == 1:  # a one-process job: nothing to wrap, scale or sum
        team = Team(halt=team.halt)
    cpu0 = time.process_time()
    info = distill(
        student,
        teacher,
        batches,
        config,
        checkpoint_dir=checkpoint_dir,
        fingerprint=fingerprint,
        progress=lead.progress if rank.rank == 0 else None,
        team=team,
    )
    return {**info, "procs": world, "cpu_seconds": round(time.process_time() - cpu0, 3)}


# ---------------------------------------------------------------- the job: one process per rank


def main(argv: list[str] | None = None) -> int:
    """Run one rank of a distillation job described by the spec file argv[0] (what the launcher starts).

    SIGTERM or SIGINT (the parent stopping the job) raises `Interrupted` in the running step; like any failure it
    ends the rank with status 1 and a one-line reason in the job folder, and the last saved step stays for a resume.
    """
    spec_path = Path((argv if argv is not None else sys.argv[1:])[0])
    spec = read_json(spec_path)
    job_dir = spec_path.parent
    torch.set_num_threads(max(1, int(spec.get("threads") or 1)))
    ranks = [Rank(0, 1, 0, torch.device("cpu"))]
    try:
        with interrupt.stop_on_signals():
            ranks[0] = init_group(spec["device"], job_dir)
            _run_rank(spec, job_dir, ranks[0])
            close_group()
    except BaseException as exc:  # noqa: BLE001 - every failure becomes the one-line reason the parent reports
        record_failure(job_dir, ranks[0].rank, exc)
        return 1
    return 0


def _run_rank(spec: dict[str, Any], job_dir: Path, rank: Rank) -> None:
    """Distill this rank's part of the job in `spec`; rank 0 then writes the student and result.json."""
    loaded = load_artifact(spec["student"])
    teacher = load_artifact(spec["teacher"]).model
    data = spec["data"]
    ds = load_split(data["ref"], data["split"])
    rows = np.load(job_dir / "rows.npy")
    source = TrainSource(ds, data["split"], rows, data["image_column"], data["label_column"])
    batches = ShardBatches(
        source,
        loaded.processor,
        spec["shape"],
        spec["mapping"],
        batch=int(spec["batch"]),
        seed=int(spec["seed"]),
        augmentation=bool(spec["augment"]),
        rank=rank.rank,
        world=rank.world,
    )
    info = distill_ranked(
        loaded.model,
        teacher,
        batches,
        DistillConfig(**spec["config"]),
        rank,
        checkpoint_dir=Path(spec["checkpoint_dir"]),
        fingerprint=spec["fingerprint"],
        lead=Lead(report_progress, lambda: parent_alive(spec.get("watch"))),
    )
    if rank.rank == 0:
        weights = {k: v.detach().cpu().contiguous() for k, v in loaded.model.state_dict().items()}
        write_bytes_atomic(job_dir / "student.safetensors", save(weights))
        write_json_atomic(job_dir / "result.json", info)


# ---------------------------------------------------------------- the parent: the recover node's side


@dataclasses.dataclass(frozen=True)
class JobData:
    """What every rank loads besides the batches: the dataset, the run's label mapping, the student's attributes."""

    dataset_ref: str  # the dataset the training split is loaded from
    mapping: Mapping[str, Any]  # the run's label mapping (dataset_to_model)
    attrs: Mapping[str, Any] | None = None  # the student artifact's size attributes (pruned heads), so it rebuilds


@dataclasses.dataclass(frozen=True)
class JobFiles:
    """Where a job writes (spec, starting student, rank pids and errors, result) and saves resumable steps."""

    job_dir: Path  # the job's folder
    checkpoint_dir: Path  # where steps are saved and resumed from
    fingerprint: dict[str, Any]  # the resume key's facts, as for `distill`


@dataclasses.dataclass(frozen=True)
class JobLaunch:
    """How the job is started: ranks, launcher template, device and threads per rank."""

    procs: int  # ranks to start
    launcher: str = DEFAULT_LAUNCHER  # launcher template (`{procs}` is replaced); `-m MODULE SPEC` is appended
    device: str = "cpu"  # "cpu" (gloo) or "cuda" (NCCL, one GPU per local rank)
    threads: int = 1  # torch threads per rank


def distill_in_job(
    student: nn.Module,
    teacher_dir: Path,
    batches: TrainBatches,
    config: DistillConfig,
    *,
    data: JobData,
    files: JobFiles,
    launch: JobLaunch,
    progress: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Distill `student` in a torch.distributed job of `launch.procs` processes and load the result into it.

    The starting student is saved to `job_dir/start` (an artifact), the training rows to `job_dir/rows.npy` and
    the job to `job_dir/job.json`; the launcher runs `procs` ranks of `main`. Rank 0 saves resumable steps to
    `checkpoint_dir` as the single-process `distill` does, so a failed job leaves a state that either kind of
    run continues.

    Args:
        student: The starting student; receives the distilled weights.
        teacher_dir: The baseline's artifact folder.
        batches: What the single-process run would read (source, processor, shape, batch, seed, augmentation).
        config: The distillation config.
        data: The dataset, label mapping and student attributes every rank loads.
        files: The job's folder, the checkpoint folder and the resume fingerprint.
        launch: The ranks, launcher, device and threads.
        progress: Called with rank 0's progress items.

    Returns:
        distill's summary plus {"procs"}.

    Raises:
        DistributedJobError: The job failed or was killed (one line; the saved steps stay for a resume).
    """
    job_dir, checkpoint_dir, procs = files.job_dir, files.checkpoint_dir, launch.procs
    _stage(job_dir, student, batches, data.attrs)
    spec = {
        "student": str(job_dir / "start"),
        "teacher": str(teacher_dir),
        "data": _data_spec(batches, data.dataset_ref),
        "shape": batches.shape,
        "mapping": dict(data.mapping),
        "batch": batches.batch,
        "seed": batches.seed,
        "augment": batches.augmentation,
        "config": dataclasses.asdict(config),
        "fingerprint": files.fingerprint,
        "checkpoint_dir": str(checkpoint_dir),
        "device": launch.device,
        "threads": launch.threads,
        "watch": {"pid": os.getpid(), "host": socket.gethostname()},
    }
    write_json_atomic(job_dir / SPEC, spec)
    command = launcher_command(launch.launcher, procs, MODULE, [str(job_dir / SPEC)])
    what = f"distributed distillation ({procs} processes)"
    try:
        run_job(command, job_dir, progress=progress, what=what, should_stop=interrupt.stop_requested)
    except DistributedJobError as exc:
        saved = distill_state.peek(checkpoint_dir)
        kept = f"steps up to {int(saved['step']) + 1} of {saved['total']} are saved" if saved else "no step was saved"
        raise DistributedJobError(f"{exc}; {kept} in {checkpoint_dir}: resume continues from there") from None
    return _job_result(job_dir, student, what)


def _stage(job_dir: Path, student: nn.Module, batches: TrainBatches, attrs: Mapping[str, Any] | None) -> None:
    """Clear the job folder's old result and save the starting student and the training rows into it."""
    job_dir.mkdir(parents=True, exist_ok=True)
    for old in ("result.json", "student.safetensors"):
        (job_dir / old).unlink(missing_ok=True)
    save_artifact(student.cpu(), job_dir / "start", processor=batches.processor, attrs=attrs)
    np.save(job_dir / "rows.npy", np.asarray(batches.source.rows, dtype=np.int64))


def _data_spec(batches: TrainBatches, dataset_ref: str) -> dict[str, Any]:
    """Return where every rank loads the training split from."""
    return {
        "ref": dataset_ref,
        "split": batches.source.split,
        "image_column": batches.source.image_column,
        "label_column": batches.source.label_column,
    }


def _job_result(job_dir: Path, student: nn.Module, what: str) -> dict[str, Any]:
    """Load rank 0's distilled weights into `student` and return its summary (raises when the job wrote none)."""
    if not (job_dir / "result.json").is_file():
        raise DistributedJobError(f"{what} ended without writing {job_dir / 'result.json'}")
    student.load_state_dict(load_file(str(job_dir / "student.safetensors")))
    return dict(read_json(job_dir / "result.json"))


if __name__ == "__main__":
    sys.exit(main())
