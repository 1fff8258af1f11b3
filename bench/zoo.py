"""Benchmark zoo: one small transformers classifier per family (ResNet, ViT, DeiT, Swin) trained on Fashion-MNIST.

Usage:
    python bench/zoo.py                       # build (or reuse) all four models; prints accuracy and build time
    python bench/zoo.py vit resnet --force    # rebuild two of them
    python bench/zoo.py --out /tmp/zoo --train 6000
    python bench/zoo.py --train-split 40000     # a dataset whose train split holds 40,000 unseen training images
    python bench/zoo.py --tiny --out /tmp/zoo   # smoke test: the four architectures, one epoch on a digits stand-in
    python bench/zoo.py vit-tokens              # the ViT with 196 patch tokens (56x56 inputs), for token merging

The images come from Debian's `dataset-fashion-mnist` (/usr/share/datasets/fashion-mnist, idx files; installed
with apt-get when missing and running as root). Everything lands under $PROFILING_AGENT_CACHE/zoo (or --out):

    zoo.json                    models, accuracy, params, build seconds, settings, versions
    fashion-mnist/              DatasetDict (save_to_disk): test (10,000 images) and train (a calibration sample)
    models/NAME/                save_pretrained model + image processor + training.json

Models take 32x32 grayscale inputs (28x28 images resized by their processor, mean/std 0.5), so every
family's patch and window sizes divide the input. `vit-tokens` (built only when named) is a ViT for token merging
(docs/tokens.md): its processor upscales the same images to 56x56, cut into 4x4 patches, so it sees 196 patch tokens
and its CLS token (the 32x32 models see 16 or 64). The dataset folder is shared: each model's processor resizes.

`--tiny` (or PROFILING_AGENT_ZOO_TINY=1, which every bench's `--tiny` sets) swaps Fashion-MNIST for a stand-in in
the same format (scikit-learn's bundled 8x8 digits resized to 28x28: 1,437 train and 360 test images), trains on 256
images for one epoch, and defaults to $PROFILING_AGENT_CACHE/zoo-tiny: the same code path in seconds, no download.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from profiling_agent.tools.models.embedded import accuracy
from profiling_agent.tools.models.training import train_classifier
from profiling_agent.tools.versions import versions

FASHION_DIR = Path("/usr/share/datasets/fashion-mnist")
FASHION_PACKAGE = "dataset-fashion-mnist"
LABELS = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"]
IMAGE_SIZE = 32
CALIBRATION_TRAIN = 2000  # training images saved as the dataset's "train" split (calibration for the agent)
FAMILIES = ("resnet", "vit", "deit", "swin")  # built by default; SPECS also holds vit-tokens
TOKENS_MODEL = "vit-tokens"
TOKENS_SIZE = 56  # vit-tokens' input: 28x28 images upscaled 2x, 4x4 patches -> 14x14 = 196 patch tokens
EXIT_BAD_INPUT = 2
TINY_ENV = "PROFILING_AGENT_ZOO_TINY"


@dataclass(frozen=True)
class Scale:
    """How much data the zoo draws on: Fashion-MNIST's full sizes, or the tiny stand-in's."""

    train_total: int  # images in the source's train split
    train_images: int  # default training subset of a zoo model
    calibration: int  # training images saved as the dataset's "train" split
    max_epochs: int | None = None  # cap on every spec's epochs
    batch_size: int | None = None  # every spec's training batch, when set


FULL = Scale(train_total=60000, train_images=10000, calibration=CALIBRATION_TRAIN)
TINY = Scale(train_total=1437, train_images=256, calibration=128, max_epochs=1, batch_size=32)


def use_tiny() -> None:
    """Switch this process and its children to the tiny stand-in (sets PROFILING_AGENT_ZOO_TINY=1)."""
    os.environ[TINY_ENV] = "1"


def is_tiny() -> bool:
    """Whether the tiny stand-in is in use."""
    return os.environ.get(TINY_ENV) == "1"


def scale() -> Scale:
    """The data sizes in use: TINY under `use_tiny()`, else FULL."""
    return TINY if is_tiny() else FULL


class ZooError(RuntimeError):
    """The zoo cannot be built (Fashion-MNIST missing and not installable): one line, exit code 2."""


@dataclass
class ModelSpec:
    """How one zoo model is built and trained."""

    family: str
    config: dict[str, Any]  # keyword arguments of the transformers config class
    epochs: int
    lr: float
    batch_size: int = 128
    weight_decay: float = 0.05
    warmup_fraction: float = 0.1
    extra: dict[str, Any] = field(default_factory=dict)


_TRANSFORMER = {
    "image_size": IMAGE_SIZE,
    "patch_size": 8,
    "num_channels": 1,
    "hidden_size": 64,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "intermediate_size": 256,
    "hidden_dropout_prob": 0.0,
    "attention_probs_dropout_prob": 0.0,
}

SPECS: dict[str, ModelSpec] = {
    "resnet": ModelSpec(
        "resnet",
        {
            "num_channels": 1,
            "embedding_size": 16,
            "hidden_sizes": [64, 128, 256],
            "depths": [1, 2, 1],
            "layer_type": "bottleneck",
            "downsample_in_first_stage": False,
        },
        epochs=4,
        lr=3e-3,
    ),
    "vit": ModelSpec("vit", dict(_TRANSFORMER), epochs=6, lr=1e-3),
    "deit": ModelSpec("deit", dict(_TRANSFORMER), epochs=6, lr=1e-3),
    "swin": ModelSpec(
        "swin",
        {
            "image_size": IMAGE_SIZE,
            "patch_size": 4,
            "num_channels": 1,
            "embed_dim": 32,
            "depths": [2, 2],
            "num_heads": [2, 4],
            "window_size": 4,
            "mlp_ratio": 4.0,
            "hidden_dropout_prob": 0.0,
            "attention_probs_dropout_prob": 0.0,
            "drop_path_rate": 0.0,
        },
        epochs=5,
        lr=1e-3,
    ),
    # 196 patch tokens + CLS, hidden 96 (3 heads), MLP 384, 4 layers: 12.5 min on one thread of a busy 2-core machine
    TOKENS_MODEL: ModelSpec(
        "vit",
        {**_TRANSFORMER, "image_size": TOKENS_SIZE, "patch_size": 4, "hidden_size": 96, "num_attention_heads": 3}
        | {"intermediate_size": 384},
        epochs=4,
        lr=1.5e-3,
        batch_size=64,
    ),
}


# ---------------------------------------------------------------- data


def cache_root() -> Path:
    """Return $PROFILING_AGENT_CACHE (or ~/.cache/profiling-agent)."""
    env = os.environ.get("PROFILING_AGENT_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "profiling-agent"


def default_out() -> Path:
    """Return the default zoo folder: $PROFILING_AGENT_CACHE/zoo (zoo-tiny with the tiny stand-in)."""
    return cache_root() / ("zoo-tiny" if is_tiny() else "zoo")


def _idx_files(split: str) -> tuple[Path, Path]:
    prefix = "train" if split == "train" else "t10k"
    return FASHION_DIR / f"{prefix}-images-idx3-ubyte.gz", FASHION_DIR / f"{prefix}-labels-idx1-ubyte.gz"


def ensure_fashion_mnist(install: bool = True) -> None:
    """Make sure Debian's Fashion-MNIST files exist, installing the package with apt-get when allowed.

    Raises:
        ZooError: When the files are missing and cannot be installed.
    """
    if is_tiny() or all(p.exists() for s in ("train", "test") for p in _idx_files(s)):
        return
    hint = f"apt-get install -y {FASHION_PACKAGE}"
    if not install or os.geteuid() != 0 or not shutil.which("apt-get"):
        raise ZooError(f"Fashion-MNIST not found in {FASHION_DIR}; install it with `{hint}`")
    print(f"zoo: installing {FASHION_PACKAGE} with apt-get", file=sys.stderr, flush=True)
    for command in ([], ["apt-get", "update", "-qq"]):
        if command:
            subprocess.run(command, check=False, capture_output=True)
        done = subprocess.run(["apt-get", "install", "-y", "-qq", FASHION_PACKAGE], check=False, capture_output=True)
        if done.returncode == 0 and all(p.exists() for s in ("train", "test") for p in _idx_files(s)):
            return
    raise ZooError(f"could not install {FASHION_PACKAGE}; run `{hint}`")


def read_idx(path: Path) -> np.ndarray:
    """Read a (gzipped) idx file: uint8 images (N, 28, 28) or labels (N,)."""
    raw = gzip.open(path, "rb").read() if path.suffix == ".gz" else path.read_bytes()
    magic, count = int.from_bytes(raw[0:4], "big"), int.from_bytes(raw[4:8], "big")
    if magic == 2051:
        rows, cols = int.from_bytes(raw[8:12], "big"), int.from_bytes(raw[12:16], "big")
        return np.frombuffer(raw, dtype=np.uint8, offset=16).reshape(count, rows, cols)
    if magic == 2049:
        return np.frombuffer(raw, dtype=np.uint8, offset=8).reshape(count)
    raise ValueError(f"{path} is not an idx image or label file (magic {magic})")


def load_digits_standin(split: str) -> tuple[np.ndarray, np.ndarray]:
    """Return the tiny stand-in's `split`: scikit-learn's 8x8 digits as uint8 (N, 28, 28), seeded 1,437/360 split."""
    from PIL import Image
    from sklearn.datasets import load_digits

    digits = load_digits()
    order = np.random.default_rng(0).permutation(len(digits.target))
    rows = order[: TINY.train_total] if split == "train" else order[TINY.train_total :]
    small = (digits.images[rows] * (255.0 / 16.0)).round().astype(np.uint8)
    images = np.stack([np.asarray(Image.fromarray(img, mode="L").resize((28, 28), Image.BILINEAR)) for img in small])
    return images, digits.target[rows].astype(np.int64)


def load_fashion(split: str) -> tuple[np.ndarray, np.ndarray]:
    """Return (images uint8 (N, 28, 28), labels int64 (N,)) of the Fashion-MNIST `split` (train or test).

    Under `use_tiny()` the digits stand-in's split instead.
    """
    if is_tiny():
        return load_digits_standin(split)
    images, labels = _idx_files(split)
    return read_idx(images), read_idx(labels).astype(np.int64)


def as_dataset(images: np.ndarray, labels: np.ndarray, names: list[str] | None = None) -> Any:
    """Return uint8 images (N, 28, 28) and their labels as a datasets.Dataset ("image", "label"; class `names`)."""
    from datasets import ClassLabel, Dataset, Features, Image
    from PIL import Image as PILImage

    features = Features({"image": Image(), "label": ClassLabel(names=names or LABELS)})
    pil = [PILImage.fromarray(img, mode="L") for img in images]
    return Dataset.from_dict({"image": pil, "label": labels.tolist()}, features=features)


def save_dataset(out: Path, calibration: np.ndarray, seed: int = 0, name: str = "fashion-mnist") -> Path:
    """Save Fashion-MNIST's test split (and `calibration` train indices as "train") with save_to_disk as `name`."""
    from datasets import DatasetDict, disable_progress_bars

    from profiling_agent.tools.io import atomic_dir

    disable_progress_bars()

    target = out / name
    if (target / "dataset_dict.json").exists():
        return target
    test_x, test_y = load_fashion("test")
    train_x, train_y = load_fashion("train")
    dd = DatasetDict(
        {"test": as_dataset(test_x, test_y), "train": as_dataset(train_x[calibration], train_y[calibration])}
    )
    with atomic_dir(target) as tmp:
        dd.save_to_disk(str(tmp))
    return target


# ---------------------------------------------------------------- models


def image_size(name: str) -> int:
    """The input size of zoo model `name` (32, or 56 for vit-tokens)."""
    return int(SPECS[name].config.get("image_size", IMAGE_SIZE))


def processor(name: str | None = None):
    """Return zoo model `name`'s image processor (None: the 32x32 models').

    The 32x32 models use the embedded models' processor (one channel, mean/std 0.5); a model with another input
    size gets the same processor resizing to its size.
    """
    from profiling_agent.tools.models.embedded import digits_processor
    from profiling_agent.tools.models.embedded_data import IMAGE_SIZE as EMBEDDED_SIZE

    assert EMBEDDED_SIZE == IMAGE_SIZE
    proc = digits_processor()
    size = image_size(name) if name else IMAGE_SIZE
    if size != IMAGE_SIZE:
        proc.size = {"height": size, "width": size}
    return proc


def spec_of(name: str) -> ModelSpec:
    """The spec zoo model `name` is built with (one epoch of batch 32 under `use_tiny()`)."""
    sizes, spec = scale(), SPECS[name]
    if sizes.max_epochs:
        spec = replace(spec, epochs=min(spec.epochs, sizes.max_epochs))
    return replace(spec, batch_size=sizes.batch_size) if sizes.batch_size else spec


def build_architecture(name: str) -> torch.nn.Module:
    """Build the untrained zoo model `name` (resnet, vit, deit or swin) from its config."""
    import transformers

    spec = SPECS[name]
    classes = {
        "resnet": ("ResNetConfig", "ResNetForImageClassification"),
        "vit": ("ViTConfig", "ViTForImageClassification"),
        "deit": ("DeiTConfig", "DeiTForImageClassification"),
        "swin": ("SwinConfig", "SwinForImageClassification"),
    }[spec.family]
    config = getattr(transformers, classes[0])(
        **spec.config, id2label=dict(enumerate(LABELS)), label2id={n: i for i, n in enumerate(LABELS)}
    )
    return getattr(transformers, classes[1])(config)


def pixels(images: np.ndarray, proc: Any, chunk: int = 2000) -> torch.Tensor:
    """Preprocess uint8 images (N, 28, 28) with the model's processor into (N, 1, S, S) floats (S its size)."""
    from PIL import Image

    out = []
    for start in range(0, len(images), chunk):
        batch = [Image.fromarray(img, mode="L") for img in images[start : start + chunk]]
        out.append(proc(images=batch, return_tensors="pt")["pixel_values"].float())
    return torch.cat(out)


def _flip(xb: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    flip = torch.rand(len(xb), generator=gen) < 0.5
    return torch.where(flip[:, None, None, None], xb.flip(-1), xb)


def train(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, spec: ModelSpec, seed: int = 0) -> None:
    """Train `model` in place: AdamW, warm-up + cosine, random horizontal flips."""
    schedule = (spec.epochs, spec.batch_size, spec.lr, spec.weight_decay, spec.warmup_fraction)
    train_classifier(model, x, y, schedule=schedule, seed=seed, augment=_flip)


def spec_hash(name: str, train_images: int, seed: int) -> str:
    """Fingerprint of what a zoo model is built from (a cached model with another fingerprint is rebuilt)."""
    blob = json.dumps({"spec": asdict(spec_of(name)), "train": train_images, "seed": seed}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def build_model(name: str, out: Path, data: dict[str, torch.Tensor], seed: int = 0) -> dict[str, Any]:
    """Train zoo model `name` on the prepared tensors and save it (model, processor, training.json) atomically."""
    from profiling_agent.tools.io import atomic_dir, write_json_atomic

    start = time.perf_counter()
    torch.manual_seed(seed)
    model = build_architecture(name)
    train(model, data["x_train"], data["y_train"], spec_of(name), seed)
    train_seconds = time.perf_counter() - start
    acc = accuracy(model, data["x_test"], data["y_test"], batch_size=500)
    record = {
        "name": name,
        "family": spec_of(name).family,
        "image_size": image_size(name),
        "architecture": type(model).__name__,
        "params": sum(p.numel() for p in model.parameters()),
        "test_accuracy": round(acc, 2),
        "test_images": len(data["y_test"]),
        "train_images": len(data["y_train"]),
        "epochs": spec_of(name).epochs,
        "train_seconds": round(train_seconds, 1),
        "build_seconds": round(time.perf_counter() - start, 1),
        "threads": torch.get_num_threads(),
        "seed": seed,
        "fingerprint": spec_hash(name, len(data["y_train"]), seed),
        "spec": asdict(spec_of(name)),
        "versions": versions("datasets", "scikit-learn"),
    }
    with atomic_dir(out / "models" / name) as tmp:
        model.save_pretrained(tmp)
        processor(name).save_pretrained(tmp)
        write_json_atomic(tmp / "training.json", record)
    return record


def _cached(out: Path, name: str, fingerprint: str) -> dict[str, Any] | None:
    path = out / "models" / name / "training.json"
    if not path.exists():
        return None
    record = json.loads(path.read_text())
    return record if record.get("fingerprint") == fingerprint else None


def build_zoo(
    out: Path | None = None,
    names: tuple[str, ...] = FAMILIES,
    *,
    train_images: int | None = None,
    seed: int = 0,
    force: bool = False,
    threads: int | None = 1,
    log: Any = None,
) -> dict[str, Any]:
    """Build (or reuse) the zoo models `names` and the test dataset; write and return zoo.json.

    Args:
        out: Zoo folder (default $PROFILING_AGENT_CACHE/zoo).
        names: Which families to build.
        train_images: Seeded subset of the 60,000 training images used for training (None: 10,000; tiny 256).
        seed: Seed of the subset, initialization and training order.
        force: Rebuild models even when a cached copy with the same fingerprint exists.
        threads: torch threads while training (None: torch's). 1 by default: on a shared 2-core machine these
            small models trained 10-20x faster on one thread than on two (OpenMP threads fight for the cores).
        log: Callable taking one message per step (the script prints them).

    Returns:
        The zoo description written to zoo.json.
    """
    out = Path(out or default_out())
    log = log or (lambda message: None)
    unknown = [n for n in names if n not in SPECS]
    if unknown:
        raise ValueError(f"unknown zoo model {unknown[0]!r}; choose from {', '.join(SPECS)}")
    ensure_fashion_mnist()
    previous = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        return _build(out, names, train_images or scale().train_images, seed, force, log)
    finally:
        torch.set_num_threads(previous)


def save_training_dataset(out: Path, images: int, train_images: int | None = None, seed: int = 0) -> Path:
    """Save the test split and `images` training images the zoo models never trained on, as fashion-mnist-train-N.

    The zoo's own dataset keeps a 2,000-image "train" split (a calibration sample); recovery then distils on those
    2,000 images only. A user compressing a Fashion-MNIST model has its training set: this dataset gives the agent
    that many images to calibrate and distil on (its first 2,000 are the zoo's calibration sample).
    """
    train_images = train_images or scale().train_images
    order = np.random.default_rng(seed).permutation(scale().train_total)
    picked = order[train_images : train_images + images]
    return save_dataset(out, picked, seed, name=f"fashion-mnist-train-{images}")


def _build(out: Path, names: tuple[str, ...], train_images: int, seed: int, force: bool, log: Any) -> dict[str, Any]:
    from profiling_agent.tools.io import write_json_atomic

    order = np.random.default_rng(seed).permutation(scale().train_total)
    train_idx, calib_idx = order[:train_images], order[train_images : train_images + scale().calibration]
    start = time.perf_counter()
    dataset = save_dataset(out, calib_idx, seed)
    seconds = time.perf_counter() - start
    log(f"dataset  {dataset}  (train {len(calib_idx):,} calibration images) {seconds:.1f}s")
    zoo_path = out / "zoo.json"
    zoo = json.loads(zoo_path.read_text()) if zoo_path.exists() else {}
    models = dict(zoo.get("models", {}))
    data: dict[int, dict[str, torch.Tensor]] = {}  # per input size
    for name in names:
        record = None if force else _cached(out, name, spec_hash(name, train_images, seed))
        if record is None:
            size = image_size(name)
            if size not in data:
                prep = time.perf_counter()
                proc = processor(name)
                train_x, train_y = load_fashion("train")
                test_x, test_y = load_fashion("test")
                data[size] = {
                    "x_train": pixels(train_x[train_idx], proc),
                    "y_train": torch.from_numpy(train_y[train_idx]),
                    "x_test": pixels(test_x, proc),
                    "y_test": torch.from_numpy(test_y),
                }
                seconds = time.perf_counter() - prep
                log(
                    f"preprocessed {train_images:,} train + {len(test_y):,} test images"
                    f" ({size}x{size}) in {seconds:.1f}s"
                )
            record = build_model(name, out, data[size], seed)
            status = "built"
        else:
            status = "cached"
        models[name] = {
            "path": str(out / "models" / name),
            "image_size": record.get("image_size", image_size(name)),
            **{
                k: record[k]
                for k in (
                    "family",
                    "architecture",
                    "params",
                    "test_accuracy",
                    "train_images",
                    "epochs",
                    "build_seconds",
                    "threads",
                )
            },
        }
        log(
            f"{status:6s} {name:6s} {record['architecture']:30s} acc={record['test_accuracy']:.2f}%  "
            f"params={record['params']:,}  epochs={record['epochs']}  build={record['build_seconds']:.1f}s "
            f"(threads={record['threads']})"
        )
    zoo = {
        "dataset": {"path": str(dataset), "split": "test", "labels": LABELS, "source": _source()},
        "image_size": IMAGE_SIZE,
        "train_images": train_images,
        "seed": seed,
        "models": models,
        "versions": versions("datasets", "scikit-learn"),
    }
    write_json_atomic(zoo_path, zoo)
    return zoo


def _source() -> str:
    return "scikit-learn digits (tiny stand-in)" if is_tiny() else str(FASHION_DIR)


def main(argv: list[str] | None = None) -> int:
    """Build the zoo from the command line."""
    parser = argparse.ArgumentParser(prog="bench/zoo.py", description="Train the benchmark zoo on Fashion-MNIST.")
    parser.add_argument("names", nargs="*", metavar="MODEL", help=f"models to build (default: {' '.join(FAMILIES)})")
    parser.add_argument("--out", default=None, help="zoo folder (default: $PROFILING_AGENT_CACHE/zoo)")
    parser.add_argument("--train", type=int, default=None, help="training images (seeded subset of 60,000; 10,000)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch threads while training (default 1)")
    parser.add_argument("--force", action="store_true", help="rebuild even when cached")
    parser.add_argument("--tiny", action="store_true", help="smoke test: one epoch on 256 images of a digits stand-in")
    parser.add_argument(
        "--train-split",
        type=int,
        default=None,
        metavar="N",
        help="only write fashion-mnist-train-N: the test split and N training images the models never saw",
    )
    args = parser.parse_args(argv)
    if args.tiny:
        use_tiny()
    sizes = scale()
    args.train = args.train or sizes.train_images
    bad = [n for n in args.names if n not in SPECS]
    if bad:
        parser.exit(EXIT_BAD_INPUT, f"zoo: unknown model {bad[0]!r}; choose from {', '.join(SPECS)}\n")
    if not 100 <= args.train <= sizes.train_total - sizes.calibration:
        parser.exit(EXIT_BAD_INPUT, f"zoo: --train must be in [100, {sizes.train_total - sizes.calibration}]\n")
    if args.train_split is not None:
        if not sizes.calibration <= args.train_split <= sizes.train_total - args.train:
            limits = f"[{sizes.calibration}, {sizes.train_total - args.train}]"
            parser.exit(EXIT_BAD_INPUT, f"zoo: --train-split must be in {limits}\n")
        ensure_fashion_mnist()
        out = Path(args.out) if args.out else default_out()
        print(f"zoo: dataset {save_training_dataset(out, args.train_split, args.train, args.seed)}")
        return 0
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    start = time.perf_counter()
    try:
        zoo = build_zoo(
            Path(args.out) if args.out else None,
            tuple(args.names) or FAMILIES,
            train_images=args.train,
            seed=args.seed,
            force=args.force,
            threads=args.threads,
            log=lambda message: print(message, flush=True),
        )
    except ZooError as exc:
        parser.exit(EXIT_BAD_INPUT, f"zoo: error: {exc}\n")
    out = Path(args.out) if args.out else default_out()
    print(f"zoo: {len(zoo['models'])} models in {out} ({time.perf_counter() - start:.1f}s); see {out / 'zoo.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
