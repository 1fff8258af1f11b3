"""Time to result: the whole pipeline on full-size ViT-B/16 and ResNet-50, CPU-seconds per step and in total.

Random-weight models (transformers' default ViTConfig and ResNetConfig: ViT-B/16 and ResNet-50, 1,000 classes,
224x224) and a generated 224x224 image dataset with a `train` split (recovery trains on it) are written to
`--work`; then `profiling-agent run --subset 256 --test-subset 256 --iterations 2` (defaults otherwise, the
deterministic planner) runs in this process, and every graph step's process CPU time (all threads, plus child
processes) and wall time are printed as the step finishes, then a table per model (each step's CPU-s beside the
previous recorded run of the same settings on the same kind of machine, the CPU model name) and one line per model:
CPU-minutes, wall minutes, the delivered form and its speed-up. The machine may be shared: CPU-seconds are what
count; the load average is printed beside them. Runs are recorded in `--record` (default: WORK/record.json), keyed
by machine kind and settings.

    .venv/bin/python bench/time_to_result.py                      # both models (tens of CPU-minutes)
    .venv/bin/python bench/time_to_result.py --models vit --iterations 1
    .venv/bin/python bench/time_to_result.py --models resnet -- --recover none   # extra `run` flags after --
    .venv/bin/python bench/time_to_result.py --models vit -- --time-budget 5     # a run bounded to 5 minutes
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

MODELS = {"vit": "ViT-B/16", "resnet": "ResNet-50"}
LABELS = 10  # dataset classes: LABEL_0..LABEL_9, the first ten of the model's 1,000


def _cpu() -> float:
    """Process CPU seconds, all threads, plus finished child processes (a distributed recovery job)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def machine_kind() -> str:
    """Return the CPU model name (/proc/cpuinfo, else platform) and the core count: runs compare on one kind."""
    import platform

    name = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{name} x{os.cpu_count()}"


def settings_key(args: argparse.Namespace, kind: str) -> str:
    """Return the key one model's runs are recorded under: the model, the bench's settings and the run flags."""
    parts = [kind, "tiny" if args.tiny else "full", f"subset {args.subset}", f"iterations {args.iterations}"]
    return " ".join(parts + list(args.extra))


def load_record(path: Path) -> dict[str, Any]:
    """Return the recorded runs ({machine kind: {settings key: run}}), {} when there are none or the file is bad."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def step_cpu(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Return CPU-s per "step round" of one run's rows."""
    out: dict[str, float] = {}
    for r in rows:
        key = f"{r['step']} {r['round']}"
        out[key] = out.get(key, 0.0) + float(r["cpu_s"])
    return out


def delivered_line(run_dir: Path) -> str:
    """Return what a finished run delivered and its speed-ups, read from its result.json.

    The speed-ups are the run's final side-by-side timing (result.json `delivery`): the delivered form against the
    original torch model and against quantizing the unpruned model alone, each with its paired 95% interval, and
    whether that timing was flagged as contended. (`best.quant_speedup` is another figure: what quantization added
    to the pruned model.)
    """
    try:
        result = json.loads((run_dir / "result.json").read_text())
    except (OSError, ValueError):
        return "no result.json"
    best, delivery = result.get("best") or {}, result.get("delivery") or {}
    if not best:
        return "nothing delivered"
    cut = (result.get("time") or {}).get("cuts") or []
    line = f"delivered {best.get('delivered') or 'torch'} of round {best.get('iteration')}"
    for key, against in (
        ("vs_original_torch", "the original torch model"),
        ("vs_quantization_only", "quantization alone"),
    ):
        if delivery.get(key) is not None:
            ci = (delivery.get(f"{key}_ci") or {}).get("ci")
            line += f", {float(delivery[key]):.2f}x {against}"
            line += f" (95% interval {float(ci[0]):.2f}-{float(ci[1]):.2f})" if ci else ""
    line += "; timings flagged" if delivery.get("timings_flagged") else ""
    return line + (f"; time budget cut: {'; '.join(cut)}" if cut else "")


def print_model(label: str, rows: list[dict[str, Any]], before: dict[str, Any] | None, delivered: str) -> None:
    """Print one model's steps beside the previous recorded run, then its line: CPU-min, wall-min, delivered."""
    then = step_cpu(before.get("steps", [])) if before else {}
    when = f"then ({before.get('date', '?')})" if before else "then (no record)"
    print(f"\n{label}  step                  round      CPU-s     wall-s   {when}")
    for r in rows:
        old = then.get(f"{r['step']} {r['round']}")
        was = f"{old:9.1f}" if old is not None else f"{'-':>9}"
        print(f"{'':<{len(label)}}  {r['step']:<20}  {r['round']:>5}  {r['cpu_s']:9.1f}  {r['wall_s']:9.1f}  {was}")
    total, wall = sum(r["cpu_s"] for r in rows), sum(r["wall_s"] for r in rows)
    old_total = f" (then {before['total_cpu_s'] / 60:.1f})" if before else ""
    print(f"{label}  total: {total:.1f} CPU-s ({total / 60:.1f} CPU-min), {wall:.1f} s wall")
    print(f"{label}: {total / 60:.1f} CPU-minutes{old_total}, {wall / 60:.1f} wall minutes; {delivered}", flush=True)


def build_model(kind: str, out: Path, tiny: bool = False) -> Path:
    """Save a random-weight ViT-B/16 or ResNet-50 (default configs; `tiny`: 2-layer ones) with a 224 processor."""
    import torch
    from transformers import (
        ResNetConfig,
        ResNetForImageClassification,
        ViTConfig,
        ViTForImageClassification,
        ViTImageProcessor,
    )

    folder = out / f"{kind}-{'tiny' if tiny else 'random'}"
    if (folder / "config.json").exists():
        return folder
    torch.manual_seed(0)
    small = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128}
    res = {"hidden_sizes": [32, 64], "depths": [1, 1], "embedding_size": 16}
    if kind == "vit":
        model = ViTForImageClassification(ViTConfig(num_labels=1000, **(small if tiny else {})))
    else:
        model = ResNetForImageClassification(ResNetConfig(num_labels=1000, **(res if tiny else {})))
    model.save_pretrained(folder)
    ViTImageProcessor(size={"height": 224, "width": 224}).save_pretrained(folder)
    return folder


def build_dataset(out: Path, test_images: int, train_images: int) -> Path:
    """Save a DatasetDict of seeded 224x224 RGB images (smooth noise) with `train` and `test` splits."""
    import numpy as np
    from datasets import ClassLabel, Dataset, DatasetDict, Features, Image

    folder = out / "images224"
    if (folder / "dataset_dict.json").exists():
        return folder
    rng = np.random.default_rng(0)
    features = Features({"image": Image(), "label": ClassLabel(names=[f"LABEL_{i}" for i in range(LABELS)])})

    def split(n: int) -> Dataset:
        labels = rng.integers(0, LABELS, n)
        images = []
        for label in labels:
            coarse = rng.integers(0, 256, (14, 14, 3), dtype=np.uint8) // 2 + np.uint8(12 * label)
            images.append(np.kron(coarse, np.ones((16, 16, 1), dtype=np.uint8)))
        return Dataset.from_dict({"image": images, "label": labels.tolist()}, features=features)

    DatasetDict({"test": split(test_images), "train": split(train_images)}).save_to_disk(str(folder))
    return folder


def run_pipeline(model: Path, dataset: Path, run_dir: Path, thread: str, args: argparse.Namespace) -> list[dict]:
    """Run the graph in this process; return one row per finished step: node, iteration, CPU-s, wall-s."""
    from profiling_agent.graph.builder import build_graph
    from profiling_agent.graph.checkpoint import open_checkpointer
    from profiling_agent.graph.cli.args import build_parser, context_from_args, input_from_args
    from profiling_agent.state import Context
    from profiling_agent.tools import interrupt

    argv = [
        "run",
        *("--model", str(model), "--dataset", str(dataset)),
        *("--subset", str(args.subset), "--test-subset", str(args.test_subset)),
        *("--iterations", str(args.iterations), "--planner", "deterministic"),
        *("--run-dir", str(run_dir), "--thread-id", thread),
        *args.extra,
    ]
    parsed = build_parser().parse_args(argv)
    payload, ctx = input_from_args(parsed), context_from_args(parsed)
    fields = set(Context.__dataclass_fields__)
    context = Context(**{k: v for k, v in ctx.items() if k in fields})
    rows: list[dict[str, Any]] = []
    saver = open_checkpointer(run_dir)
    graph = build_graph(checkpointer=saver)
    config = {"configurable": {"thread_id": thread}}
    with interrupt.fault_log(run_dir / thread) as fault:  # a native crash leaves every thread's stack there
        print(f"  (a native crash writes its stack to {fault})", flush=True)
        rows += stream_steps(graph.stream(payload, config, context=context, stream_mode="updates", durability="sync"))
    return rows


def stream_steps(chunks: Iterator[Any]) -> list[dict[str, Any]]:
    """Print and return one row per finished step of a graph stream: node, iteration, CPU-s, wall-s, load."""
    rows: list[dict[str, Any]] = []
    cpu, wall, iteration = _cpu(), time.perf_counter(), 0
    for chunk in chunks:
        now_cpu, now_wall = _cpu(), time.perf_counter()
        for node, values in chunk.items():
            if isinstance(values, dict) and values.get("iteration"):
                iteration = int(values["iteration"])
            row = {"step": node, "round": iteration, "cpu_s": now_cpu - cpu, "wall_s": now_wall - wall}
            rows.append(row)
            print(
                f"  {node:<20} round {iteration}  {row['cpu_s']:8.1f} CPU-s  {row['wall_s']:8.1f} s wall  "
                f"load {os.getloadavg()[0]:.1f}",
                flush=True,
            )
        cpu, wall = now_cpu, now_wall
    return rows


def main(argv: list[str] | None = None) -> int:
    """Build the assets, run each model, print the per-step and total CPU-seconds."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="vit,resnet", help="comma list of: vit (ViT-B/16), resnet (ResNet-50)")
    parser.add_argument("--subset", type=int, default=256)
    parser.add_argument("--test-subset", type=int, default=256)
    parser.add_argument("--iterations", type=int, default=2)
    parser.add_argument("--work", default="/tmp/profiling-agent-bench/time_to_result", help="assets, runs, JSON")
    parser.add_argument("--record", default="", help="JSON of earlier runs by machine kind (default WORK/record.json)")
    parser.add_argument("--tiny", action="store_true", help="smoke test: 2-layer models of the same families")
    parser.add_argument("extra", nargs="*", help="extra `profiling-agent run` flags, after --")
    args = parser.parse_args(argv)
    if args.tiny:  # a smoke test: one round on a few images, short timing and distillation, no exported forms
        args.subset, args.test_subset, args.iterations = min(args.subset, 32), min(args.test_subset, 32), 1
        args.extra = ["--repeats", "2", "--recover-steps", "8", "--backend", "torch", "--no-plots", *args.extra]
    for key in ("OPENAI_API_KEY", "OPENAI_BASE_URL"):
        os.environ.pop(key, None)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    work = Path(args.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    dataset = build_dataset(work, args.subset + args.test_subset + 64 + 32, 256)
    summary: dict[str, Any] = {"settings": vars(args), "load_before": os.getloadavg(), "models": {}}
    summary["machine"] = machine_kind()
    runs = load_record(Path(args.record) if args.record else work / "record.json")
    machine: dict[str, Any] = runs.get(summary["machine"]) or {}
    for kind in args.models.split(","):
        model = build_model(kind, work, args.tiny)
        label = f"{MODELS[kind]} (tiny)" if args.tiny else MODELS[kind]
        thread = f"{kind}-{time.strftime('%Y%m%d-%H%M%S')}"
        print(f"{label}: run {thread} (load {os.getloadavg()[0]:.1f})", flush=True)
        rows = run_pipeline(model, dataset, work / "runs", thread, args)
        total = sum(r["cpu_s"] for r in rows)
        run = {"thread": thread, "steps": rows, "total_cpu_s": total, "date": time.strftime("%Y-%m-%d %H:%M")}
        summary["models"][kind] = run
        key = settings_key(args, kind)
        print_model(label, rows, machine.get(key), delivered_line(work / "runs" / thread))
        machine[key] = run
    record = Path(args.record) if args.record else work / "record.json"
    runs[summary["machine"]] = machine
    record.write_text(json.dumps(runs, indent=1))
    summary["load_after"] = os.getloadavg()
    (work / "time_to_result.json").write_text(json.dumps(summary, indent=1))
    print(
        f"load average before {summary['load_before']}, after {summary['load_after']}; {work / 'time_to_result.json'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
