"""Streamed evaluation at scale: peak memory, run-folder size and time of preparation + one pass, 1k to 10k images.

    python bench/streaming.py                      # 1k, 5k, 10k images of a synthetic 224x224 imagefolder
    python bench/streaming.py --sizes 1000 2000    # other sizes
    python bench/streaming.py --old 1000           # also the float32 path the run used before (one size)
    python bench/streaming.py --parallel-images 1000   # one-pass / parallel accuracy passes of 3 models
    python bench/streaming.py --zoo ~/.cache/profiling-agent/zoo   # the zoo models: streamed vs old float path
    python bench/streaming.py --cli 5000           # a whole `profiling-agent run --subset 5000`: files and memory
    python bench/streaming.py --tiny --work DIR    # smoke test: one size of 64 images

The dataset is built offline with PIL (smooth generated 224x224 RGB JPEGs, 10 classes, an imagefolder) and cached
in --work. Every size runs in a fresh subprocess, which prints its own peak RSS (getrusage ru_maxrss): prepare_data
into a run folder (with the baseline artifact), then two accuracy passes of a small ViT (224x224, patch 16) over the
streamed validation images: the first decodes and resizes every image and keeps it as uint8 shards in
image_cache/; the second, over a freshly opened stream as the next node of a run would open it, reads them.
The parent prints a table, the ratio of peak RSS at the largest size to the smallest (target <= 1.5x), the run
folder's largest file (target < 100 MB at 5k images), the first pass at the largest size against (largest/smallest)
x the smallest one, and with --old the largest size against (largest/old) x the old float32 path (target: no slower).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

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
        image_size=SIZE,
        patch_size=16,
        num_channels=3,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        num_labels=CLASSES,
        id2label={i: f"class_{i}" for i in range(CLASSES)},
        label2id={f"class_{i}": i for i in range(CLASSES)},
    )
    return ViTForImageClassification(config).eval()


def processor():
    from transformers.models.vit.image_processing_pil_vit import ViTImageProcessorPil

    return ViTImageProcessorPil(size={"height": SIZE, "width": SIZE})


def old_float_pixels(ds: Any, rows: Any, proc: Any, shape: dict) -> Any:
    """Return what prepare_data stored before streaming: the rows' images through the processor, 64 at a time."""
    import torch

    from profiling_agent.tools.data.preprocess import preprocess_images

    images = ds.select_columns(["image"]).select(rows.tolist())
    return torch.cat([preprocess_images(images[s : s + 64]["image"], proc, shape) for s in range(0, len(images), 64)])


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: kB


def child(args: argparse.Namespace) -> None:
    """Prepare N images into a run folder and run one accuracy pass; print one JSON line."""
    import torch

    from profiling_agent.tools.data.labels import map_labels
    from profiling_agent.tools.data.prepare import SubsetSpec, load_prepared, prepare_images
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
    info = prepare_images(
        ds,
        proc,
        shape,
        mapping,
        out_path=run / "data.safetensors",
        spec=SubsetSpec(subset=args.n, test_subset=0, calibration=16),
    )
    prepare_s = time.perf_counter() - start
    data = open_prepared(info["path"], {"eval": ds, "calib": ds}, proc)
    with torch.inference_mode():  # warm the model up (first-call allocations) outside every timed pass
        model(pixel_values=data["calib_pixels"][:8])
    out: dict = {"n": info["n_eval"], "prepare_s": prepare_s, "rss_ready_mb": rss_ready}
    if args.mode == "stream":  # the first pass decodes and caches uint8 shards; the next node's pass reads them
        start = time.perf_counter()
        preds = predict(model, data["eval_pixels"], batch_size=64)
        out["pass_s"] = time.perf_counter() - start
        again = open_prepared(info["path"], {"eval": ds, "calib": ds}, proc)["eval_pixels"]
        start = time.perf_counter()
        warm = predict(model, again, batch_size=64)
        out["warm_pass_s"] = time.perf_counter() - start
        assert torch.equal(warm, preds), "the cached pass predicted differently"
    elif args.mode == "old":  # what prepare_data did before: every image as float32 in memory and on disk
        from safetensors.torch import save_file

        start = time.perf_counter()
        pixels = old_float_pixels(ds, load_prepared(info["path"], with_indices=True)["eval_index"], proc, shape)
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
        cache_mb=sum(p.stat().st_size for p in (run / "image_cache").rglob("*") if p.is_file()) / 1e6
        if (run / "image_cache").is_dir()
        else 0.0,
    )
    print(json.dumps(out))


def zoo_child(args: argparse.Namespace) -> None:
    """One zoo model on Fashion-MNIST's test split: the old float32 path at 1,000 images, streamed at all of them."""
    import shutil

    import torch
    from datasets import load_from_disk
    from safetensors.torch import save_file
    from transformers import AutoImageProcessor, AutoModelForImageClassification

    from profiling_agent.tools.data.labels import map_labels
    from profiling_agent.tools.data.prepare import SubsetSpec, load_prepared, prepare_images
    from profiling_agent.tools.data.stream import open_prepared
    from profiling_agent.tools.evaluation.metrics import predict

    torch.set_num_threads(args.threads)
    zoo = Path(args.data)
    ds = load_from_disk(str(zoo / "fashion-mnist"))["test"]
    folder = zoo / "models" / args.model
    model = AutoModelForImageClassification.from_pretrained(str(folder)).eval()
    proc = AutoImageProcessor.from_pretrained(str(folder))
    size = proc.size
    shape = {"channels": 1, "height": size["height"], "width": size["width"]}
    mapping = map_labels(ds.features["label"].names, model.config.id2label)
    run = Path(args.run)
    out: dict[str, Any] = {"model": args.model}

    def prepared(subset: int, name: str) -> dict:
        info = prepare_images(
            ds, proc, shape, mapping, out_path=run / name, spec=SubsetSpec(subset=subset, calibration=16)
        )
        return open_prepared(info["path"], {"eval": ds, "calib": ds}, proc)

    with torch.inference_mode():
        model(pixel_values=torch.zeros(8, *shape.values()))

    def timed(work: Any) -> tuple[float, Any]:
        start = time.perf_counter()
        result = work()
        return time.perf_counter() - start, result

    def old_prepare() -> torch.Tensor:  # the old path: every image preprocessed into one float32 tensor, saved
        info = prepare_images(
            ds, proc, shape, mapping, out_path=run / "old.safetensors", spec=SubsetSpec(subset=1000, calibration=16)
        )
        pixels = old_float_pixels(ds, load_prepared(info["path"], with_indices=True)["eval_index"], proc, shape)
        save_file({"eval_pixels": pixels}, str(run / "old_float32.safetensors"))
        return pixels

    def first_pass() -> tuple[float, torch.Tensor]:  # --subset all from scratch: prepare, then a pass that caches
        shutil.rmtree(run / "image_cache", ignore_errors=True)
        prepare_s, stream = timed(lambda: prepared(0, "all.safetensors")["eval_pixels"])
        out["n"] = len(stream)
        return prepare_s, predict(model, stream, batch_size=64)

    rows: dict[str, list[float]] = {k: [] for k in ("old_prepare_s", "old_pass_s", "prepare_s", "pass_s", "warm")}
    for _ in range(args.repeats):  # interleaved, medians: the passes take seconds on a noisy machine
        seconds, pixels = timed(old_prepare)
        rows["old_prepare_s"].append(seconds)
        rows["old_pass_s"].append(timed(lambda: predict(model, pixels, batch_size=64))[0])  # noqa: B023
        seconds, (prepare_s, first) = timed(first_pass)
        rows["prepare_s"].append(prepare_s)
        rows["pass_s"].append(seconds - prepare_s)
        stream = prepared(0, "all.safetensors")["eval_pixels"]  # the next candidate's pass reads the shards
        seconds, warm = timed(lambda: predict(model, stream, batch_size=64))  # noqa: B023
        rows["warm"].append(seconds)
        assert torch.equal(first, warm), "the cached pass predicted differently"
    out["old_n"] = 1000
    out.update({k: statistics.median(v) for k, v in rows.items()})
    out["warm_pass_s"] = out.pop("warm")
    print(json.dumps(out))


def zoo_report(args: argparse.Namespace) -> None:
    """Run zoo_child for each zoo model and print the pass times against ten times the old path's."""
    import shutil

    zoo = Path(args.zoo)
    print(
        "| zoo model | old path 1k: prepare + pass s | streamed: images | first pass s | cached pass s | "
        "cached / (n/1k x old pass) | (prepare + first) / (n/1k x old prepare + pass) |"
    )
    print("|---|---|---|---|---|---|---|")
    for name in ("resnet", "vit", "deit", "swin"):
        run = Path(args.work) / f"run-zoo-{name}"
        shutil.rmtree(run, ignore_errors=True)
        cmd = [sys.executable, __file__, "--child", "--mode", "zoo", "--model", name, "--run", str(run)]
        cmd += ["--data", str(zoo), "--threads", str(args.threads), "--repeats", str(args.repeats)]
        done = subprocess.run(cmd, check=True, capture_output=True, text=True)
        r = json.loads(done.stdout.strip().splitlines()[-1])
        shutil.rmtree(run, ignore_errors=True)
        scale = r["n"] / r["old_n"]
        print(
            f"| {name} | {r['old_prepare_s']:.1f} + {r['old_pass_s']:.2f} | {r['n']} | {r['pass_s']:.1f} | "
            f"{r['warm_pass_s']:.1f} | {r['warm_pass_s'] / (scale * r['old_pass_s']):.2f}x | "
            f"{(r['prepare_s'] + r['pass_s']) / (scale * (r['old_prepare_s'] + r['old_pass_s'])):.2f}x |"
        )


def cli_report(args: argparse.Namespace, images: Path) -> None:
    """Run `profiling-agent run` on the generated 224x224 images with --subset N; print its size and memory."""
    import shutil

    work = Path(args.work)
    model_dir, runs = work / "cli-model", work / "cli-runs"
    shutil.rmtree(runs, ignore_errors=True)
    if not (model_dir / "config.json").exists():
        model = small_model()
        model.save_pretrained(str(model_dir))
        processor().save_pretrained(str(model_dir))
    cmd = [
        sys.executable,
        "-m",
        "profiling_agent.graph.cli",
        "run",
        "--model",
        str(model_dir),
        "--dataset",
        str(images),
        "--split",
        "train",
        "--subset",
        str(args.cli),
        "--test-subset",
        "256",
        "--iterations",
        "2",
        "--recover",
        "reconstruct",
        "--backend",
        "torch",
        "--threads",
        str(args.threads),
        "--run-dir",
        str(runs),
        "--thread-id",
        "cli",
    ]
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"profiling-agent run failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    files = [p for p in (runs / "cli").rglob("*") if p.is_file()]
    largest = max(files, key=lambda p: p.stat().st_size)
    cache = sum(p.stat().st_size for p in files if "image_cache" in p.parts)
    print(
        f"profiling-agent run --subset {args.cli} (224x224, 2 iterations, reconstruct): {seconds:.0f} s, peak RSS "
        f"{rss:.0f} MB, {len(files)} files, {sum(p.stat().st_size for p in files) / 1e6:.0f} MB in all "
        f"(uint8 image cache {cache / 1e6:.0f} MB), largest {largest.relative_to(runs / 'cli')} "
        f"{largest.stat().st_size / 1e6:.1f} MB (target < 100 MB)"
    )
    shutil.rmtree(runs, ignore_errors=True)


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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 5000, 10000])
    parser.add_argument("--old", type=int, default=0, help="also measure the old float32 path at this size")
    parser.add_argument("--parallel-images", type=int, default=0, help="measure one-pass/parallel accuracy here")
    parser.add_argument("--cli", type=int, default=0, help="only run profiling-agent run --subset N on the images")
    parser.add_argument("--zoo", default="", help="only time the zoo models (bench/zoo.py's folder) on Fashion-MNIST")
    parser.add_argument("--repeats", type=int, default=3, help="--zoo: interleaved repeats (medians are printed)")
    parser.add_argument("--work", default="/tmp/profiling-agent-bench-streaming")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tiny", action="store_true", help="smoke test: one size of 64 images")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--n", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--mode", default="stream", help=argparse.SUPPRESS)
    parser.add_argument("--run", default="", help=argparse.SUPPRESS)
    parser.add_argument("--data", default="", help=argparse.SUPPRESS)
    parser.add_argument("--model", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.tiny:
        args.sizes = [64]
    if args.child:
        zoo_child(args) if args.mode == "zoo" else child(args)
        return
    if args.zoo:
        zoo_report(args)
        return
    total = args.cli + 256 + 64 if args.cli else max([*args.sizes, args.old, args.parallel_images]) + 16
    start = time.perf_counter()
    build_dataset(Path(args.work) / "images", total)  # + the calibration (and test) images
    print(f"dataset: {total} generated 224x224 JPEGs in {args.work}/images ({time.perf_counter() - start:.0f} s)")
    if args.cli:
        cli_report(args, Path(args.work) / "images")
        return
    rows = [_spawn(args, n, "stream") for n in args.sizes]
    print(
        "| images | prepare s | first pass s (decodes, caches) | next pass s (cached) | ms/image first / next | "
        "peak RSS MB | RSS above ready MB | uint8 cache MB | largest run file (MB) |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['n']} | {r['prepare_s']:.1f} | {r['pass_s']:.1f} | {r['warm_pass_s']:.1f} | "
            f"{1e3 * r['pass_s'] / r['n']:.2f} / {1e3 * r['warm_pass_s'] / r['n']:.2f} | "
            f"{r['peak_rss_mb']:.0f} | {r['peak_rss_mb'] - r['rss_ready_mb']:.0f} | {r['cache_mb']:.0f} | "
            f"{r['largest_file']} ({r['largest_file_mb']:.2f}); data.safetensors {r['data_file_mb'] * 1e3:.1f} kB |"
        )
    small, large = rows[0], rows[-1]
    scale = large["n"] / small["n"]
    print(f"peak RSS {large['n']} / {small['n']} images: {large['peak_rss_mb'] / small['peak_rss_mb']:.2f}x")
    print(
        f"first pass {large['n']} images: {large['pass_s']:.1f} s vs {scale:g} x {small['n']}-image first pass "
        f"{scale * small['pass_s']:.1f} s ({large['pass_s'] / (scale * small['pass_s']):.2f}x)"
    )
    if args.old:
        old = _spawn(args, args.old, "old")
        scale = large["n"] / old["n"]
        print(
            f"old float32 path at {old['n']} images: peak RSS {old['peak_rss_mb']:.0f} MB, largest file "
            f"{old['largest_file']} {old['largest_file_mb']:.0f} MB, prepare {old['prepare_s']:.1f} s, "
            f"pass {old['pass_s']:.1f} s"
        )
        print(
            f"{large['n']} images vs {scale:g} x the old path at {old['n']}: cached pass {large['warm_pass_s']:.1f} s "
            f"vs {scale * old['pass_s']:.1f} s ({large['warm_pass_s'] / (scale * old['pass_s']):.2f}x); "
            f"prepare + first pass {large['prepare_s'] + large['pass_s']:.1f} s vs "
            f"{scale * (old['prepare_s'] + old['pass_s']):.1f} s "
            f"({(large['prepare_s'] + large['pass_s']) / (scale * (old['prepare_s'] + old['pass_s'])):.2f}x)"
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
