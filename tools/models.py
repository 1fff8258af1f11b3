"""Load image classifiers (embedded, artifact, local folder or hub id) and resolve their input shape."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn

logger = logging.getLogger(__name__)

EMBEDDED_PREFIX = "embedded:"
HUB_TIMEOUT_S = 10.0  # seconds to wait for the hub's metadata answer before giving up
DEFAULT_SIZE = 224  # guessed side length when neither processor nor config says anything
Source = Literal["embedded", "artifact", "local", "hub"]


class ModelLoadError(ValueError):
    """A model reference that cannot be loaded; the message is one line, shown to users as-is."""


@dataclass
class LoadedModel:
    """A loaded image classifier in eval mode, its processor and where it came from.

    Attributes:
        model: The classifier (eval mode, CPU).
        processor: Its image processor, or None when the source has none.
        source: "embedded", "artifact", "local" or "hub".
        path: The resolved folder (embedded, artifact, local) or the hub id.
        info: Extra facts: the artifact recipe, the embedded training record, the hub revision.
    """

    model: nn.Module
    processor: Any | None
    source: Source
    path: str
    info: dict[str, Any] = field(default_factory=dict)


def one_line(text: object, limit: int = 300) -> str:
    """Return the first non-empty line of `text`, cut to `limit` characters."""
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    first = lines[0] if lines else type(text).__name__
    return first if len(first) <= limit else first[: limit - 3] + "..."


@contextlib.contextmanager
def quiet_hf() -> Iterator[None]:
    """Silence transformers/datasets warnings and progress bars for the duration (restored afterwards)."""
    from datasets.utils import logging as ds_logging
    from transformers.utils import logging as tf_logging

    level = tf_logging.get_verbosity()
    ds_bar, tf_bar = ds_logging.is_progress_bar_enabled(), tf_logging.is_progress_bar_enabled()
    tf_logging.set_verbosity_error()
    ds_logging.disable_progress_bar()
    tf_logging.disable_progress_bar()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        tf_logging.set_verbosity(level)
        if ds_bar:
            ds_logging.enable_progress_bar()
        if tf_bar:
            tf_logging.enable_progress_bar()


# ---------------------------------------------------------------- reference kinds


def hub_offline() -> bool:
    """Return True when the Hugging Face hub must not be contacted (HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE)."""
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        if os.environ.get(var, "").strip().lower() in ("1", "true", "yes", "on"):
            return True
    return False


def looks_like_path(ref: str) -> bool:
    """Return True when `ref` is meant as a filesystem path rather than a hub id."""
    if ref.startswith(("/", "./", "../", "~", ".")) or "\\" in ref or re.match(r"^[A-Za-z]:", ref):
        return True
    if ref.count("/") > 1:
        return True
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(ref)
    except HFValidationError:
        return True
    return False


# ---------------------------------------------------------------- loading


def _load_processor(source: str, **kwargs: Any) -> Any | None:
    """Load the image processor of `source`, or return None with a warning when there is none."""
    from transformers import AutoImageProcessor
    from transformers.utils import is_torchvision_available

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
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING

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
    from transformers import AutoModelForImageClassification

    config = _check_config(ref, source, trust_remote_code, **kwargs)
    try:
        with quiet_hf():
            model, info = AutoModelForImageClassification.from_pretrained(
                source, config=config, trust_remote_code=trust_remote_code, output_loading_info=True, **kwargs
            )
    except (OSError, ValueError, RuntimeError, KeyError) as err:
        raise ModelLoadError(f"cannot load the weights of {ref}: {one_line(err)}") from None
    _check_missing(ref, model, list(info.get("missing_keys") or []))
    model.eval()
    return model, _load_processor(source, trust_remote_code=trust_remote_code, **kwargs)


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
    from profiling_agent.tools import embedded

    name = ref[len(EMBEDDED_PREFIX) :]
    if name not in embedded.MODEL_NAMES:
        raise ModelLoadError(f"unknown embedded model '{name}'; choose from {', '.join(embedded.MODEL_NAMES)}")
    path = embedded.ensure_model(name)
    model, processor = _load_transformers(ref, str(path), trust_remote_code=False, local_files_only=True)
    return LoadedModel(model, processor, "embedded", str(path), {"training": embedded.training_record(path)})


def _load_artifact(ref: str, path: Path) -> LoadedModel:
    """Load a profiling-agent artifact folder through tools.artifacts."""
    from profiling_agent.tools.artifacts import load_artifact

    try:
        loaded = load_artifact(path)
    except Exception as err:  # noqa: BLE001 - any failure becomes a one-line user message
        raise ModelLoadError(f"cannot load artifact {ref}: {one_line(err)}") from None
    loaded.model.eval()
    return LoadedModel(loaded.model, loaded.processor, "artifact", str(path), {"recipe": loaded.recipe})


def _load_local(ref: str, path: Path, trust_remote_code: bool) -> LoadedModel:
    """Load a save_pretrained folder."""
    if not path.is_dir():
        raise ModelLoadError(f"{ref} is a file, not a model folder")
    if not (path / "config.json").is_file():
        raise ModelLoadError(f"{ref} is not a model folder (no config.json)")
    model, processor = _load_transformers(ref, str(path), trust_remote_code=trust_remote_code, local_files_only=True)
    return LoadedModel(model, processor, "local", str(path))


def _hub_reachable(ref: str, revision: str | None) -> str | None:
    """Ask the hub about `ref` with a short timeout; return None when it answered, else why not.

    Raises:
        ModelLoadError: The hub answered that the repository or revision does not exist or is gated.
    """
    from huggingface_hub import model_info
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError

    try:
        model_info(ref, revision=revision, timeout=HUB_TIMEOUT_S)
    except GatedRepoError:
        raise ModelLoadError(f"hub model {ref} is gated: accept its terms and log in (hf auth login)") from None
    except RepositoryNotFoundError:
        raise ModelLoadError(f"hub model not found: {ref} (or it is private: log in with hf auth login)") from None
    except RevisionNotFoundError:
        raise ModelLoadError(f"hub model {ref} has no revision '{revision}'") from None
    except Exception as err:  # noqa: BLE001 - network failures of any kind
        return one_line(err, 120)
    return None


def _load_hub(ref: str, revision: str | None, trust_remote_code: bool) -> LoadedModel:
    """Load a hub id, from the local cache only when offline or when the hub cannot be reached."""
    if hub_offline():
        why = "offline mode is on (HF_HUB_OFFLINE)"
    else:
        error = _hub_reachable(ref, revision)
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
            artifact folder (with recipe.json), a local save_pretrained folder, or a hub id.
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
        from profiling_agent.tools.artifacts import is_artifact

        if is_artifact(path):
            return _load_artifact(ref, path)
        return _load_local(ref, path, trust_remote_code)
    if looks_like_path(ref):
        raise ModelLoadError(f"model path not found: {ref}")
    return _load_hub(ref, revision, trust_remote_code)


# ---------------------------------------------------------------- input shape


def _get(obj: Any, key: str) -> Any:
    """Read `key` from a dict-like or attribute-style size object (transformers' SizeDict)."""
    if obj is None:
        return None
    if isinstance(obj, Mapping):
        return obj.get(key)
    return getattr(obj, key, None)


def _int_or_none(value: Any) -> int | None:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 else None


def _processor_hw(processor: Any) -> tuple[tuple[int, int] | None, list[str]]:
    """Return the (height, width) the processor produces, and notes on how it was read."""
    notes: list[str] = []
    crop = getattr(processor, "crop_size", None)
    if getattr(processor, "do_center_crop", False) and crop is not None:
        height, width = _int_or_none(_get(crop, "height")), _int_or_none(_get(crop, "width"))
        if height and width:
            return (height, width), ["processor center-crops to crop_size"]
    if getattr(processor, "do_resize", True) is False:
        return None, ["processor does not resize (do_resize=False)"]
    size = getattr(processor, "size", None)
    if isinstance(size, (int, float)):
        return (int(size), int(size)), ["processor size is a single int"]
    height, width = _int_or_none(_get(size, "height")), _int_or_none(_get(size, "width"))
    if height and width:
        return (height, width), notes
    short = _int_or_none(_get(size, "shortest_edge"))
    if short:
        if getattr(processor, "crop_pct", None) is not None:
            return (short, short), ["processor resizes and crops to shortest_edge (crop_pct)"]
        return (short, short), ["processor sets only shortest_edge: non-square images keep their aspect ratio"]
    for key in ("longest_edge",):
        edge = _int_or_none(_get(size, key))
        if edge:
            return (edge, edge), [f"processor sets only {key}: assuming square inputs"]
    max_h, max_w = _int_or_none(_get(size, "max_height")), _int_or_none(_get(size, "max_width"))
    if max_h and max_w:
        return (max_h, max_w), ["processor sets max_height/max_width: assuming the maximum"]
    return None, ["processor size could not be read"]


def _config_hw(config: Any) -> tuple[int, int] | None:
    """Return (height, width) from config.image_size (int or pair), or None."""
    size = getattr(config, "image_size", None)
    if isinstance(size, (list, tuple)) and len(size) == 2 and all(_int_or_none(s) for s in size):
        return int(size[0]), int(size[1])
    side = _int_or_none(size)
    return (side, side) if side else None


def _processor_channels(processor: Any) -> int | None:
    mean = getattr(processor, "image_mean", None)
    if isinstance(mean, (list, tuple)) and len(mean) in (1, 3, 4):
        return len(mean)
    return None


def _resolve_channels(config: Any, processor: Any, notes: list[str]) -> tuple[int, bool]:
    """Return (channels, ambiguous) from config.num_channels and the processor's image_mean."""
    from_config = _int_or_none(getattr(config, "num_channels", None))
    from_proc = _processor_channels(processor) if processor is not None else None
    if from_config and from_proc and from_config != from_proc:
        notes.append(f"config num_channels={from_config} but processor image_mean has {from_proc} values")
        return from_config, True
    if from_config or from_proc:
        return from_config or from_proc, False
    notes.append("no channel count in config or processor: assuming 3")
    return 3, True


def resolve_input_shape(model: nn.Module, processor: Any | None) -> dict[str, Any]:
    """Resolve the (channels, height, width) a classifier expects from its processor and config.

    The config's image_size wins when both give one (it constrains the architecture, e.g. ViT position
    embeddings); any disagreement or missing information sets ambiguous=True and lists the alternatives
    in "candidates", so a caller can ask for help and check the answer with verify_input_shape.

    Args:
        model: A transformers image classifier (reads model.config).
        processor: Its image processor, or None.

    Returns:
        {"channels", "height", "width", "source": "processor+config" | "config" | "processor" | "default",
        "ambiguous": bool, "notes": [str], "candidates": [[c, h, w], ...]}.
    """
    config = getattr(model, "config", None)
    notes: list[str] = []
    channels, ambiguous = _resolve_channels(config, processor, notes)
    from_proc, proc_notes = _processor_hw(processor) if processor is not None else (None, ["no processor"])
    notes.extend(proc_notes)
    from_config = _config_hw(config)
    candidates: list[tuple[int, int]] = []
    if from_proc and from_config:
        source = "processor+config"
        if from_proc != from_config:
            ambiguous = True
            notes.append(
                f"processor gives {from_proc[0]}x{from_proc[1]}, config image_size {from_config[0]}x"
                f"{from_config[1]}: using the config's"
            )
        hw = from_config
        candidates = [from_config, from_proc]
    elif from_config or from_proc:
        source = "config" if from_config else "processor"
        hw = from_config or from_proc
        candidates = [hw]
    else:
        source, hw, ambiguous = "default", (DEFAULT_SIZE, DEFAULT_SIZE), True
        notes.append(f"no size in processor or config: assuming {DEFAULT_SIZE}x{DEFAULT_SIZE}")
        candidates = [hw]
    unique = list(dict.fromkeys(candidates))
    return {
        "channels": channels,
        "height": hw[0],
        "width": hw[1],
        "source": source,
        "ambiguous": ambiguous,
        "notes": notes,
        "candidates": [[channels, h, w] for h, w in unique],
    }


def _shape_tuple(shape: Mapping[str, Any] | Sequence[int]) -> tuple[int, int, int]:
    if isinstance(shape, Mapping):
        values = (shape.get("channels"), shape.get("height"), shape.get("width"))
    else:
        values = tuple(shape)
    if len(values) != 3 or not all(_int_or_none(v) for v in values):
        raise ValueError(f"input shape must be three positive ints (channels, height, width), got {shape!r}")
    return int(values[0]), int(values[1]), int(values[2])


def _input_dtype(model: nn.Module) -> torch.dtype:
    for param in model.parameters():
        if param.is_floating_point():
            return param.dtype
    return torch.float32


def _input_device(model: nn.Module) -> torch.device:
    for param in model.parameters():
        return param.device
    return torch.device("cpu")


def verify_input_shape(model: nn.Module, shape: Mapping[str, Any] | Sequence[int]) -> None:
    """Check with a real forward pass that `model` accepts a (1, C, H, W) zero batch and returns (1, num_labels).

    Args:
        model: The classifier (put in eval mode).
        shape: {"channels", "height", "width"} or (channels, height, width).

    Raises:
        ValueError: One-line reason: bad shape, the forward pass failed, or the logits have the wrong shape.
    """
    channels, height, width = _shape_tuple(shape)
    x = torch.zeros(1, channels, height, width, dtype=_input_dtype(model), device=_input_device(model))
    model.eval()
    try:
        with torch.inference_mode():
            out = model(pixel_values=x)
    except Exception as err:  # noqa: BLE001 - any failure is the answer
        raise ValueError(f"forward pass with input 1x{channels}x{height}x{width} failed: {one_line(err)}") from None
    logits = getattr(out, "logits", out)
    num_labels = getattr(getattr(model, "config", None), "num_labels", None)
    if not isinstance(logits, torch.Tensor) or logits.dim() != 2 or logits.shape[0] != 1:
        got = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
        raise ValueError(f"input 1x{channels}x{height}x{width} gives logits {got}, expected (1, num_labels)")
    if num_labels is not None and logits.shape[1] != num_labels:
        raise ValueError(
            f"input 1x{channels}x{height}x{width} gives logits {tuple(logits.shape)}, expected (1, {num_labels})"
        )
