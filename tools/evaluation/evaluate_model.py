"""Evaluate one model outside a run: the `profiling-agent evaluate` command's work as a pure function."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from profiling_agent.tools.models.loading import LoadedModel

EVAL_BATCH = 64  # accuracy batch, as in a run (dynamically quantized forms' accuracy depends on it: recorded)


def evaluate_model(
    model_ref: str,
    dataset_ref: str,
    *,
    split: str = "test",
    subset: int = 512,
    rows: list[int] | None = None,
    seed: int = 0,
    image_column: str | None = None,
    label_column: str | None = None,
    device: str = "auto",
    work_dir: Path,
    warmup: int = 3,
    repeats: int = 15,
    latency_batch: int = 16,
) -> dict[str, Any]:
    """Load a model (hub id, folder, or saved artifact) and measure it on a seeded subset of a dataset.

    `rows` (row numbers of `split`, e.g. a run's held-out test images from its subsets.json) replaces the
    seeded subset: exactly those images are evaluated.

    Returns accuracy, latency (batch 1 and `latency_batch`), parameter and buffer bytes, weights size,
    params and MACs, with the label-mapping method, as plain JSON values.
    """
    import torch

    from profiling_agent.tools.data.labels import map_labels, wnids_from_config
    from profiling_agent.tools.data.prepare import SubsetSpec, prepare_images
    from profiling_agent.tools.data.sources import detect_columns, label_names, load_split
    from profiling_agent.tools.data.stream import open_prepared
    from profiling_agent.tools.device import measure_device
    from profiling_agent.tools.evaluation.metrics import accuracy_batch
    from profiling_agent.tools.evaluation.variants import measure_forms
    from profiling_agent.tools.models.artifacts import is_artifact
    from profiling_agent.tools.models.input_shape import resolve_input_shape, verify_input_shape
    from profiling_agent.tools.models.loading import load_model
    from profiling_agent.tools.models.sizes import count_params, state_bytes

    loaded = load_model(model_ref)
    model = loaded.model
    shape = resolve_input_shape(model, loaded.processor)
    verify_input_shape(model, shape)
    dataset = load_split(dataset_ref, split)
    if rows is not None:
        if not rows or max(rows) >= len(dataset) or min(rows) < 0:
            raise ValueError(f"rows must be row numbers of {dataset_ref}:{split} (0..{len(dataset) - 1})")
        dataset, subset = dataset.select(rows), len(rows)
    image_col, label_col = detect_columns(dataset, image_column, label_column)
    names = label_names(dataset, label_col)
    config: Any = model.config  # a transformers PretrainedConfig
    id2label = {int(k): str(v) for k, v in (config.id2label or {}).items()}
    mapping = map_labels(names, id2label, model_wnids=wnids_from_config(config))
    prepared = prepare_images(
        dataset,
        loaded.processor,
        shape,
        mapping,
        out_path=work_dir / "data.safetensors",
        spec=SubsetSpec(subset=subset, calibration=0, seed=seed, image_column=image_col, label_column=label_col),
    )
    tensors = open_prepared(prepared["path"], {"eval": dataset, "calib": dataset}, loaded.processor)
    quantized = any("quantized" in type(m).__module__ for m in model.modules())
    onnx = loaded.source in ("onnx", "openvino")  # a runtime's form: CPU, sizes and counts from its recipe
    dev = measure_device(device, quantized=quantized or onnx)
    model = model.to(dev)
    measured, timing = measure_forms(  # the measurement of a run's baseline and candidates, for one model
        {"baseline": model},
        tensors["eval_pixels"],
        tensors["eval_labels"],
        batch_size=latency_batch,
        eval_batch=EVAL_BATCH,
        warmup=warmup,
        repeats=repeats,
        device=dev,
        allowed_ids=mapping.get("allowed_ids"),
    )
    lat = measured["baseline"]
    weights = Path(loaded.path) / "model.safetensors" if loaded.path and is_artifact(loaded.path) else None
    if onnx:
        weights = Path(loaded.path) / ("model.onnx" if loaded.source == "onnx" else "openvino_model.bin")
    if weights is None and loaded.path and Path(loaded.path).is_dir():
        files = list(Path(loaded.path).glob("*.safetensors")) + list(Path(loaded.path).glob("*.bin"))
        size_mb = sum(f.stat().st_size for f in files) / 1e6 if files else None
    else:
        size_mb = weights.stat().st_size / 1e6 if weights and weights.exists() else None
    macs = model_macs(loaded, (shape["channels"], shape["height"], shape["width"]))
    extra = ((loaded.info.get("recipe") or {}).get("extra") or {}) if onnx else {}
    return {
        "model": model_ref,
        "dataset": f"{dataset_ref}:{split}",
        "n_samples": int(len(tensors["eval_labels"])),
        "accuracy": lat["accuracy"],
        "latency_ms": lat["latency_ms"],
        "latency_batch_ms": lat["latency_batch_ms"],
        "batch_size": latency_batch,
        "eval_batch": accuracy_batch(EVAL_BATCH, dev),
        "timing": timing,
        "threads": torch.get_num_threads(),
        "device": dev,
        "memory_bytes": state_bytes(model) or (weights.stat().st_size if onnx and weights else 0),
        "size_mb": size_mb,
        "params": int(extra.get("params") or 0) if onnx else count_params(model),
        "backend": f"{'onnxruntime' if loaded.source == 'onnx' else 'openvino'} "
        f"({(loaded.info['recipe'] or {}).get('method')})"
        if onnx
        else "torch",
        "macs": macs,
        "label_mapping": mapping["method"],
        "restricted": bool(mapping.get("restricted")),
    }


def model_macs(loaded: LoadedModel, chw: tuple[int, int, int]) -> int | None:
    """Count one image's MACs; when ptflops cannot (some quantized modules), use what the artifact recorded."""
    from profiling_agent.tools.profiling.static import static_profile

    if loaded.source in (
        "onnx",
        "openvino",
    ):  # no torch modules to count: the MACs the run recorded for this architecture
        return int(((loaded.info.get("recipe") or {}).get("extra") or {}).get("macs") or 0) or None
    try:
        return int(static_profile(loaded.model.to("cpu"), chw)["total_macs"])
    except Exception:  # noqa: BLE001 - ptflops fails in many ways on modules it does not know
        recipe = loaded.info.get("recipe") or {}
        return int((recipe.get("extra") or {}).get("macs", 0)) or None
