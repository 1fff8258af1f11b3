"""Accuracy passes split across torch.distributed ranks: each predicts whole batches of its shard, rank 0 gathers.

Shards are runs of whole batches (`batch_shard`), so every image is predicted in the very batch, and with the
very model and thread count, that a single process would use: the gathered predictions, and with them accuracy,
agreement and the paired bootstrap intervals, equal the single process's exactly. Latency is never measured here.
Run as `python -m profiling_agent.tools.evaluation.sharded SPEC` under a launcher (see `sharded_predictions`).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file
from torch import nn

from profiling_agent.tools.data.stream import ImageStream, open_run_data
from profiling_agent.tools.evaluation.bootstrap import correct, paired_delta_ci
from profiling_agent.tools.evaluation.metrics import accuracy_batch, agreement, predict_many, top1
from profiling_agent.tools.io import read_json, write_json_atomic
from profiling_agent.tools.models.artifact_load import load_run_form
from profiling_agent.tools.recovery.distributed_launch import (
    DEFAULT_LAUNCHER,
    DistributedJobError,
    close_group,
    init_group,
    launcher_command,
    record_failure,
    run_job,
)

if TYPE_CHECKING:  # a type only: the ranks run this module, and state's schemas cost each ~1 CPU-s
    from profiling_agent.tools.evaluation.records import MeasureSettings

MODULE = "profiling_agent.tools.evaluation.sharded"


def batch_shard(n: int, batch_size: int, rank: int, world: int) -> tuple[int, int]:
    """Return [start, stop) of rank's images: a contiguous run of whole batches (the last batch may be short)."""
    batches = -(-n // batch_size)
    first, last = rank * batches // world, (rank + 1) * batches // world
    return min(n, first * batch_size), min(n, last * batch_size)


def shard_of(pixels: Any, start: int, stop: int) -> Any:
    """Return images [start, stop) of a pixel tensor (a view) or an ImageStream (a stream of those rows, uncached).

    The shard's stream keeps no uint8 cache: the role's cache folder is keyed by its full row list.
    """
    if not isinstance(pixels, ImageStream):
        return pixels[start:stop]
    return pixels.between(start, stop)


def gather_predictions(local: Mapping[str, torch.Tensor], world: int) -> dict[str, torch.Tensor]:
    """Concatenate every rank's predictions in rank order (every rank gets the result)."""
    if world == 1:
        return {k: v.cpu() for k, v in local.items()}

    parts: list[Any] = [None] * world
    dist.all_gather_object(parts, {k: v.cpu() for k, v in local.items()})
    return {name: torch.cat([p[name] for p in parts]) for name in local}


def predict_sharded(
    models: Mapping[str, nn.Module],
    pixels: Any,
    rank: int,
    world: int,
    *,
    batch_size: int = 64,
    device: str = "cpu",
    allowed_ids: Sequence[int] | None = None,
) -> dict[str, torch.Tensor]:
    """Predict this rank's shard with every model and return all ranks' predictions, in image order.

    Args:
        models: Name -> classifier.
        pixels: All images (a tensor or an ImageStream); each rank reads only its shard.
        rank: This process's rank.
        world: Processes in the job (1: the single-process pass).
        batch_size: Images per forward pass, as the single process uses.
        device: Where the models run.
        allowed_ids: Model label ids the argmax may choose from.
    """
    start, stop = batch_shard(len(pixels), batch_size, rank, world)
    part = shard_of(pixels, start, stop)
    if stop > start:
        local = predict_many(models, part, batch_size=batch_size, device=device, allowed_ids=allowed_ids)
    else:
        local = {name: torch.empty(0, dtype=torch.long) for name in models}
    return gather_predictions(local, world)


def summarize(preds: Mapping[str, torch.Tensor], labels: torch.Tensor, reference: str, seed: int = 0) -> dict[str, Any]:
    """Return per model: top-1 %, agreement % with `reference`, and the paired bootstrap CI of its change."""
    base = preds.get(reference)
    out: dict[str, Any] = {}
    for name, p in preds.items():
        row: dict[str, Any] = {"accuracy": top1(p, labels)}
        if base is not None:
            row["agreement"] = agreement(p, base)
            row["delta_ci"] = list(paired_delta_ci(correct(p, labels), correct(base, labels), seed=seed))
        out[name] = row
    return out


def main(argv: list[str] | None = None) -> int:
    """Run one rank of a sharded pass over a run's role (spec file argv[0]); rank 0 writes the predictions."""
    spec_path = Path((argv if argv is not None else sys.argv[1:])[0])
    spec, job_dir, rank = read_json(spec_path), spec_path.parent, 0
    threads = max(1, int(spec.get("threads") or 1))
    torch.set_num_threads(threads)
    try:
        where = init_group(spec["device"], job_dir)
        rank = where.rank
        part = spec["part"]
        data = open_run_data(spec["run"], parts=(part,), materialize=())
        models = {name: load_run_form(path, threads) for name, path in spec["models"].items()}
        began, cpu0 = time.perf_counter(), time.process_time()
        preds = predict_sharded(
            models,
            data[f"{part}_pixels"],
            where.rank,
            where.world,
            batch_size=int(spec["batch"]),
            device=str(where.device),
            allowed_ids=spec.get("allowed_ids"),
        )
        if rank == 0:
            save_file({k: v.contiguous() for k, v in preds.items()}, str(job_dir / "predictions.safetensors"))
            result = {
                "procs": where.world,
                "images": len(preds[next(iter(preds))]),
                "seconds": round(time.perf_counter() - began, 4),  # the pass and the gather, models and data open
                "cpu_seconds": round(time.process_time() - cpu0, 3),
            }
            write_json_atomic(job_dir / "result.json", result)
        close_group()
    except BaseException as exc:  # noqa: BLE001 - the parent reports this rank's one-line reason
        record_failure(job_dir, rank, exc)
        return 1
    return 0


@dataclass(frozen=True)
class ShardedJob:
    """How a sharded accuracy pass runs.

    Attributes:
        procs: Processes the pass is split over.
        job_dir: The job's folder (its spec, the ranks' logs and the gathered predictions).
        batch_size: Images per forward pass, as the single process uses.
        launcher: Command starting the job ({procs}).
        device: Where the models run.
        threads: Threads of every rank.
        allowed_ids: Model label ids the argmax may choose from.
        progress: Called with the job's progress records.
    """

    procs: int
    job_dir: Path
    batch_size: int = 64
    launcher: str = DEFAULT_LAUNCHER
    device: str = "cpu"
    threads: int = 1
    allowed_ids: Sequence[int] | None = None
    progress: Callable[[dict[str, Any]], None] | None = None


def sharded_predictions(run: Path, part: str, models: Mapping[str, Path], job: ShardedJob) -> dict[str, torch.Tensor]:
    """Predict a run's role ("eval", "test", "calib") with saved models on `job.procs` processes.

    Returns:
        Model name -> its predictions, in image order.

    Raises:
        DistributedJobError: The job failed (one line).
    """
    job_dir = job.job_dir
    job_dir.mkdir(parents=True, exist_ok=True)
    (job_dir / "predictions.safetensors").unlink(missing_ok=True)
    spec = {
        "run": str(run),
        "part": part,
        "models": {k: str(v) for k, v in models.items()},
        "batch": job.batch_size,
        "device": job.device,
        "threads": job.threads,
        "allowed_ids": list(job.allowed_ids) if job.allowed_ids is not None else None,
    }
    write_json_atomic(job_dir / "job.json", spec)
    command = launcher_command(job.launcher, job.procs, MODULE, [str(job_dir / "job.json")])
    run_job(command, job_dir, progress=job.progress, what=f"sharded accuracy pass ({job.procs} processes)")
    if not (job_dir / "predictions.safetensors").is_file():
        raise DistributedJobError(f"the sharded pass ended without writing {job_dir / 'predictions.safetensors'}")
    saved = load_file(str(job_dir / "predictions.safetensors"))
    return {name: saved[name].clone() for name in models}  # owned, not views of a file the next pass replaces


def run_pass(
    run: Path, part: str, models: Mapping[str, Path], settings: MeasureSettings, *, job_dir: Path
) -> dict[str, torch.Tensor]:
    """Split a run's accuracy pass as the run's settings say (`sharded_predictions` with them).

    `settings.procs` processes started by `settings.launcher`, predicting in the batches one process uses
    (`accuracy_batch(settings.eval_batch, settings.device)`).
    """
    job = ShardedJob(
        procs=settings.procs,
        job_dir=job_dir,
        batch_size=accuracy_batch(settings.eval_batch, settings.device),
        launcher=settings.launcher,
        device=settings.device,
        threads=settings.threads,
        allowed_ids=settings.allowed_ids,
    )
    return sharded_predictions(run, part, models, job)


if __name__ == "__main__":
    sys.exit(main())
