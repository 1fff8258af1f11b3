"""Self-describing model artifacts: safetensors weights plus a JSON recipe, reloadable without pickle."""

from __future__ import annotations

import copy
import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import nn

from profiling_agent.tools.hub import quiet_hf
from profiling_agent.tools.io import atomic_dir, read_json, sha256_path, write_json_atomic
from profiling_agent.tools.models.dynamic_quant import (
    dynamic_linear_type,
)
from profiling_agent.tools.models.merged_tokens import token_schedule
from profiling_agent.tools.models.shortcut import SHORTCUT, replaced_blocks
from profiling_agent.tools.models.sizes import count_params, dynamic_linears, quantized_tensors, state_bytes
from profiling_agent.tools.versions import versions

logger = logging.getLogger(__name__)

FORMAT = "profiling-agent-artifact"
FORMAT_VERSION = 3  # 2: `replaced_blocks` (blocks replaced by their shortcut); 3: `token_schedule` (token merging)
WEIGHTS_FILE = "model.safetensors"
RECIPE_FILE = "recipe.json"
CONFIG_FILE = "config.json"
PROCESSOR_FILES = ("preprocessor_config.json", "processor_config.json")


class ArtifactError(RuntimeError):
    """A saved artifact is missing, incomplete, corrupt or of an unsupported format version."""


def first_line(err: BaseException) -> str:
    """Return the first non-empty line of an exception's message, or its type name."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return lines[0] if lines else type(err).__name__


def is_under(key: str, prefixes: Mapping[str, Any]) -> bool:
    """Return True when state-dict `key` belongs to one of the modules named in `prefixes`."""
    return any(key.startswith(f"{prefix}.") for prefix in prefixes)


def collect_tensors(model: nn.Module) -> tuple[dict[str, torch.Tensor], dict[str, dict[str, Any]]]:
    """Gather the tensors to store (contiguous CPU copies) and the scheme of each quantized Linear.

    Raises:
        ValueError: The model holds quantized modules other than dynamic Linears.
    """
    schemes: dict[str, dict[str, Any]] = {}
    tensors: dict[str, torch.Tensor] = {}
    for name, module in dynamic_linears(model):
        stored, schemes[name] = quantized_tensors(name, module)
        tensors.update(stored)
    for key, value in model.state_dict().items():
        if is_under(key, schemes):
            continue
        if not isinstance(value, torch.Tensor) or value.is_quantized or "_packed_params" in key:
            raise ValueError(f"cannot store state entry {key!r}: only dynamically quantized Linears are supported")
        tensors[key] = value
    return {k: v.detach().to("cpu").contiguous().clone() for k, v in tensors.items()}, schemes


SIZE_ATTRS: dict[type[nn.Module], tuple[str, ...]] = {
    nn.Linear: ("in_features", "out_features"),
    nn.modules.conv._ConvNd: ("in_channels", "out_channels", "groups"),
    nn.modules.batchnorm._NormBase: ("num_features",),
    nn.LayerNorm: ("normalized_shape",),
    nn.GroupNorm: ("num_groups", "num_channels"),
    nn.Embedding: ("num_embeddings", "embedding_dim"),
}


def _size_attrs(module: nn.Module) -> tuple[str, ...]:
    """Return the size attributes recorded for a module type (a quantized Linear counts as a Linear)."""
    if isinstance(module, dynamic_linear_type()):
        return SIZE_ATTRS[nn.Linear]
    for cls, names in SIZE_ATTRS.items():
        if isinstance(module, cls):
            return names
    return ()


def module_sizes(model: nn.Module) -> dict[str, dict[str, Any]]:
    """Record the size attributes of every Linear, conv, norm and embedding module, by module name."""
    sizes = {}
    for name, module in model.named_modules():
        values = {attr: getattr(module, attr) for attr in _size_attrs(module)}
        if values:
            sizes[name] = {attr: list(v) if isinstance(v, tuple) else v for attr, v in values.items()}
    return sizes


def architecture_of(model: nn.Module) -> str:
    """Name the class to rebuild: the model's own class, else the first of config.architectures."""
    import transformers  # lazy: transformers; nodes.prune loads this module without it

    own = type(model).__name__
    if isinstance(getattr(transformers, own, None), type):
        return own
    archs = getattr(getattr(model, "config", None), "architectures", None) or []
    return archs[0] if archs else own


def _dtype_name(dtype: torch.dtype) -> str:
    """Return a dtype's short name, e.g. "float32"."""
    return str(dtype).removeprefix("torch.")


def _json_attrs(attrs: Mapping[str, Mapping[str, Any]] | None) -> dict[str, dict[str, Any]]:
    """Return `attrs` as plain JSON data.

    Raises:
        ValueError: A value is not JSON-serializable (e.g. a tensor).
    """
    try:
        return json.loads(json.dumps({str(k): dict(v) for k, v in (attrs or {}).items()}))
    except (TypeError, ValueError) as err:
        raise ValueError(f"attrs must hold JSON values (numbers, strings, lists): {err}") from None


def build_recipe(
    model: nn.Module,
    tensors: Mapping[str, torch.Tensor],
    schemes: Mapping[str, Mapping[str, Any]],
    attrs: Mapping[str, Mapping[str, Any]] | None,
    extra: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """Describe a model well enough to rebuild it: architecture, config, shapes, attrs and quantization."""
    config = model.config
    replaced = {name: SHORTCUT for name in replaced_blocks(model)}
    tokens = token_schedule(model)
    recipe = {
        "format": FORMAT,
        "format_version": 3
        if tokens
        else 2
        if replaced
        else 1,  # the lowest that reads it: older readers load the rest
        "architecture": architecture_of(model),
        "model_type": getattr(config, "model_type", ""),
        "attn_implementation": getattr(config, "_attn_implementation", None),
        "config": _portable_config(config),
        "tensors": {k: {"shape": list(v.shape), "dtype": _dtype_name(v.dtype)} for k, v in tensors.items()},
        "modules": module_sizes(model),
        "attrs": _json_attrs(attrs),
        "replaced_blocks": replaced,
        "quantized": {name: scheme["dtype"] for name, scheme in schemes.items()},
        "quantization": {name: dict(scheme) for name, scheme in schemes.items()},
        "params": count_params(model),
        "state_bytes": state_bytes(model),
        "extra": dict(extra or {}),
        "versions": versions("safetensors"),
    }
    if tokens:  # the layers merge tokens: the loader installs the schedule again (`merged_tokens`)
        recipe["token_schedule"] = tokens
    return recipe


def _portable_config(config: Any) -> dict[str, Any]:
    """Return the config as a dict without the folder it was loaded from, so artifacts hash the same anywhere."""
    data = config.to_dict()
    data.pop("_name_or_path", None)
    return data


def _write_config(model: nn.Module, folder: Path, architecture: str) -> None:
    """Save the model's config with `architectures` naming the saved class (and no source path)."""
    config: Any = copy.deepcopy(model.config)  # a transformers PretrainedConfig
    config.architectures = [architecture]
    config._name_or_path = ""
    with quiet_hf():
        config.save_pretrained(folder)


def save_artifact(
    model: nn.Module,
    out_dir: str | os.PathLike,
    *,
    processor: Any | None = None,
    quantized: Mapping[str, str] | None = None,
    attrs: Mapping[str, Mapping[str, Any]] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Write a model (pruned and/or dynamically quantized) as a self-describing artifact folder.

    The folder is written atomically: it replaces `out_dir` as a whole once complete.

    Args:
        model: A transformers model (it must have `.config`), possibly pruned and quantized.
        out_dir: Destination folder.
        processor: Optional image processor saved beside the model (`save_pretrained`).
        quantized: Module name -> dtype the caller believes quantized; checked against the model.
        attrs: {module name: {attribute: value}} set by pruning fix-ups, set again on load. Module ""
            is the model itself; dotted attributes ("config.x") reach nested objects.
        extra: Caller metadata (metrics, plan) stored in the recipe; JSON-serializable.

    Returns:
        {"path", "sha256" (of the folder), "size_bytes" (of model.safetensors), "params" (logical)}.

    Raises:
        ValueError: `quantized` disagrees with the model, or the model holds unsupported quantized modules.
    """
    tensors, schemes = collect_tensors(model)
    found = {name: scheme["dtype"] for name, scheme in schemes.items()}
    if quantized is not None and dict(quantized) != found:
        raise ValueError(f"quantized={dict(quantized)} disagrees with the model's quantized layers {found}")
    recipe = build_recipe(model, tensors, schemes, attrs, extra)
    out_dir = Path(out_dir)
    with atomic_dir(out_dir) as tmp:
        save_file(tensors, str(tmp / WEIGHTS_FILE), metadata={"format": "pt"})
        _write_config(model, tmp, recipe["architecture"])
        if processor is not None:
            with quiet_hf():
                processor.save_pretrained(str(tmp))
        write_json_atomic(tmp / RECIPE_FILE, recipe)
    logger.info("saved artifact %s (%d tensors, %d quantized)", out_dir, len(tensors), len(schemes))
    return {
        "path": str(out_dir),
        "sha256": sha256_path(out_dir),
        "size_bytes": (out_dir / WEIGHTS_FILE).stat().st_size,
        "params": recipe["params"],
    }


# ---------------------------------------------------------------- loading


def is_artifact(path: str | os.PathLike) -> bool:
    """Return True when `path` is a folder holding a recipe.json."""
    path = Path(path)
    return path.is_dir() and (path / RECIPE_FILE).is_file()


def read_recipe(path: str | os.PathLike) -> dict[str, Any]:
    """Read and check an artifact's recipe.json.

    Raises:
        ArtifactError: The folder or recipe is missing or corrupt, or its format version is too new.
    """
    path = Path(path)
    if not path.is_dir():
        raise ArtifactError(f"artifact folder {path} does not exist")
    try:
        recipe = read_json(path / RECIPE_FILE)
    except FileNotFoundError:
        raise ArtifactError(f"{path} is not an artifact: {RECIPE_FILE} is missing") from None
    except (OSError, ValueError) as err:
        raise ArtifactError(f"{path / RECIPE_FILE} is unreadable: {err}") from None
    if not isinstance(recipe, dict) or recipe.get("format") != FORMAT:
        raise ArtifactError(f"{path / RECIPE_FILE} is not a {FORMAT} recipe")
    version = recipe.get("format_version")
    if not isinstance(version, int):
        raise ArtifactError(f"{path / RECIPE_FILE} has no integer format_version")
    if version > FORMAT_VERSION:
        raise ArtifactError(
            f"artifact format version {version} is newer than supported {FORMAT_VERSION}: upgrade profiling-agent"
        )
    for key in ("architecture", "tensors", "modules", "attrs", "quantization"):
        if key not in recipe:
            raise ArtifactError(f"{path / RECIPE_FILE} lacks the {key!r} field")
    return recipe
