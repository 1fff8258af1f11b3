"""Rebuild a saved artifact: architecture from the recipe, resized modules, restored quantized layers."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from torch import nn

from profiling_agent.tools.hub import quiet_hf
from profiling_agent.tools.models.artifacts import (
    CONFIG_FILE,
    PROCESSOR_FILES,
    RECIPE_FILE,
    WEIGHTS_FILE,
    ArtifactError,
    first_line,
    is_under,
    read_recipe,
)
from profiling_agent.tools.models.dynamic_quant import (
    apply_dynamic_quantization,
    dynamic_linear_type,
    quiet_ao_quantization,
)
from profiling_agent.tools.models.merged_tokens import TokenScheduleError, install_token_merging
from profiling_agent.tools.models.shortcut import SHORTCUT, replace_with_shortcut
from profiling_agent.tools.models.sizes import QSCALE, QWEIGHT, QZERO
from profiling_agent.tools.runtimes.forms import form_source, load_form

logger = logging.getLogger(__name__)


@dataclass
class LoadedArtifact:
    """A model rebuilt from an artifact folder, with its processor and recipe."""

    model: nn.Module
    processor: Any | None = None
    recipe: dict[str, Any] = field(default_factory=dict)


def read_weights(path: Path, recipe: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """Load model.safetensors and check it holds exactly the tensors the recipe lists.

    Raises:
        ArtifactError: The file is missing, corrupt or disagrees with the recipe.
    """
    file = path / WEIGHTS_FILE
    if not file.is_file():
        raise ArtifactError(f"{file} is missing")
    try:
        tensors = load_file(str(file))
    except Exception as err:  # safetensors raises its own error types for truncated or garbled files
        raise ArtifactError(f"{file} is corrupt: {first_line(err)}") from None
    listed = recipe["tensors"]
    if set(tensors) != set(listed):
        diff = sorted(set(tensors) ^ set(listed))[:3]
        raise ArtifactError(f"{file} and {RECIPE_FILE} list different tensors, e.g. {diff}")
    for key, tensor in tensors.items():
        if list(tensor.shape) != listed[key]["shape"]:
            raise ArtifactError(f"{file}: {key} has shape {list(tensor.shape)}, recipe says {listed[key]['shape']}")
    return tensors


def build_model(path: Path, recipe: Mapping[str, Any]) -> nn.Module:
    """Instantiate the recorded architecture from config.json with transformers' own classes (no remote code).

    Raises:
        ArtifactError: The config is missing or unreadable, or the architecture cannot be built.
    """
    import transformers  # lazy: transformers; nodes.probe loads this module without it
    from transformers import (
        AutoConfig,
        AutoModelForImageClassification,
        PreTrainedModel,
    )  # lazy: transformers; nodes.probe loads this module without it

    if not (path / CONFIG_FILE).is_file():
        raise ArtifactError(f"{path / CONFIG_FILE} is missing")
    kwargs = {}
    if recipe.get("attn_implementation"):
        kwargs["attn_implementation"] = recipe["attn_implementation"]
    try:  # fork the RNG: random init of the throw-away weights must not shift the caller's seeded streams
        with quiet_hf(), torch.random.fork_rng(devices=[]):
            config = AutoConfig.from_pretrained(str(path), trust_remote_code=False)
            cls = getattr(transformers, str(recipe["architecture"]), None)
            if isinstance(cls, type) and issubclass(cls, PreTrainedModel):
                return cls._from_config(config, **kwargs)
            logger.warning("unknown architecture %r: using AutoModelForImageClassification", recipe["architecture"])
            return AutoModelForImageClassification.from_config(config, trust_remote_code=False, **kwargs)
    except Exception as err:
        message = f"cannot build {recipe['architecture']} from {path / CONFIG_FILE}: {first_line(err)}"
        raise ArtifactError(message) from None


def replace_blocks(model: nn.Module, replaced: Mapping[str, Any], path: Path) -> None:
    """Replace the blocks the recipe records as replaced by their shortcut (`shortcut.ShortcutBlock`) again.

    Raises:
        ArtifactError: A recorded replacement is unknown or does not fit the rebuilt model.
    """
    for name, how in replaced.items():
        if how != SHORTCUT:
            raise ArtifactError(f"{path / RECIPE_FILE}: block {name!r} is replaced by {how!r}, which is unknown")
        try:
            replace_with_shortcut(model, [name])
        except (AttributeError, ValueError) as err:
            raise ArtifactError(f"{path / RECIPE_FILE}: cannot replace block {name!r}: {first_line(err)}") from None


def reinstall_token_merging(model: nn.Module, recipe: Mapping[str, Any], path: Path) -> None:
    """Install the token schedule the recipe records (`merged_tokens`); nothing when it records none.

    Raises:
        ArtifactError: The recorded schedule is not a list of r per layer that fits the rebuilt model.
    """
    schedule = recipe.get("token_schedule")
    if schedule is None:
        return
    try:
        install_token_merging(model, schedule)
    except TokenScheduleError as err:
        raise ArtifactError(f"{path / RECIPE_FILE}: invalid token_schedule: {first_line(err)}") from None


def _direct_tensors(module: nn.Module) -> dict[str, torch.Tensor]:
    """Return a module's own (non-recursive) parameters and buffers by local name."""
    own: dict[str, torch.Tensor] = dict(module.named_parameters(recurse=False))
    own.update((n, b) for n, b in module.named_buffers(recurse=False) if b is not None)
    return own


def _reshape_tensor(module: nn.Module, local: str, like: torch.Tensor) -> None:
    """Replace a module's parameter or buffer `local` with an empty tensor shaped and typed like `like`."""
    current = getattr(module, local)
    fresh = torch.empty(like.shape, dtype=like.dtype, device=current.device)
    if isinstance(current, nn.Parameter):
        setattr(module, local, nn.Parameter(fresh, requires_grad=current.requires_grad))
    else:
        persistent = local not in module._non_persistent_buffers_set
        module.register_buffer(local, fresh, persistent=persistent)


def _set_sizes(module: nn.Module, sizes: Mapping[str, Any]) -> None:
    """Set a module's recorded size attributes (JSON lists become tuples where the module had tuples)."""
    for attr, value in sizes.items():
        if isinstance(getattr(module, attr, None), tuple) and isinstance(value, list):
            value = tuple(value)
        setattr(module, attr, value)


def resize_model(model: nn.Module, tensors: Mapping[str, torch.Tensor], recipe: Mapping[str, Any]) -> list[str]:
    """Resize modules in place so their tensors and size attributes match the stored ones.

    Every parameter or buffer whose stored shape (or, for unquantized tensors, dtype) differs is replaced
    by an empty tensor of the stored shape; Linear, conv, norm and embedding size attributes are set
    from the recipe. A quantized Linear's `qweight` stands for its float weight here.

    Returns:
        Names of the modules that were changed.

    Raises:
        ArtifactError: A recorded module does not exist or has another type in the rebuilt model.
    """
    quantized = recipe["quantization"]
    changed = []
    for name, module in model.named_modules():
        prefix = f"{name}." if name else ""
        touched = False
        for local, current in _direct_tensors(module).items():
            key = f"{prefix}{local}"
            if name in quantized and local == "weight":
                key = f"{prefix}{QWEIGHT}"
            stored = tensors.get(key)
            if stored is None:
                continue
            dtype_differs = name not in quantized and stored.dtype != current.dtype
            if stored.shape != current.shape or dtype_differs:
                like = stored if name not in quantized else torch.empty(stored.shape, dtype=current.dtype)
                _reshape_tensor(module, local, like)
                touched = True
        sizes = recipe["modules"].get(name)
        if sizes is not None:
            missing = [a for a in sizes if not hasattr(module, a)]
            if missing:
                raise ArtifactError(f"module {name!r} ({type(module).__name__}) has no attribute {missing[0]!r}")
            if any(getattr(module, a) != (tuple(v) if isinstance(v, list) else v) for a, v in sizes.items()):
                _set_sizes(module, sizes)
                touched = True
        if touched:
            changed.append(name)
    unknown = sorted(set(recipe["modules"]) - {n for n, _ in model.named_modules()})
    if unknown:
        raise ArtifactError(f"recorded module {unknown[0]!r} does not exist in the rebuilt model")
    return changed


def apply_attrs(model: nn.Module, attrs: Mapping[str, Mapping[str, Any]]) -> None:
    """Set {module name: {attribute: value}} on a model ("" is the model; dotted attributes reach nested objects).

    Raises:
        ArtifactError: A module or an intermediate attribute does not exist.
    """
    for name, values in attrs.items():
        try:
            module = model.get_submodule(name)
        except AttributeError:
            raise ArtifactError(f"attrs name module {name!r}, which the rebuilt model lacks") from None
        for dotted, value in values.items():
            *path, last = dotted.split(".")
            target = module
            for part in path:
                if not hasattr(target, part):
                    raise ArtifactError(f"attrs: {name!r} has no attribute path {dotted!r}")
                target = getattr(target, part)
            if isinstance(getattr(target, last, None), tuple) and isinstance(value, list):
                value = tuple(value)
            setattr(target, last, value)


def _split_weights(
    tensors: Mapping[str, torch.Tensor], quantized: Mapping[str, Any]
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Split stored tensors into plain state-dict entries and quantized Linears' entries."""
    plain: dict[str, torch.Tensor] = {}
    packed: dict[str, torch.Tensor] = {}
    for key, tensor in tensors.items():
        (packed if is_under(key, quantized) else plain)[key] = tensor
    return plain, packed


def load_plain(model: nn.Module, plain: Mapping[str, torch.Tensor], quantized: Mapping[str, Any]) -> None:
    """Load plain tensors; only the float weights and biases of to-be-quantized Linears may be missing.

    Raises:
        ArtifactError: Any other key is missing or unexpected, or a shape disagrees.
    """
    try:
        result = model.load_state_dict(plain, strict=False)
    except RuntimeError as err:
        raise ArtifactError(f"weights do not fit the rebuilt model: {str(err).splitlines()[-1].strip()}") from None
    missing = [k for k in result.missing_keys if not is_under(k, quantized)]
    if missing or result.unexpected_keys:
        bad = (missing or result.unexpected_keys)[0]
        kind = "missing" if missing else "unexpected"
        raise ArtifactError(f"weights do not fit the rebuilt model: {kind} key {bad!r}")


def restore_quantized(model: nn.Module, packed: Mapping[str, torch.Tensor], schemes: Mapping[str, Any]) -> None:
    """Quantize the recorded Linears and set their packed weights and biases from the stored tensors.

    Raises:
        ArtifactError: A recorded Linear is absent or its stored tensors are incomplete.
    """
    if not schemes:
        return
    plan = {name: scheme["dtype"] for name, scheme in schemes.items()}
    apply_dynamic_quantization(model, plan, inplace=True)
    with quiet_ao_quantization():
        for name, scheme in schemes.items():
            module = model.get_submodule(name)
            if not isinstance(module, dynamic_linear_type()):
                raise ArtifactError(f"recorded quantized module {name!r} is not an nn.Linear in the rebuilt model")
            module.set_weight_bias(_stored_weight(name, packed, scheme), packed.get(f"{name}.bias"))  # type: ignore[operator]


def _stored_weight(name: str, packed: Mapping[str, torch.Tensor], scheme: Mapping[str, Any]) -> torch.Tensor:
    """Rebuild a quantized Linear's weight (a quantized tensor, or float for float16) from stored tensors."""
    try:
        values = packed[f"{name}.{QWEIGHT}"]
        if scheme["dtype"] == "float16":
            return values.to(torch.float32)
        scale, zero = packed[f"{name}.{QSCALE}"], packed[f"{name}.{QZERO}"]
    except KeyError as err:
        raise ArtifactError(f"quantized module {name!r} lacks stored tensor {err.args[0]!r}") from None
    if scheme.get("qscheme") == "per_channel":
        return torch._make_per_channel_quantized_tensor(values, scale, zero, int(scheme.get("axis", 0)))
    return torch._make_per_tensor_quantized_tensor(values, float(scale.item()), int(zero.item()))


def load_processor(path: Path) -> Any | None:
    """Load the image processor saved in an artifact folder, or return None when there is none.

    Raises:
        ArtifactError: Processor files are present but cannot be loaded.
    """
    from transformers import AutoImageProcessor  # lazy: transformers; nodes.probe loads this module without it

    if not any((path / name).is_file() for name in PROCESSOR_FILES):
        return None
    try:
        with quiet_hf():
            return AutoImageProcessor.from_pretrained(str(path), trust_remote_code=False)
    except Exception as err:
        raise ArtifactError(f"cannot load the image processor in {path}: {first_line(err)}") from None


def load_artifact(path: str | os.PathLike, device: str | torch.device = "cpu") -> LoadedArtifact:
    """Rebuild a model saved by `save_artifact`, bit-identical to the saved one, in eval mode.

    Dynamically quantized models run on CPU only: when the artifact has quantized layers and `device`
    is not the CPU, the model stays on the CPU and a warning is logged.

    Args:
        path: The artifact folder.
        device: Where to place an unquantized model.

    Returns:
        The model, its processor (or None) and the recipe.

    Raises:
        ArtifactError: The folder or a file is missing or corrupt, the format version is too new, or the
            weights do not fit the rebuilt architecture.
    """
    path = Path(path)
    recipe = read_recipe(path)
    tensors = read_weights(path, recipe)
    model = build_model(path, recipe)
    replace_blocks(model, recipe.get("replaced_blocks") or {}, path)
    schemes = recipe["quantization"]
    resize_model(model, tensors, recipe)
    apply_attrs(model, recipe["attrs"])
    plain, packed = _split_weights(tensors, schemes)
    load_plain(model, plain, schemes)
    restore_quantized(model, packed, schemes)
    reinstall_token_merging(model, recipe, path)
    model.eval()
    if schemes and torch.device(device).type != "cpu":
        logger.warning("artifact %s is dynamically quantized: keeping it on the CPU instead of %s", path, device)
    else:
        model.to(device)
    return LoadedArtifact(model=model, processor=load_processor(path), recipe=recipe)


def load_run_form(path: str | os.PathLike, threads: int | None = None) -> Any:
    """Load a candidate's delivered form: an ONNX Runtime session, an OpenVINO model or the torch model."""
    return load_form(path, threads) if form_source(path) else load_artifact(path).model
