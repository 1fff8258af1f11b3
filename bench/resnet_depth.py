"""What depth could buy on a bottleneck ResNet: blocks removed or replaced by their shortcut, timed and distilled.

A ResNet block whose shortcut is the identity (a stage's later blocks) can be removed. A stage's first block changes
width or stride, so it cannot simply go; it is replaced by its own projection shortcut (the 1x1 convolution and norm
it already has, then the block's activation: `tools/models/shortcut.py`, the engine's surgery). This script measures
every combination outside the engine's planner, on the zoo ResNet (bench/zoo.py): each variant's ONNX Runtime forms
timed beside the unpruned model's in one `measure_latency` call (interleaved, 1 thread, batch 1 and batch 16), then
each variant distilled from the unpruned model on training images the zoo never used (bench/recovery.py's split)
and its accuracy measured on held-out test images. Nothing is selected: every variant is reported.

    .venv/bin/python bench/resnet_depth.py                   # zoo ResNet, 300 distillation steps, 2,000 test images
    .venv/bin/python bench/resnet_depth.py --steps 100 --held-out 1000 --json out.json
    .venv/bin/python bench/resnet_depth.py --steps 2000 --train 10000 --only 'stages 1, 2'   # more data, one variant
    .venv/bin/python bench/resnet_depth.py --steps 3000 --trial-steps 200 --only stages 'every stage'   # trial KL too
    .venv/bin/python bench/resnet_depth.py --tiny            # smoke test: the tiny zoo's ResNet, one variant, 2 steps
"""

from __future__ import annotations

import argparse
import copy
import itertools
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))

import recovery as rec  # noqa: E402
import zoo as zoo_lib  # noqa: E402

FORMS = ("ort_fp32", "ort_dynamic")


def variant(base: nn.Module, removed: list[str], replaced: list[int]) -> nn.Module:
    """Copy `base` without the identity blocks `removed` and with stage `replaced`'s first blocks as shortcuts."""
    from profiling_agent.tools.compression.families import adapter_for
    from profiling_agent.tools.models.shortcut import replace_with_shortcut

    model = copy.deepcopy(base)
    if removed:
        adapter_for(model).drop_blocks(model, removed)
    replace_with_shortcut(model, [f"resnet.encoder.stages.{s}.layers.0" for s in replaced])  # the engine's surgery
    return model.eval()


def variants_of(base: nn.Module) -> dict[str, nn.Module]:
    """The unpruned model, every identity block removed, and each projection block replaced on top."""
    stages: Any = base.resnet.encoder.stages  # type: ignore[union-attr]
    identity = [
        f"resnet.encoder.stages.{s}.layers.{b}"
        for s, stage in enumerate(stages)
        for b, block in enumerate(stage.layers)
        if b > 0 and isinstance(block.shortcut, nn.Identity)
    ]
    projected = [s for s, stage in enumerate(stages) if not isinstance(stage.layers[0].shortcut, nn.Identity)]
    out = {"unpruned": base}
    if identity:
        out["identity blocks removed"] = variant(base, identity, [])
    for s in projected:
        out[f"stage {s} first block -> shortcut"] = variant(base, [], [s])
        if identity:
            out[f"identity removed + stage {s} first -> shortcut"] = variant(base, identity, [s])
    if len(projected) > 2 and identity:
        for pair in itertools.combinations(projected, 2):
            out[f"identity removed + stages {pair[0]}, {pair[1]} first -> shortcut"] = variant(
                base, identity, list(pair)
            )
    if len(projected) > 2:
        out["every stage first -> shortcut"] = variant(base, [], projected)
    if len(projected) > 1 and identity:
        out["identity removed + every stage first -> shortcut"] = variant(base, identity, projected)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--zoo", default=None, help="zoo folder (default: $PROFILING_AGENT_CACHE/zoo)")
    parser.add_argument("--steps", type=int, default=300, help="distillation steps per variant (batch 64)")
    parser.add_argument("--lr", type=float, default=1e-3, help="peak distillation learning rate")
    parser.add_argument("--batch", type=int, default=64, help="images per distillation step")
    parser.add_argument("--held-out", type=int, default=2000, help="held-out test images")
    parser.add_argument("--train", type=int, default=2000, help="training images distillation draws from")
    parser.add_argument("--only", nargs="*", default=None, help="variants whose names contain one of these")
    parser.add_argument(
        "--trial-steps",
        type=int,
        default=0,
        help="also distil a copy this many steps and report its mean KL from the unpruned model on 64 "
        "calibration images (the engine's block trials, 200 steps; 0: skip)",
    )
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--json", default=None, help="also write the rows here")
    parser.add_argument("--tiny", action="store_true", help="smoke test: the tiny zoo's ResNet, the first variant")
    args = parser.parse_args(argv)
    if args.tiny:
        zoo_lib.use_tiny()
        args.steps, args.batch, args.held_out, args.train, args.repeats, args.trial_steps = 2, 8, 64, 64, 2, 1
        zoo_lib.build_zoo(Path(args.zoo) if args.zoo else None, ("resnet",))
    from transformers import AutoModelForImageClassification

    from profiling_agent.tools.evaluation.latency import BUSY_FACTOR, measure_latency
    from profiling_agent.tools.evaluation.metrics import mean_kl
    from profiling_agent.tools.recovery.distill import DistillConfig, distill
    from profiling_agent.tools.runtimes.forms import build_forms

    torch.set_num_threads(1)
    zoo = Path(args.zoo) if args.zoo else zoo_lib.default_out()
    if not (zoo / "zoo.json").exists():
        print(f"no zoo at {zoo}: build it with `.venv/bin/python bench/zoo.py resnet`", file=sys.stderr)
        return 2
    path = json.loads((zoo / "zoo.json").read_text())["models"]["resnet"]["path"]
    base = AutoModelForImageClassification.from_pretrained(path).eval()
    data = rec.zoo_data(held_out=args.held_out, calib=64, train=args.train)
    models = variants_of(base)
    if args.only:
        models = {k: m for k, m in models.items() if k == "unpruned" or any(o in k for o in args.only)}
    elif args.tiny:  # the unpruned model and one variant
        models = dict(list(models.items())[:2])
    timed: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="resnet-depth-") as scratch:
        for i, (name, model) in enumerate(models.items()):
            for form in build_forms(
                model, data["calib_x"][:32], data["calib_x"][:8], Path(scratch) / str(i), forms=FORMS, threads=1
            ):
                if form.status == "ok":
                    timed[f"{form.name}@{name}"] = form.model
        lat = measure_latency(timed, data["test_x"][:64], batch_size=16, warmup=3, repeats=args.repeats)
    batches = rec.distill_batches(data, args.batch)
    rows = []
    base_acc = rec.accuracy(base, data["test_x"], data["test_y"])
    for name, model in models.items():
        row: dict[str, Any] = {"variant": name, "params": sum(p.numel() for p in model.parameters())}
        row["before"] = rec.accuracy(model, data["test_x"], data["test_y"])
        if model is not base and args.trial_steps:  # what round 1's block trials score a set by
            trial = copy.deepcopy(model)
            distill(trial, base, batches, DistillConfig(steps=args.trial_steps, lr=args.lr))
            with torch.inference_mode():
                row["trial_kl"] = mean_kl(
                    base(pixel_values=data["calib_x"]).logits, trial.eval()(pixel_values=data["calib_x"]).logits
                )
        if model is not base:
            distill(model, base, batches, DistillConfig(steps=args.steps, lr=args.lr))
        row["after"] = rec.accuracy(model, data["test_x"], data["test_y"])
        for form in FORMS:
            mine, unpruned = lat.get(f"{form}@{name}"), lat.get(f"{form}@unpruned")
            if mine and unpruned:
                row[f"{form}_b1"] = round(mine["latency_ms"] / unpruned["latency_ms"], 3)
                row[f"{form}_b16"] = round(mine["latency_batch_ms"] / unpruned["latency_batch_ms"], 3)
                row[f"{form}_wall_over_cpu"] = round(mine["wall_s"] / max(mine["cpu_s"], 1e-9), 2)
        rows.append(row)
    print(
        f"\nzoo ResNet, {args.held_out} held-out images, {args.steps} distillation steps (lr {args.lr:g}, batch "
        f"{args.batch}, {args.train:,} training images); latency over the unpruned "
        "model's same form (1 thread)"
    )
    print(
        "| variant | params | top-1 before | after distillation (vs unpruned) | "
        + " | ".join(f"{f} b1 / b16" for f in FORMS)
        + (f" | KL after {args.trial_steps} steps" if args.trial_steps else "")
        + " |"
    )
    print("|---|---|---|---|---|---|" + ("---|" if args.trial_steps else ""))
    for r in rows:
        cells = [f"{r.get(f + '_b1', float('nan')):.2f}x / {r.get(f + '_b16', float('nan')):.2f}x" for f in FORMS]
        trial = f" | {r['trial_kl']:.4f}" if "trial_kl" in r else (" | -" if args.trial_steps else "")
        print(
            f"| {r['variant']} | {r['params']:,} | {r['before']:.2f}% | {r['after']:.2f}% "
            f"({r['after'] - base_acc:+.2f} pp) | " + " | ".join(cells) + trial + " |"
        )
    busiest = max((v for r in rows for k, v in r.items() if k.endswith("_wall_over_cpu")), default=0.0)
    print(f"timed calls: wall time over process CPU time at most {busiest:.2f} (above {BUSY_FACTOR}: a busy machine)")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
