"""Accuracy recovery on the Fashion-MNIST zoo: the same plans with no recovery, reconstruction, and + distillation.

    python bench/recovery.py                    # all four zoo models (built first when missing)
    python bench/recovery.py vit resnet --quick # fewer held-out images and distillation steps
    python bench/recovery.py --zoo /tmp/zoo --json out.json
    python bench/recovery.py --tiny             # smoke test: the tiny zoo (bench/zoo.py --tiny), 5 steps

Every number is measured here: top-1 on held-out Fashion-MNIST test images (never used for calibration or
training), parameters, and batch-1 CPU latency of the pruned fp32 model against the baseline, side by side.
Calibration images (reconstruction) and distillation images are training images the zoo models were not
trained on. Prints a Markdown table; writes JSON when asked.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import zoo as zoo_lib  # noqa: E402

from profiling_agent.tools.compression.pruning import prune_model  # noqa: E402
from profiling_agent.tools.compression.self_check import self_check  # noqa: E402
from profiling_agent.tools.data.train_stream import augment, batch_rows  # noqa: E402
from profiling_agent.tools.models.sizes import count_params  # noqa: E402
from profiling_agent.tools.recovery.distill import DistillConfig, distill  # noqa: E402
from profiling_agent.tools.recovery.reconstruct import reconstruct  # noqa: E402
from profiling_agent.tools.runtimes.forward import median_forward_ms  # noqa: E402

STRUCTURED = {"layer": ".", "type": "structured"}
HEADS = {"layer": ".", "type": "head"}
# one uniform plan per family, aggressive enough to reach the targets (>= 40% / >= 30% fewer params)
PLANS = {
    "vit": [{**STRUCTURED, "ratio": 0.7}, {**HEADS, "ratio": 0.5}],
    "deit": [{**STRUCTURED, "ratio": 0.7}, {**HEADS, "ratio": 0.5}],
    "swin": [{**STRUCTURED, "ratio": 0.7}, {**HEADS, "ratio": 0.5}],
    "resnet": [{**STRUCTURED, "ratio": 0.6}],
}


def accuracy(model, x, y, batch: int = 500) -> float:
    """Top-1 accuracy (%) of `model` on images `x` with labels `y`."""
    model.eval()
    correct = 0
    with torch.inference_mode():
        for i in range(0, len(x), batch):
            correct += int((model(pixel_values=x[i : i + batch]).logits.argmax(-1) == y[i : i + batch]).sum())
    return 100.0 * correct / len(x)


def zoo_data(held_out: int, calib: int, train: int, seed: int = 0, model: str | None = None) -> dict[str, torch.Tensor]:
    """Held-out test images, and calibration and distillation images from training images the zoo never used.

    `model` names the zoo model whose processor prepares them (None: the 32x32 models').
    """
    proc = zoo_lib.processor(model)
    test_x, test_y = zoo_lib.load_fashion("test")
    train_x, train_y = zoo_lib.load_fashion("train")
    sizes = zoo_lib.scale()
    order = np.random.default_rng(seed).permutation(sizes.train_total)
    start = sizes.train_images + sizes.calibration  # zoo training images, then the agent's calibration images
    pick = np.random.default_rng(seed + 1).permutation(len(test_x))[:held_out]
    calib_idx, train_idx = order[start : start + calib], order[start + calib : start + calib + train]
    return {
        "test_x": zoo_lib.pixels(test_x[pick], proc),
        "test_y": torch.from_numpy(test_y[pick]),
        "calib_x": zoo_lib.pixels(train_x[calib_idx], proc),
        "calib_y": torch.from_numpy(train_y[calib_idx]),
        "train_x": zoo_lib.pixels(train_x[train_idx], proc) if train else torch.empty(0),
        "train_y": torch.from_numpy(train_y[train_idx]),
    }


def distill_batches(data: dict[str, torch.Tensor], batch: int, seed: int = 0):
    """Return the distillation's batches(step): `batch` augmented training images of `zoo_data` and their labels."""
    rows = np.arange(len(data["train_x"]))

    def batches(step: int):
        idx = torch.as_tensor(batch_rows(rows, step, batch, seed))
        generator = torch.Generator().manual_seed(step)
        return augment(data["train_x"][idx], generator, False, (0.8, 1.0)), data["train_y"][idx]

    return batches


def _latency(model, image) -> float:
    return median_forward_ms(model, image, warmup=5, repeats=30)


def run_family(name: str, path: Path, data: dict[str, torch.Tensor], steps: int, lr: float) -> dict:
    from transformers import AutoModelForImageClassification

    baseline = AutoModelForImageClassification.from_pretrained(path).eval()
    base_acc = accuracy(baseline, data["test_x"], data["test_y"])
    pruned = copy.deepcopy(baseline)
    report = prune_model(pruned, PLANS[name], data["calib_x"][:1])
    row = {"model": name, "plan": PLANS[name], "baseline": base_acc, "params_before": report.params_before}
    row["params_after"] = count_params(pruned)
    row["none"] = accuracy(pruned, data["test_x"], data["test_y"])
    tick = time.perf_counter()
    reconstruct(baseline, pruned, data["calib_x"], report.applied)
    row["reconstruct_seconds"] = round(time.perf_counter() - tick, 2)
    self_check(pruned, data["calib_x"][:2], int(pruned.config.num_labels))
    row["reconstruct"] = accuracy(pruned, data["test_x"], data["test_y"])
    tick = time.perf_counter()
    distill(pruned, baseline, distill_batches(data, 64), DistillConfig(steps=steps, lr=lr))
    row["distill_seconds"] = round(time.perf_counter() - tick, 2)
    self_check(pruned, data["calib_x"][:2], int(pruned.config.num_labels))
    row["distill"] = accuracy(pruned, data["test_x"], data["test_y"])
    image = data["test_x"][:1]
    b_ms, p_ms = [], []
    for _ in range(3):  # interleaved, so both see the same machine load
        b_ms.append(_latency(baseline, image))
        p_ms.append(_latency(pruned, image))
    row["speedup_b1"] = round(float(np.median(b_ms)) / float(np.median(p_ms)), 2)
    return row


def table(rows: list[dict]) -> str:
    lines = [
        "| model | params (reduction) | baseline top-1 | no recovery | reconstruct | reconstruct + distill | "
        "won back by reconstruct | b1 speed-up | reconstruct s | distill s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lost = r["baseline"] - r["none"]
        won = (r["reconstruct"] - r["none"]) / lost if lost > 0 else float("nan")
        red = 1 - r["params_after"] / r["params_before"]
        lines.append(
            f"| {r['model']} | {r['params_after']:,} (-{red:.0%}) | {r['baseline']:.2f} | {r['none']:.2f} | "
            f"{r['reconstruct']:.2f} | {r['distill']:.2f} | {won:.0%} | {r['speedup_b1']:.2f}x | "
            f"{r['reconstruct_seconds']:.1f} | {r['distill_seconds']:.1f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/recovery.py", description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help=f"zoo models (default: {' '.join(zoo_lib.FAMILIES)})")
    parser.add_argument("--zoo", default=None, help="zoo folder (default: $PROFILING_AGENT_CACHE/zoo)")
    parser.add_argument("--quick", action="store_true", help="1000 held-out images, 150 distillation steps")
    parser.add_argument("--tiny", action="store_true", help="smoke test: the tiny zoo, 100 held-out images, 5 steps")
    parser.add_argument("--steps", type=int, default=None, help="distillation steps (default 400; --quick 150)")
    parser.add_argument("--lr", type=float, default=1e-3, help="peak distillation learning rate")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", default=None, help="write the rows here")
    args = parser.parse_args(argv)
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    if args.tiny:
        zoo_lib.use_tiny()
    torch.set_num_threads(args.threads)
    names = tuple(args.names) or zoo_lib.FAMILIES
    out = Path(args.zoo) if args.zoo else zoo_lib.default_out()
    zoo = zoo_lib.build_zoo(out, names, threads=args.threads)
    steps = args.steps or (5 if args.tiny else 150 if args.quick else 400)
    data = zoo_data(100, 32, 256) if args.tiny else zoo_data(1000 if args.quick else 3000, 256, 8192)
    calib = len(data["calib_y"])
    rows = []
    for name in names:
        row = run_family(name, Path(zoo["models"][name]["path"]), data, steps, args.lr)
        print(json.dumps(row), file=sys.stderr, flush=True)
        rows.append(row)
    print(f"held-out images: {len(data['test_y'])}; calibration: {calib}; distillation: {steps} steps of 64 images\n")
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
