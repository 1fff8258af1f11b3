"""Load image classifiers: embedded, saved artifact, local save_pretrained folder or hub id."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from safetensors import safe_open
from torch import nn

from profiling_agent.tools.hub import EMBEDDED_PREFIX, ModelLoadError, hub_offline, hub_probe, looks_like_path, quiet_hf
from profiling_agent.tools.models import embedded
from profiling_agent.tools.models.artifact_load import load_artifact, load_processor
from profiling_agent.tools.models.artifacts import is_artifact
from profiling_agent.tools.runtimes.forms import form_source, load_form
from profiling_agent.tools.text import one_line

logger = logging.getLogger(__name__)

Source = Literal["embedded", "artifact", "onnx", "openvino", "local", "hub"]


@dataclass
class LoadedModel:
    """A loaded image classifier in eval mode, its processor and where it came from.

    Attributes:
        model: The classifier (eval mode, CPU).
        processor: Its image processor, or None when the source has none.
        source: "embedded", "artifact", "onnx" (an ONNX Runtime folder), "openvino" (an IR folder), "local" or "hub".
        path: The resolved folder (embedded, artifact, local) or the hub id.
        info: Extra facts: the artifact recipe, the embedded training record, the hub revision.
    """

    model: nn.Module
    processor: Any | None
    source: Source
    path: str
    info: dict[str, Any] = field(default_factory=dict)


# ---------------------------------------------------------------- loading


def _load_processor(source: str, **kwargs: Any) -> Any | None:
    """Load the image processor of `source`, or return None with a warning when there is none."""
    from transformers import AutoImageProcessor  # lazy: transformers; nodes.acquire loads this module without it
    from transformers.utils import (
        is_torchvision_available,
    )  # lazy: transformers; nodes.acquire loads this module without it

    backend = None if is_torchvision_available() else "pil"  # without torchvision: PIL processors, no warning
    try:
        with quiet_hf():
            return AutoImageProcessor.from_pretrained(source, backend=backend, **kwargs)
    except Exception as err:  # noqa: BLE001 - a missing processor is allowed
        logger.warning(
            "no image processor for %s (%s); inputs will be resized and normalized with 0.5/0.5", source, one_line(err)
        )
        return None


def _check_config(ref: str, source: str, trust_remote_code: bool, **kwargs: Any) -> Any:
    """Load `source`'s config and check it describes an image classifier."""
    from transformers import AutoConfig  # lazy: transformers; nodes.acquire loads this module without it
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING,
    )  # lazy: transformers; nodes.acquire loads this module without it

    try:
        with quiet_hf():
            config = AutoConfig.from_pretrained(source, trust_remote_code=trust_remote_code, **kwargs)
    except ValueError as err:
        text = str(err)
        if "trust_remote_code" in text:
            raise ModelLoadError(
                f"{ref} needs custom modelling code from its repository; pass trust_remote_code=True "
                "(--trust-remote-code) only if you trust it"
            ) from None
        if "Unrecognized model" in text or "model_type" in text:
            raise ModelLoadError(f"{ref} is not a transformers model: config.json has no known model_type") from None
        raise ModelLoadError(f"cannot read the config of {ref}: {one_line(err)}") from None
    except OSError as err:
        raise ModelLoadError(f"cannot read the config of {ref}: {one_line(err)}") from None
    remote = "AutoModelForImageClassification" in (getattr(config, "auto_map", None) or {})
    if type(config) not in MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING and not (remote and trust_remote_code):
        if remote:
            raise ModelLoadError(
                f"{ref} needs custom modelling code from its repository; pass trust_remote_code=True "
                "(--trust-remote-code) only if you trust it"
            )
        raise ModelLoadError(
            f"{ref} is not an image classifier: model type '{config.model_type}' has no "
            "AutoModelForImageClassification class"
        )
    return config


def _load_transformers(ref: str, source: str, *, trust_remote_code: bool, **kwargs: Any) -> tuple[nn.Module, Any]:
    """Load model and processor from a local folder or hub id with the Auto classes, checking the head."""
    from transformers import (
        AutoModelForImageClassification,
    )  # lazy: transformers; nodes.acquire loads this module without it

    config = _check_config(ref, source, trust_remote_code, **kwargs)
    try:
        with quiet_hf():
            model, info = AutoModelForImageClassification.from_pretrained(
                source, config=config, trust_remote_code=trust_remote_code, output_loading_info=True, **kwargs
            )
    except MemoryError:
        raise
    except Exception as err:  # noqa: BLE001 - safetensors, torch and transformers each raise their own types
        raise ModelLoadError(f"cannot load the weights {weights_named(source, ref)}: {one_line(err)}") from None
    _check_missing(ref, model, list(info.get("missing_keys") or []))
    model.eval()
    return model, _load_processor(source, trust_remote_code=trust_remote_code, **kwargs)


def weights_named(source: str, ref: str) -> str:
    """Name the weights file a failed load came from: the first unreadable safetensors file of a local folder.

    Returns "<file> (corrupt or truncated)" when one does not open, "of <ref>" otherwise (a hub id, a .bin file).
    """
    folder = Path(source)
    if not folder.is_dir():
        return f"of {ref}"

    for file in sorted(folder.glob("*.safetensors")):
        try:
            with safe_open(str(file), framework="pt") as handle:
                handle.keys()
        except Exception:  # noqa: BLE001 - safetensors' own error type: a bad header or a short file
            return f"{file} (corrupt or truncated)"
    return f"of {ref}"


def _head_names(model: nn.Module) -> list[str]:
    """Return the names of the Linear layers producing num_labels outputs (the classification head)."""
    num_labels = getattr(getattr(model, "config", None), "num_labels", None)
    return [
        name for name, mod in model.named_modules() if isinstance(mod, nn.Linear) and mod.out_features == num_labels
    ]


def _check_missing(ref: str, model: nn.Module, missing: list[str]) -> None:
    """Raise when the classification head was not in the checkpoint; log other missing tensors."""
    if not missing:
        return
    heads = _head_names(model)
    head_missing = sorted(k for k in missing if any(k == h or k.startswith(h + ".") for h in heads))
    if head_missing:
        raise ModelLoadError(
            f"{ref} has no trained classification head ({head_missing[0]} is not in the checkpoint): "
            "use a checkpoint fine-tuned for image classification"
        )
    logger.warning(
        "%s: %d tensors were not in the checkpoint and are freshly initialized (e.g. %s)",
        ref,
        len(missing),
        sorted(missing)[0],
    )


def _load_embedded(ref: str) -> LoadedModel:
    """Build (first use) and load one of the embedded digits models."""
    name = ref[len(EMBEDDED_PREFIX) :]
    if name not in embedded.MODEL_NAMES:
        raise ModelLoadError(f"unknown embedded model '{name}'; choose from {', '.join(embedded.MODEL_NAMES)}")
    path = embedded.ensure_model(name)
    model, processor = _load_transformers(ref, str(path), trust_remote_code=False, local_files_only=True)
    return LoadedModel(model, processor, "embedded", str(path), {"training": embedded.training_record(path)})


def _load_artifact(ref: str, path: Path) -> LoadedModel:
    """Load a profiling-agent artifact folder through tools.artifacts."""
    try:
        loaded = load_artifact(path)
    except Exception as err:  # noqa: BLE001 - any failure becomes a one-line user message
        raise ModelLoadError(f"cannot load artifact {ref}: {one_line(err)}") from None
    loaded.model.eval()
    return LoadedModel(loaded.model, loaded.processor, "artifact", str(path), {"recipe": loaded.recipe})


def _load_runtime_folder(ref: str, path: Path, source: Literal["onnx", "openvino"]) -> LoadedModel:
    """Open an ONNX (model.onnx) or OpenVINO (openvino_model.xml) folder with its recipe and processor."""
    label = "ONNX" if source == "onnx" else "OpenVINO"
    try:
        model = load_form(path)
        processor = load_processor(path)
    except Exception as err:  # noqa: BLE001 - any failure becomes a one-line user message
        raise ModelLoadError(f"cannot load {label} model {ref}: {one_line(err)}") from None
    return LoadedModel(model, processor, source, str(path), {"recipe": model.recipe})


def _load_local(ref: str, path: Path, trust_remote_code: bool) -> LoadedModel:
    """Load a save_pretrained folder."""
    if not path.is_dir():
        raise ModelLoadError(f"{ref} is a file, not a model folder")
    if not (path / "config.json").is_file():
        raise ModelLoadError(f"{ref} is not a model folder (no config.json)")
    model, processor = _load_transformers(ref, str(path), trust_remote_code=trust_remote_code, local_files_only=True)
    return LoadedModel(model, processor, "local", str(path))


def _load_hub(ref: str, revision: str | None, trust_remote_code: bool) -> LoadedModel:
    """Load a hub id, from the local cache only when offline or when the hub cannot be reached."""
    why: str | None
    if hub_offline():
        why = "offline mode is on (HF_HUB_OFFLINE)"
    else:
        error = hub_probe("model", ref, ModelLoadError, revision)
        why = f"the hub is unreachable ({error})" if error else None
    kwargs: dict[str, Any] = {"revision": revision}
    if why:
        kwargs["local_files_only"] = True
    try:
        model, processor = _load_transformers(ref, ref, trust_remote_code=trust_remote_code, **kwargs)
    except ModelLoadError as err:
        if why and "cannot read the config" in str(err):
            raise ModelLoadError(f"cannot fetch hub model {ref}: {why} and it is not in the local cache") from None
        raise
    return LoadedModel(model, processor, "hub", ref, {"revision": revision, "offline": bool(why)})


def load_model(ref: str, *, revision: str | None = None, trust_remote_code: bool = False) -> LoadedModel:
    """Load an image classifier and its processor from any supported reference.

    Args:
        ref: "embedded:vit-digits" / "embedded:resnet-digits" (trained on first use), a profiling-agent
            artifact folder (with recipe.json), an ONNX folder a run delivered (model.onnx + recipe.json), a
            local save_pretrained folder, or a hub id.
        revision: Hub revision (branch, tag or commit); ignored for local references.
        trust_remote_code: Allow custom modelling code from a hub repository.

    Returns:
        The model in eval mode, its processor (None with a logged warning when missing), the source
        kind and the resolved path or id.

    Raises:
        ModelLoadError: With a one-line reason: unknown embedded name, path not found, folder that is not
            a model, model that is not an image classifier, hub unreachable and not cached, custom code
            without trust_remote_code, incomplete checkpoint.
    """
    ref = (ref or "").strip()
    if not ref:
        raise ModelLoadError("empty model reference")
    if ref.startswith(EMBEDDED_PREFIX):
        return _load_embedded(ref)
    path = Path(ref).expanduser()
    if path.exists():
        source = form_source(path)
        if source is not None:
            return _load_runtime_folder(ref, path, source)
        if is_artifact(path):
            return _load_artifact(ref, path)
        return _load_local(ref, path, trust_remote_code)
    if looks_like_path(ref):
        raise ModelLoadError(f"model path not found: {ref}")
    return _load_hub(ref, revision, trust_remote_code)
