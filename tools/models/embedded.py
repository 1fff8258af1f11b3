"""The offline default models: two small classifiers trained on the embedded digits dataset."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from profiling_agent.tools.hub import quiet_hf
from profiling_agent.tools.io import atomic_dir, write_json_atomic
from profiling_agent.tools.models.embedded_data import (
    DATASET_NAME,
    IMAGE_SIZE,
    LABEL_NAMES,
    cache_dir,
    ensure_dataset,
    file_lock,
)
from profiling_agent.tools.models.training import train_classifier
from profiling_agent.tools.versions import versions

logger = logging.getLogger(__name__)
MODEL_NAMES = ("vit-digits", "resnet-digits")
_MODEL_MARKER = "training.json"


@dataclass
class TrainConfig:
    """Training schedule of an embedded model; None fields take the per-model defaults in _DEFAULTS."""

    epochs: int | None = None  # passes over the training split
    lr: float | None = None  # AdamW peak learning rate (linear warm-up, then cosine decay to 0)
    batch_size: int = 64
    weight_decay: float = 0.05
    warmup_fraction: float = 0.1  # share of all steps spent warming up
    shift: int = 2  # random translation of up to +-shift pixels per image (0 disables augmentation)
    max_train: int | None = None  # cap on training images (tests use a few hundred)
    seed: int = 0
    threads: int | None = None  # torch intra-op threads while training; None keeps the current count


# epochs and learning rate of each embedded model: enough for a usable digits classifier in well under a minute
_DEFAULTS: dict[str, dict[str, Any]] = {
    "vit-digits": {"epochs": 30, "lr": 1e-3},
    "resnet-digits": {"epochs": 12, "lr": 3e-3},
}


def _resolved(name: str, config: TrainConfig | None) -> TrainConfig:
    """Return `config` with None epochs/lr replaced by the defaults of model `name`."""
    cfg = replace(config) if config else TrainConfig()
    for key, value in _DEFAULTS[name].items():
        if getattr(cfg, key) is None:
            setattr(cfg, key, value)
    return cfg


# ---------------------------------------------------------------- models


def digits_processor():
    """Return the image processor both embedded models use: 32x32, one channel, mean/std 0.5."""
    from transformers.models.vit.image_processing_pil_vit import (
        ViTImageProcessorPil,
    )  # lazy: transformers; tools.models.loading loads this module without it

    return ViTImageProcessorPil(
        do_resize=True,
        size={"height": IMAGE_SIZE, "width": IMAGE_SIZE},
        do_rescale=True,
        rescale_factor=1 / 255,
        do_normalize=True,
        image_mean=[0.5],
        image_std=[0.5],
    )


def _label_maps() -> tuple[dict[int, str], dict[str, int]]:
    id2label = dict(enumerate(LABEL_NAMES))
    return id2label, {name: i for i, name in id2label.items()}


def build_architecture(name: str) -> torch.nn.Module:
    """Build an untrained embedded model by name ("vit-digits" or "resnet-digits")."""
    id2label, label2id = _label_maps()
    if name == "vit-digits":
        from transformers import (
            ViTConfig,
            ViTForImageClassification,
        )  # lazy: transformers; tools.models.loading loads this module without it

        config = ViTConfig(
            image_size=IMAGE_SIZE,
            patch_size=8,
            num_channels=1,
            hidden_size=64,
            num_hidden_layers=4,
            num_attention_heads=4,
            intermediate_size=256,
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
            id2label=id2label,
            label2id=label2id,
        )
        return ViTForImageClassification(config)
    if name == "resnet-digits":
        from transformers import (
            ResNetConfig,
            ResNetForImageClassification,
        )  # lazy: transformers; tools.models.loading loads this module without it

        resnet_config = ResNetConfig(
            num_channels=1,
            embedding_size=16,
            hidden_sizes=[64, 128, 256],
            depths=[1, 2, 1],
            layer_type="bottleneck",
            downsample_in_first_stage=False,
            id2label=id2label,
            label2id=label2id,
        )
        return ResNetForImageClassification(resnet_config)
    raise ValueError(f"unknown embedded model {name!r}; choose from {', '.join(MODEL_NAMES)}")


def split_pixels(split, processor) -> tuple[torch.Tensor, torch.Tensor]:
    """Preprocess a digits split with the model's own processor into (N,1,H,W) floats and labels."""
    images = [img.convert("L") for img in split["image"]]
    pixels = processor(images=images, return_tensors="pt")["pixel_values"].float()
    return pixels, torch.tensor(split["label"], dtype=torch.long)


def _augment(x: torch.Tensor, shift: int, gen: torch.Generator) -> torch.Tensor:
    """Translate each image of a (N,C,H,W) batch by a random offset of up to +-shift pixels."""
    n, _, height, width = x.shape
    background = float(x.amin())  # the normalized value of a black pixel
    padded = F.pad(x, (shift, shift, shift, shift), value=background)
    dy = torch.randint(0, 2 * shift + 1, (n,), generator=gen)
    dx = torch.randint(0, 2 * shift + 1, (n,), generator=gen)
    rows = (dy[:, None] + torch.arange(height)[None])[:, None, :, None]
    cols = (dx[:, None] + torch.arange(width)[None])[:, None, None, :]
    batch = torch.arange(n)[:, None, None, None]
    chans = torch.arange(x.shape[1])[None, :, None, None]
    return padded[batch, chans, rows, cols]


PROGRESS_SECONDS = 10.0  # seconds between progress log lines while an embedded model trains


def _train(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, cfg: TrainConfig, name: str = "") -> None:
    """Train `model` in place with AdamW and a warm-up + cosine schedule.

    Logs its progress (INFO, about every PROGRESS_SECONDS) and honours a stop request between steps.

    Raises:
        tools.interrupt.Interrupted: A stop was requested (Ctrl-C); nothing is saved.
    """
    began = last_log = time.perf_counter()

    def log(step: int, total: int, epoch: int, loss: torch.Tensor) -> None:
        nonlocal last_log
        now = time.perf_counter()
        if now - last_log >= PROGRESS_SECONDS:
            last_log, spent = now, now - began
            logger.info(
                "training %s: %d%% (epoch %d/%d, loss %.3f), %.0f s so far, about %.0f s left",
                name or "the model",
                100 * step // total,
                epoch + 1,
                cfg.epochs,
                float(loss.detach()),
                spent,
                spent * (total - step) / step,
            )

    schedule = (int(cfg.epochs or 0), cfg.batch_size, float(cfg.lr or 0.0), cfg.weight_decay, cfg.warmup_fraction)
    augment = (lambda xb, gen: _augment(xb, cfg.shift, gen)) if cfg.shift > 0 else None
    train_classifier(model, x, y, schedule=schedule, seed=cfg.seed, augment=augment, on_step=log)


def accuracy(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int = 256) -> float:
    """Return top-1 accuracy in percent of `model` on preprocessed pixels `x` and labels `y`."""
    model.eval()
    correct = 0
    with torch.inference_mode():
        for start in range(0, len(x), batch_size):
            logits = model(pixel_values=x[start : start + batch_size]).logits
            correct += int((logits.argmax(-1) == y[start : start + batch_size]).sum())
    return 100.0 * correct / max(1, len(x))


@contextlib.contextmanager
def _threads(count: int | None) -> Iterator[int]:
    previous = torch.get_num_threads()
    if count:
        torch.set_num_threads(count)
    try:
        yield torch.get_num_threads()
    finally:
        torch.set_num_threads(previous)


def build_model(name: str, out_dir: str | os.PathLike, config: TrainConfig | None = None) -> dict[str, Any]:
    """Train an embedded model on the digits train split and save it (with processor) to `out_dir`.

    The folder is written atomically and holds the save_pretrained model, its image processor and a
    training.json with the schedule, wall time, test accuracy, seed and library versions.

    Args:
        name: "vit-digits" or "resnet-digits".
        out_dir: Destination folder (replaced as a whole).
        config: Training schedule; None uses the shipped defaults.

    Returns:
        The training record also written to training.json.
    """
    if name not in MODEL_NAMES:
        raise ValueError(f"unknown embedded model {name!r}; choose from {', '.join(MODEL_NAMES)}")
    cfg = _resolved(name, config)
    torch.manual_seed(cfg.seed)
    return train_model(build_architecture(name), out_dir, cfg, name)


def train_model(
    model: torch.nn.Module, out_dir: str | os.PathLike, config: TrainConfig, name: str = "custom"
) -> dict[str, Any]:
    """Train any 10-class image classifier on the digits train split and save it like `build_model`.

    The model must take `pixel_values` of shape (N, 1, 32, 32) and return `.logits` for 10 classes (e.g. a
    DeiT or Swin built from a config with num_channels=1, image_size=32). Its config's label maps are set to
    the digit names, so the saved folder maps onto the digits dataset exactly.

    Args:
        model: The untrained model (trained in place, left in eval mode).
        out_dir: Destination folder (replaced as a whole): save_pretrained model, processor, training.json.
        config: Training schedule; `epochs` and `lr` must be set (there are no defaults for arbitrary models).
        name: Name recorded in training.json.

    Returns:
        The training record also written to training.json.

    Raises:
        ValueError: `config.epochs` or `config.lr` is missing, or the model does not have 10 labels.
    """
    from datasets import load_from_disk  # lazy: datasets; tools.models.loading loads this module without it

    if config.epochs is None or config.lr is None:
        raise ValueError("train_model needs config.epochs and config.lr")
    hf_model: Any = model  # a transformers classifier: config and save_pretrained are not nn.Module's
    labels = getattr(hf_model.config, "num_labels", None)
    if labels != len(LABEL_NAMES):
        raise ValueError(f"the model must have {len(LABEL_NAMES)} labels, not {labels}")
    hf_model.config.id2label, hf_model.config.label2id = _label_maps()
    splits = load_from_disk(str(ensure_dataset()))
    processor = digits_processor()
    x_train, y_train = split_pixels(splits["train"], processor)
    if config.max_train is not None and config.max_train < len(x_train):
        keep = torch.randperm(len(x_train), generator=torch.Generator().manual_seed(config.seed))[: config.max_train]
        x_train, y_train = x_train[keep], y_train[keep]
    x_test, y_test = split_pixels(splits["test"], processor)
    with _threads(config.threads) as threads:
        start = time.perf_counter()
        _train(model, x_train, y_train, config, name)
        seconds = time.perf_counter() - start
        test_acc = accuracy(model, x_test, y_test)
    record = {
        "name": name,
        "architecture": type(model).__name__,
        "params": sum(p.numel() for p in model.parameters()),
        "epochs": config.epochs,
        "seconds": round(seconds, 2),
        "threads": threads,
        "train_samples": len(x_train),
        "test_samples": len(x_test),
        "test_accuracy": round(test_acc, 2),
        "seed": config.seed,
        "config": asdict(config),
        "dataset": f"embedded:{DATASET_NAME}",
        "versions": versions("datasets", "scikit-learn"),
    }
    with atomic_dir(out_dir) as tmp, quiet_hf():
        hf_model.save_pretrained(tmp)
        processor.save_pretrained(tmp)
        write_json_atomic(tmp / _MODEL_MARKER, record)
    logger.info("trained %s: %.1f%% test accuracy in %.1f s", name, test_acc, seconds)
    return record


def model_path(name: str) -> Path:
    """Return where the embedded model `name` lives (it may not be built yet)."""
    return cache_dir() / "models" / name


def ensure_model(name: str, force: bool = False, config: TrainConfig | None = None) -> Path:
    """Train the embedded model `name` once (cached) and return its save_pretrained folder.

    Args:
        name: "vit-digits" or "resnet-digits".
        force: Retrain even when a complete copy is cached.
        config: Training schedule; None uses the shipped defaults.

    Returns:
        cache_dir()/models/NAME, holding config.json, model.safetensors, preprocessor_config.json and
        training.json.

    Raises:
        ValueError: `name` is not an embedded model.
    """
    if name not in MODEL_NAMES:
        raise ValueError(f"unknown embedded model {name!r}; choose from {', '.join(MODEL_NAMES)}")
    target = model_path(name)
    if not force and (target / _MODEL_MARKER).exists():
        return target
    with file_lock(f"model-{name}"):
        if force or not (target / _MODEL_MARKER).exists():
            logger.info("training the embedded model %s (first use, once; a few minutes) into %s", name, target)
            build_model(name, target, config)
    return target


def training_record(path: str | os.PathLike) -> dict[str, Any]:
    """Read the training.json of an embedded model folder."""
    return json.loads((Path(path) / _MODEL_MARKER).read_text(encoding="utf-8"))


def main(argv: list[str] | None = None) -> int:
    """Build the embedded dataset and models (the script that trains them)."""
    parser = argparse.ArgumentParser(
        prog="python -m profiling_agent.tools.models.embedded",
        description="Build the embedded digits dataset and models.",
    )
    parser.add_argument("names", nargs="*", metavar="NAME", help=f"models to build (default: {' '.join(MODEL_NAMES)})")
    parser.add_argument("--force", action="store_true", help="rebuild even when cached")
    args = parser.parse_args(argv)
    unknown = [name for name in args.names if name not in MODEL_NAMES]
    if unknown:
        parser.error(f"unknown model {unknown[0]!r}; choose from {', '.join(MODEL_NAMES)}")
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    data = ensure_dataset(force=args.force)
    print(f"dataset  embedded:{DATASET_NAME}  {data}")
    for name in args.names or MODEL_NAMES:
        path = ensure_model(name, force=args.force)
        rec = training_record(path)
        print(
            f"model    embedded:{name}  acc={rec['test_accuracy']:.2f}%  epochs={rec['epochs']}  "
            f"train={rec['seconds']:.1f}s  threads={rec['threads']}  params={rec['params']:,}  {path}"
        )
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
