"""Benchmark: distillation and accuracy passes on 2 torch.distributed processes against 1, side by side.

Usage:
    python bench/distributed.py                       # zoo ResNet (bench/zoo.py builds it), 2 x 1 thread vs 1 x 1
    python bench/distributed.py --steps 40 --repeats 1  # quicker
    python bench/distributed.py --model vit --procs 2 --threads 1 --out /tmp/dist.json
    python bench/distributed.py --tiny                # smoke test: the tiny zoo's ResNet (built when missing), 4 steps,
                                                      # the students' accuracy read from the compared passes, the
                                                      # 1-process jobs started without torchrun

Both sides run through the same launcher (`torchrun --standalone`, 1 process or N), so process start, model loading
and the rendezvous cost the same; the figures are taken inside the job (the training loop's seconds; the
accuracy pass's seconds after the models and data are open), with the job's wall time and CPU time (all its
processes, from getrusage of the children) beside them. Runs alternate (1, N, 1, N, ...) and medians are reported.

1. Distillation: the zoo model is the teacher; the student is a copy with 40% of its conv channels pruned (50% of
   MLP channels for transformers). Training images: the zoo dataset's 2,000-image train split, augmented, global
   batch --batch (32, the run's default). Both runs read the same global batches; the students are compared
   weight by weight and on the 10,000 test images (predicted by a sharded pass).
2. Accuracy pass: the teacher and the pruned student over Fashion-MNIST's 10,000 test images (a run folder written
   as prepare_data writes it; calibration from the train split, so all 10,000 are validation images), batch 64,
   uncached streams (each pass decodes and preprocesses its images). Predictions must be identical.

Record the machine's load (printed) with the figures: on a busy machine the ratios mean little.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import resource
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import zoo as zoo_lib  # noqa: E402

from profiling_agent.tools import run_layout
from profiling_agent.tools.data.train_stream import TrainBatches, TrainSource
from profiling_agent.tools.evaluation.sharded import ShardedJob, sharded_predictions, summarize
from profiling_agent.tools.io import read_json
from profiling_agent.tools.recovery.distill import DistillConfig
from profiling_agent.tools.recovery.distributed import JobData, JobFiles, JobLaunch, distill_in_job

LAUNCHER = "torchrun --standalone --nproc-per-node {procs} --monitor-interval 0.2"


def launcher(procs: int, tiny: bool, template: str = LAUNCHER) -> str:
    """The launcher template of a job of `procs` processes: `template`, or (--tiny, 1 process) this interpreter.

    A smoke run's figures mean nothing, so its 1-process jobs skip torchrun's own interpreter: the rank runs alone
    (world size 1, no process group), the same job module and files.
    """
    return shlex.quote(sys.executable) if tiny and procs == 1 else template


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _children_cpu() -> float:
    use = resource.getrusage(resource.RUSAGE_CHILDREN)
    return use.ru_utime + use.ru_stime


def _timed(fn) -> tuple[Any, float, float]:
    wall, cpu = time.perf_counter(), _children_cpu()
    out = fn()
    return out, time.perf_counter() - wall, _children_cpu() - cpu


def _pruned(teacher: torch.nn.Module, family: str) -> torch.nn.Module:
    from profiling_agent.tools.compression.pruning import prune_model

    student = copy.deepcopy(teacher)
    entry = {"layer": "conv", "ratio": 0.4} if family == "resnet" else {"layer": "mlp", "ratio": 0.5}
    prune_model(student, [{**entry, "type": "structured"}], torch.zeros(1, 1, 32, 32))
    return student


def _make_run(root: Path, ref: str, teacher: torch.nn.Module, processor: Any, mapping: dict, shape: dict) -> None:
    """Write the rows and labels of all 10,000 test images as validation (prepare_data), and the baseline."""
    from profiling_agent.tools.data.prepare import SubsetSpec, load_prepared, prepare_images
    from profiling_agent.tools.data.sources import load_split
    from profiling_agent.tools.io import write_json_atomic
    from profiling_agent.tools.models.artifacts import save_artifact

    test, train = load_split(ref, "test"), load_split(ref, "train")
    prepare_images(
        test,
        processor,
        shape,
        mapping,
        out_path=root / "data.safetensors",
        calibration_ds=train,
        spec=SubsetSpec(subset=0, test_subset=0, calibration=16, seed=0),
    )
    rows = load_prepared(root / "data.safetensors", with_indices=True, parts=("eval", "test", "calib"))
    split = {"validation": "test", "test": "test", "calibration": "train"}
    parts = {"validation": "eval", "test": "test", "calibration": "calib"}
    roles = {r: {"split": split[r], "indices": rows[f"{p}_index"].tolist()} for r, p in parts.items()}
    write_json_atomic(root / run_layout.SUBSETS, {"dataset": ref, "seed": 0, **roles})
    save_artifact(teacher, root / run_layout.BASELINE, processor=processor)


def bench_distill(args, work: Path, teacher_dir: Path, start: torch.nn.Module, batches, mapping, ref) -> dict:
    config = DistillConfig(steps=args.steps, lr=args.lr, seed=0)
    runs: dict[int, list[dict[str, Any]]] = {1: [], args.procs: []}
    students: dict[int, torch.nn.Module] = {}
    for rep in range(args.repeats):
        for procs in (1, args.procs):
            student = copy.deepcopy(start)
            job = work / f"distill-{procs}-{rep}"
            info, wall, cpu = _timed(
                lambda student=student, procs=procs, job=job: distill_in_job(
                    student,
                    teacher_dir,
                    batches,
                    config,
                    data=JobData(ref, mapping),
                    files=JobFiles(job / "job", job / "steps", {}),
                    launch=JobLaunch(procs, launcher(procs, args.tiny, args.launcher), threads=args.threads),
                )
            )
            rate = info["steps_done"] / info["seconds"]
            runs[procs].append(
                {
                    "steps_per_s": rate,
                    "loop_s": info["seconds"],
                    "wall_s": wall,
                    "cpu_s": cpu,
                    "rank0_loop_cpu_s": info["cpu_seconds"],
                }
            )
            students[procs] = student
            print(
                f"  distill {procs} proc: {rate:.2f} steps/s, loop {info['seconds']:.1f} s (rank 0 CPU "
                f"{info['cpu_seconds']:.1f} s), job wall {wall:.1f} s, job CPU {cpu:.1f} s, load {_load()}",
                flush=True,
            )
    pairs = zip(students[1].state_dict().values(), students[args.procs].state_dict().values(), strict=True)
    gap = max((a.float() - b.float()).abs().max().item() for a, b in pairs)
    med = {p: statistics.median(r["steps_per_s"] for r in rs) for p, rs in runs.items()}
    cpu = {p: statistics.median(r["rank0_loop_cpu_s"] for r in rs) for p, rs in runs.items()}
    return {
        "runs": runs,
        "median_steps_per_s": med,
        "ratio": med[args.procs] / med[1],
        "max_weight_diff": gap,
        "cpu_ratio": cpu[1] / cpu[args.procs],
        "students": students,
    }


def bench_pass(args, work: Path, run: Path, models: dict[str, Path]) -> dict:
    from safetensors.torch import load_file  # noqa: F401 - sharded_predictions reads the job's file

    runs: dict[int, list[dict[str, Any]]] = {1: [], args.procs: []}
    preds: dict[int, dict[str, torch.Tensor]] = {}
    for rep in range(args.repeats):
        for procs in (1, args.procs):
            job = work / f"pass-{procs}-{rep}"
            out, wall, cpu = _timed(
                lambda procs=procs, job=job: sharded_predictions(
                    run,
                    "eval",
                    models,
                    ShardedJob(
                        procs=procs,
                        job_dir=job,
                        batch_size=64,
                        launcher=launcher(procs, args.tiny, args.launcher),
                        threads=args.threads,
                    ),
                )
            )
            info = read_json(job / "result.json")
            rate = info["images"] / info["seconds"]
            runs[procs].append(
                {
                    "images_per_s": rate,
                    "pass_s": info["seconds"],
                    "wall_s": wall,
                    "cpu_s": cpu,
                    "rank0_pass_cpu_s": info["cpu_seconds"],
                }
            )
            preds[procs] = out
            print(
                f"  pass {procs} proc: {rate:.0f} images/s ({len(models)} models), pass {info['seconds']:.1f} s "
                f"(rank 0 CPU {info['cpu_seconds']:.1f} s), job wall {wall:.1f} s, job CPU {cpu:.1f} s, "
                f"load {_load()}",
                flush=True,
            )
    same = all(torch.equal(preds[1][k], preds[args.procs][k]) for k in models)
    med = {p: statistics.median(r["images_per_s"] for r in rs) for p, rs in runs.items()}
    cpu = {p: statistics.median(r["rank0_pass_cpu_s"] for r in rs) for p, rs in runs.items()}
    return {
        "runs": runs,
        "median_images_per_s": med,
        "ratio": med[args.procs] / med[1],
        "identical": same,
        "cpu_ratio": cpu[1] / cpu[args.procs],
        "preds": preds,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--zoo", default=None, help="zoo folder (default: $PROFILING_AGENT_CACHE/zoo)")
    parser.add_argument("--model", default="resnet", help="zoo model (resnet, vit, deit, swin)")
    parser.add_argument("--procs", type=int, default=2)
    parser.add_argument(
        "--launcher", default=LAUNCHER, help="launcher template of the N-process jobs, {procs} for N (torchrun)"
    )
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process")
    parser.add_argument("--steps", type=int, default=60, help="distillation steps")
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--batch", type=int, default=32, help="global batch of a distillation step (the run's default)")
    parser.add_argument("--repeats", type=int, default=2, help="alternating runs of each side (medians)")
    parser.add_argument("--skip", choices=["distill", "pass"], default=None)
    parser.add_argument("--out", default=None, help="write the figures as JSON here")
    parser.add_argument("--tiny", action="store_true", help="smoke test: the tiny zoo, 4 steps of 8 images, 1 repeat")
    args = parser.parse_args(argv)
    if args.tiny:
        zoo_lib.use_tiny()
        args.steps, args.batch, args.repeats = 4, 8, 1
    from transformers import AutoImageProcessor, AutoModelForImageClassification

    from profiling_agent.tools.data.sources import load_split
    from profiling_agent.tools.models.artifacts import save_artifact

    zoo = Path(args.zoo) if args.zoo else zoo_lib.default_out()
    if args.tiny:
        zoo_lib.build_zoo(zoo, (args.model,))
    model_dir, ref = zoo / "models" / args.model, str(zoo / "fashion-mnist")
    if not (model_dir / "config.json").is_file():
        print(f"no zoo model at {model_dir}: build it with `python bench/zoo.py {args.model}`", file=sys.stderr)
        return 2
    teacher = AutoModelForImageClassification.from_pretrained(model_dir).eval()
    processor = AutoImageProcessor.from_pretrained(model_dir)
    shape = {"channels": 1, "height": 32, "width": 32}
    mapping = {"dataset_to_model": {str(i): i for i in range(10)}}
    start = _pruned(teacher, args.model)
    print(
        f"machine: {os.cpu_count()} CPUs, load {_load()}; torch {torch.__version__}; {args.model}: "
        f"{sum(p.numel() for p in teacher.parameters()):,} params, student "
        f"{sum(p.numel() for p in start.parameters()):,}",
        flush=True,
    )
    report: dict[str, Any] = {"model": args.model, "procs": args.procs, "threads": args.threads, "load_before": _load()}
    with tempfile.TemporaryDirectory(prefix="bench-dist-") as tmp:
        work = Path(tmp)
        save_artifact(teacher, work / "teacher", processor=processor)
        save_artifact(start, work / "pruned", processor=processor)
        run = work / "run"
        run.mkdir()
        _make_run(run, ref, teacher, processor, mapping, shape)
        labels = load_split(ref, "test")["label"]
        models = {"baseline": run / "baseline", "pruned": work / "pruned"}
        if args.skip != "distill":
            train = load_split(ref, "train")
            source = TrainSource(train, "train", np.arange(len(train)), "image", "label")
            batches = TrainBatches(source, processor, shape, mapping, batch=args.batch, seed=0)
            print(f"distillation: {args.steps} steps of {args.batch} images, lr {args.lr}", flush=True)
            dist = bench_distill(args, work, work / "teacher", start, batches, mapping, ref)
            for procs, student in dist.pop("students").items():
                save_artifact(student, work / f"student-{procs}", processor=processor)
                models[f"distilled_{procs}"] = work / f"student-{procs}"
            report["distill"] = dist
        if args.skip != "pass":
            print("accuracy pass: 10,000 test images, batch 64, uncached", flush=True)
            # --tiny: the distilled students ride along in the compared passes instead of a job of their own
            timed = tuple(models) if args.tiny else ("baseline", "pruned")
            passed = bench_pass(args, work, run, {k: models[k] for k in timed})
            preds = passed.pop("preds")[args.procs]
            report["pass"] = passed
            extra = {k: v for k, v in models.items() if k not in preds}
            if extra:  # the distilled students' accuracy, on the same images (one sharded pass)
                job = ShardedJob(
                    procs=args.procs,
                    job_dir=work / "acc",
                    launcher=launcher(args.procs, args.tiny, args.launcher),
                    threads=args.threads,
                )
                preds.update(sharded_predictions(run, "eval", extra, job))
            figures = summarize(preds, torch.as_tensor(labels), "baseline")
            report["accuracy"] = {k: round(v["accuracy"], 2) for k, v in figures.items()}
    report["load_after"] = _load()
    _print(report, args.procs)
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2, default=str))
    return 0


def _print(report: dict[str, Any], procs: int) -> None:
    print(
        f"\n== bench/distributed.py: {report['model']}, {procs} processes x {report['threads']} thread vs 1 x "
        f"{report['threads']}; load before {report['load_before']}, after {report['load_after']} =="
    )
    for key, what, rate, unit, fmt in (
        ("distill", "distillation steps/s", "median_steps_per_s", "loop", ".2f"),
        ("pass", "accuracy pass images/s", "median_images_per_s", "pass", ".0f"),
    ):
        if key in report:
            r, m = report[key], report[key][rate]
            extra = (
                f"max weight difference {r['max_weight_diff']:.3g}"
                if key == "distill"
                else f"identical predictions: {r['identical']}"
            )
            cpu = f"rank-0 {unit} CPU time 1 proc / {procs} procs {r['cpu_ratio']:.2f}x"
            print(
                f"{what}: 1 proc {m[1]:{fmt}}, {procs} procs {m[procs]:{fmt}}, ratio {r['ratio']:.2f}x "
                f"(target >= 1.6x); {extra}; {cpu}"
            )
    if "accuracy" in report:
        print("top-1 on the 10,000 test images: " + ", ".join(f"{k} {v:.2f}%" for k, v in report["accuracy"].items()))


if __name__ == "__main__":
    sys.exit(main())
