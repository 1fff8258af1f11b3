"""Streamed evaluation at scale: peak memory, run-folder size and time of preparation + one pass, 1k to 10k images.

    python bench/streaming.py                      # 1k, 5k, 10k images of a synthetic 224x224 imagefolder
    python bench/streaming.py --sizes 1000 2000    # other sizes
    python bench/streaming.py --old 1000           # also the float32 path the run used before (one size)
    python bench/streaming.py --parallel-images 1000   # one-pass / parallel accuracy passes of 3 models

The dataset is built offline with PIL (smooth generated 224x224 RGB JPEGs, 10 classes, an imagefolder) and cached
in --work. Every size runs in a fresh subprocess, which prints its own peak RSS (getrusage ru_maxrss): prepare_data
into a run folder (with the baseline artifact), then one accuracy pass of a small ViT (224x224, patch 16) over the
streamed validation images. The parent prints a table, the ratio of peak RSS at the largest size to the smallest
(target <= 1.5x), the run folder's largest file (target < 100 MB at 5k images) and the time of the largest pass
against (largest/smallest) x the smallest one.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

CLASSES = 10
SIZE = 224


def build_dataset(root: Path, n: int, seed: int = 0) -> Path:
    """Write n generated 224x224 JPEGs into root/class_k/ (kept when already complete)."""
    import numpy as np
    from PIL import Image, ImageDraw

    done = root / f".complete-{n}"
    if done.exists():
        return root
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:SIZE, 0:SIZE].astype(np.float32) / SIZE
    for i in range(n):
        label = i % CLASSES
        folder = root / f"class_{label}"
        folder.mkdir(parents=True, exist_ok=True)
        a, b, c = rng.uniform(0.5, 3.0, 3)
        base = np.stack([np.sin(a * 6 * xx + label), np.cos(b * 6 * yy - label), np.sin(c * 6 * (xx + yy))], -1)
        pixels = ((base * 0.5 + 0.5) * 255).astype(np.uint8)
        image = Image.fromarray(pixels, mode="RGB")
        draw = ImageDraw.Draw(image)
        x0, y0 = (int(v) for v in rng.integers(0, SIZE - 64, 2))
        draw.ellipse(
            [x0, y0, x0 + 40 + 2 * label, y0 + 40 + 2 * label], fill=tuple(int(v) for v in rng.integers(0, 256, 3))
        )
        image.save(folder / f"{i:06d}.jpg", quality=90)
    done.touch()
    return root


def small_model():
    """A small ViT at 224x224 (patch 16, hidden 64, 2 layers): preprocessing, not the model, should dominate."""
    import torch
    from transformers import ViTConfig, ViTForImageClassification

    torch.manual_seed(0)
    config = ViTConfig(
        image_size=SIZE, patch_size=16, num_channels=3, hidden_size=64, num_hidden_layers=2,
        num_attention_heads=4, intermediate_size=128, num_labels=CLASSES,
        id2label={i: f"class_{i}" for i in range(CLASSES)}, label2id={f"class_{i}": i for i in range(CLASSES)},
    )  # fmt: skip
    return ViTForImageClassification(config).eval()


def processor():
    from transformers.models.vit.image_processing_pil_vit import ViTImageProcessorPil

    return ViTImageProcessorPil(size={"height": SIZE, "width": SIZE})


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: kB


def child(args: argparse.Namespace) -> None:
    """Prepare N images into a run folder and run one accuracy pass; print one JSON line."""
    import torch

    from profiling_agent.tools.data.labels import map_labels
    from profiling_agent.tools.data.prepare import prepare_data
    from profiling_agent.tools.data.sources import load_split
    from profiling_agent.tools.data.stream import open_prepared
    from profiling_agent.tools.evaluation.metrics import predict, predict_many
    from profiling_agent.tools.models.artifacts import save_artifact

    torch.set_num_threads(args.threads)
    ds = load_split(str(args.data), None)
    model, proc = small_model(), processor()
    shape = {"channels": 3, "height": SIZE, "width": SIZE}
    names = ds.features["label"].names
    mapping = map_labels(names, model.config.id2label)
    run = Path(args.run)
    save_artifact(model, run / "baseline", processor=proc)
    rss_ready = _rss_mb()
    start = time.perf_counter()
    info = prepare_data(
        ds, proc, shape, mapping, out_path=run / "data.safetensors", subset=args.n, test_subset=0, calibration=16
    )
    prepare_s = time.perf_counter() - start
    data = open_prepared(info["path"], {"eval": ds, "calib": ds}, proc)
    with torch.inference_mode():  # warm the model up (first-call allocations) outside every timed pass
        model(pixel_values=data["calib_pixels"][:8])
    out: dict = {"n": info["n_eval"], "prepare_s": prepare_s, "rss_ready_mb": rss_ready}
    if args.mode == "stream":
        start = time.perf_counter()
        preds = predict(model, data["eval_pixels"], batch_size=64)
        out["pass_s"] = time.perf_counter() - start
    elif args.mode == "old":  # what prepare_data did before: every image as float32 in memory and on disk
        from safetensors.torch import save_file

        start = time.perf_counter()
        stream = data["eval_pixels"]
        pixels = torch.cat(list(stream.batches(64)))
        save_file({"eval_pixels": pixels}, str(run / "data_float32.safetensors"))
        out["prepare_s"] += time.perf_counter() - start
        start = time.perf_counter()
        preds = predict(model, pixels, batch_size=64)
        out["pass_s"] = time.perf_counter() - start
    else:  # parallel: three models (the baseline and two perturbed copies) as measure_forms would see them
        import copy

        models = {"baseline": model}
        for k in (1, 2):
            models[f"v{k}"] = copy.deepcopy(model)
            with torch.no_grad():
                models[f"v{k}"].classifier.weight.mul_(1 + 0.1 * k)
        with torch.inference_mode():
            for m in models.values():
                m(pixel_values=data["calib_pixels"][:8])
        start = time.perf_counter()
        each = {name: predict(m, data["eval_pixels"], batch_size=64) for name, m in models.items()}
        out["per_model_passes_s"] = time.perf_counter() - start
        for parallel in (1, 2):
            start = time.perf_counter()
            together = predict_many(models, data["eval_pixels"], batch_size=64, parallel=parallel)
            out[f"one_pass_parallel{parallel}_s"] = time.perf_counter() - start
            assert all(torch.equal(together[n], each[n]) for n in models)
        preds = each["baseline"]
    out["preds"] = int(len(preds))
    files = [p for p in run.rglob("*") if p.is_file()]
    largest = max(files, key=lambda p: p.stat().st_size)
    out.update(
        peak_rss_mb=_rss_mb(),
        largest_file=str(largest.relative_to(run)),
        largest_file_mb=largest.stat().st_size / 1e6,
        data_file_mb=(run / "data.safetensors").stat().st_size / 1e6,
    )
    print(json.dumps(out))


def _spawn(args: argparse.Namespace, n: int, mode: str) -> dict:
    import shutil

    run = Path(args.work) / f"run-{mode}-{n}"
    shutil.rmtree(run, ignore_errors=True)
    cmd = [sys.executable, __file__, "--child", "--n", str(n), "--mode", mode, "--run", str(run)]
    cmd += ["--data", str(Path(args.work) / "images"), "--threads", str(args.threads)]
    done = subprocess.run(cmd, check=True, capture_output=True, text=True)
    row = json.loads(done.stdout.strip().splitlines()[-1])
    shutil.rmtree(run, ignore_errors=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 5000, 10000])
    parser.add_argument("--old", type=int, default=0, help="also measure the old float32 path at this size")
    parser.add_argument("--parallel-images", type=int, default=0, help="measure one-pass/parallel accuracy here")
    parser.add_argument("--work", default="/tmp/profiling-agent-bench-streaming")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--n", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--mode", default="stream", help=argparse.SUPPRESS)
    parser.add_argument("--run", default="", help=argparse.SUPPRESS)
    parser.add_argument("--data", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    total = max([*args.sizes, args.old, args.parallel_images])
    start = time.perf_counter()
    build_dataset(Path(args.work) / "images", total + 16)  # + the calibration images
    print(f"dataset: {total + 16} generated 224x224 JPEGs in {args.work}/images ({time.perf_counter() - start:.0f} s)")
    rows = [_spawn(args, n, "stream") for n in args.sizes]
    print("| images | prepare s | pass s | ms/image | peak RSS MB | RSS above ready MB | largest run file (MB) |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['n']} | {r['prepare_s']:.1f} | {r['pass_s']:.1f} | {1e3 * r['pass_s'] / r['n']:.2f} | "
            f"{r['peak_rss_mb']:.0f} | {r['peak_rss_mb'] - r['rss_ready_mb']:.0f} | "
            f"{r['largest_file']} ({r['largest_file_mb']:.2f}); data.safetensors {r['data_file_mb'] * 1e3:.1f} kB |"
        )
    small, large = rows[0], rows[-1]
    scale = large["n"] / small["n"]
    print(f"peak RSS {large['n']} / {small['n']} images: {large['peak_rss_mb'] / small['peak_rss_mb']:.2f}x")
    print(
        f"pass time {large['n']} images: {large['pass_s']:.1f} s vs {scale:g} x {small['n']}-image pass "
        f"{scale * small['pass_s']:.1f} s ({large['pass_s'] / (scale * small['pass_s']):.2f}x)"
    )
    if args.old:
        old = _spawn(args, args.old, "old")
        print(
            f"old float32 path at {old['n']} images: peak RSS {old['peak_rss_mb']:.0f} MB, largest file "
            f"{old['largest_file']} {old['largest_file_mb']:.0f} MB, prepare {old['prepare_s']:.1f} s, "
            f"pass {old['pass_s']:.1f} s"
        )
    if args.parallel_images:
        par = _spawn(args, args.parallel_images, "parallel")
        print(
            f"3 models on {par['n']} images: one pass per model {par['per_model_passes_s']:.1f} s; one shared pass "
            f"{par['one_pass_parallel1_s']:.1f} s; shared pass, 2 models at a time {par['one_pass_parallel2_s']:.1f} s"
        )


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    main()
