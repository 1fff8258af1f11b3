"""Evaluate one model outside a run: the `profiling-agent evaluate` command's work as a pure function."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from profiling_agent.tools.data.labels import map_labels, wnids_from_config
from profiling_agent.tools.data.prepare import SubsetSpec, prepare_images
from profiling_agent.tools.data.sources import detect_columns, label_names, load_split
from profiling_agent.tools.data.stream import open_prepared
from profiling_agent.tools.device import measure_device
from profiling_agent.tools.evaluation.metrics import accuracy_batch
from profiling_agent.tools.evaluation.records import EvalImages, MeasureSettings
from profiling_agent.tools.evaluation.variants import measure_forms
from profiling_agent.tools.models.artifacts import is_artifact
from profiling_agent.tools.models.input_shape import resolve_input_shape, verify_input_shape
from profiling_agent.tools.models.loading import LoadedModel, load_model
from profiling_agent.tools.models.sizes import count_params, state_bytes
from profiling_agent.tools.profiling import static

EVAL_BATCH = 64  # accuracy batch, as in a run (dynamically quantized forms' accuracy depends on it: recorded)


@dataclass(frozen=True)
class EvalRequest:
    """What `evaluate_model` measures and how.

    Attributes:
        model_ref: A hub id, a model folder, or a saved artifact (torch, ONNX Runtime or OpenVINO form).
        dataset_ref: The dataset (hub id or folder).
        work_dir: Folder for the prepared images.
        split: The dataset's split.
        subset: Seeded images to evaluate (0: the whole split).
        rows: Row numbers of `split` (e.g. a run's held-out test images): exactly those images, not a subset.
        seed: Seed of the subset.
        image_column: The image column (None: detected).
        label_column: The label column (None: detected).
        device: cpu, cuda or auto.
        warmup: Warm-up passes before timing.
        repeats: Timed repeats (median reported).
        latency_batch: The larger latency batch.
    """

    model_ref: str
    dataset_ref: str
    work_dir: Path
    split: str = "test"
    subset: int = 512
    rows: list[int] | None = None
    seed: int = 0
    image_column: str | None = None
    label_column: str | None = None
    device: str = "auto"
    warmup: int = 3
    repeats: int = 15
    latency_batch: int = 16


@dataclass(frozen=True)
class _Prepared:
    loaded: LoadedModel
    shape: dict[str, Any]
    mapping: dict[str, Any]
    tensors: dict[str, Any]


def evaluate_model(request: EvalRequest) -> dict[str, Any]:
    """Load a model (hub id, folder, or saved artifact) and measure it on a seeded subset of a dataset.

    `request.rows` (row numbers of its split, e.g. a run's held-out test images from its subsets.json) replaces
    the seeded subset: exactly those images are evaluated.

    Returns accuracy, latency (batch 1 and `latency_batch`), parameter and buffer bytes, weights size,
    params and MACs, with the label-mapping method, as plain JSON values.
    """
    ready = prepare_model_images(request)
    loaded = ready.loaded
    quantized = any("quantized" in type(m).__module__ for m in loaded.model.modules())
    onnx = loaded.source in ("onnx", "openvino")  # a runtime's form: CPU, sizes and counts from its recipe
    dev = measure_device(request.device, quantized=quantized or onnx)
    model = loaded.model.to(dev)
    images = EvalImages(ready.tensors["eval_pixels"], ready.tensors["eval_labels"])
    settings = MeasureSettings(
        latency_batch=request.latency_batch,
        eval_batch=EVAL_BATCH,
        warmup=request.warmup,
        repeats=request.repeats,
        device=dev,
        allowed_ids=ready.mapping.get("allowed_ids"),
    )
    # the measurement of a run's baseline and candidates, for one model
    measured, timing = measure_forms({"baseline": model}, images, settings)
    return model_metrics(request, ready, model, measured["baseline"], timing, dev)


def prepare_model_images(request: EvalRequest) -> _Prepared:
    """Load the model, check its input shape, map the dataset's labels and prepare the images it is measured on."""
    loaded = load_model(request.model_ref)
    shape = resolve_input_shape(loaded.model, loaded.processor)
    verify_input_shape(loaded.model, shape)
    dataset, subset, rows = load_split(request.dataset_ref, request.split), request.subset, request.rows
    if rows is not None:
        if not rows or max(rows) >= len(dataset) or min(rows) < 0:
            where = f"{request.dataset_ref}:{request.split}"
            raise ValueError(f"rows must be row numbers of {where} (0..{len(dataset) - 1})")
        dataset, subset = dataset.select(rows), len(rows)
    image_col, label_col = detect_columns(dataset, request.image_column, request.label_column)
    names = label_names(dataset, label_col)
    config: Any = loaded.model.config  # a transformers PretrainedConfig
    id2label = {int(k): str(v) for k, v in (config.id2label or {}).items()}
    mapping = map_labels(names, id2label, model_wnids=wnids_from_config(config))
    prepared = prepare_images(
        dataset,
        loaded.processor,
        shape,
        mapping,
        out_path=request.work_dir / "data.safetensors",
        spec=SubsetSpec(
            subset=subset, calibration=0, seed=request.seed, image_column=image_col, label_column=label_col
        ),
    )
    tensors = open_prepared(prepared["path"], {"eval": dataset, "calib": dataset}, loaded.processor)
    return _Prepared(loaded=loaded, shape=shape, mapping=mapping, tensors=tensors)


def weights_size(loaded: LoadedModel) -> tuple[Path | None, float | None]:
    """Return the model's weights file (None: several or none) and the MB of its weights on disk."""
    weights = Path(loaded.path) / "model.safetensors" if loaded.path and is_artifact(loaded.path) else None
    if loaded.source in ("onnx", "openvino"):
        weights = Path(loaded.path) / ("model.onnx" if loaded.source == "onnx" else "openvino_model.bin")
    if weights is None and loaded.path and Path(loaded.path).is_dir():
        files = list(Path(loaded.path).glob("*.safetensors")) + list(Path(loaded.path).glob("*.bin"))
        return weights, sum(f.stat().st_size for f in files) / 1e6 if files else None
    return weights, weights.stat().st_size / 1e6 if weights and weights.exists() else None


def model_metrics(
    request: EvalRequest,
    ready: _Prepared,
    model: Any,
    lat: dict[str, Any],
    timing: dict[str, Any],
    dev: str,
) -> dict[str, Any]:
    """Return `evaluate_model`'s JSON record: accuracy, latencies, sizes, counts and the label mapping."""
    loaded, shape, mapping = ready.loaded, ready.shape, ready.mapping
    onnx = loaded.source in ("onnx", "openvino")
    weights, size_mb = weights_size(loaded)
    macs = model_macs(loaded, (shape["channels"], shape["height"], shape["width"]))
    extra = ((loaded.info.get("recipe") or {}).get("extra") or {}) if onnx else {}
    runtime = "onnxruntime" if loaded.source == "onnx" else "openvino"
    return {
        "model": request.model_ref,
        "dataset": f"{request.dataset_ref}:{request.split}",
        "n_samples": int(len(ready.tensors["eval_labels"])),
        "accuracy": lat["accuracy"],
        "latency_ms": lat["latency_ms"],
        "latency_batch_ms": lat["latency_batch_ms"],
        "batch_size": request.latency_batch,
        "eval_batch": accuracy_batch(EVAL_BATCH, dev),
        "timing": timing,
        "threads": torch.get_num_threads(),
        "device": dev,
        "memory_bytes": state_bytes(model) or (weights.stat().st_size if onnx and weights else 0),
        "size_mb": size_mb,
        "params": int(extra.get("params") or 0) if onnx else count_params(model),
        "backend": f"{runtime} ({(loaded.info['recipe'] or {}).get('method')})" if onnx else "torch",
        "macs": macs,
        "label_mapping": mapping["method"],
        "restricted": bool(mapping.get("restricted")),
    }


def model_macs(loaded: LoadedModel, chw: tuple[int, int, int]) -> int | None:
    """Count one image's MACs; when ptflops cannot (some quantized modules), use what the artifact recorded."""
    if loaded.source in ("onnx", "openvino"):  # no torch modules to count: the MACs the run recorded
        return int(((loaded.info.get("recipe") or {}).get("extra") or {}).get("macs") or 0) or None
    try:
        return int(static.static_profile(loaded.model.to("cpu"), chw)["total_macs"])
    except Exception:  # noqa: BLE001 - ptflops fails in many ways on modules it does not know
        recipe = loaded.info.get("recipe") or {}
        return int((recipe.get("extra") or {}).get("macs", 0)) or None
