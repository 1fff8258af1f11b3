"""Self-describing model artifacts: safetensors weights plus a JSON recipe, reloadable without pickle.

An artifact is a folder:

- `model.safetensors`: every tensor of the model's state dict under its usual name, except that a
  dynamically quantized Linear `<name>` is stored as `<name>.qweight` (int8 values for qint8, float16
  values for float16), `<name>.qweight_scale` and `<name>.qweight_zero_point` (qint8 only: float64 and
  int64, 0-d for per-tensor, 1-d for per-channel quantization) and `<name>.bias` (float32, as torch keeps it).
- `config.json`: the model's config (`save_pretrained`), with `architectures` set to the saved class.
- `recipe.json`: format version, architecture, attention implementation, the base config dict, the shape
  and dtype of *every* tensor in the weights file (all shapes, not only changed ones: simpler, and it
  lets the loader check the file against the recipe), the size attributes of every Linear, conv, norm
  and embedding module, `attrs` ({module: {attribute: value}} set by pruning fix-ups), `quantized`
  ({module: dtype}) with each one's quantization scheme, caller `extra` metadata and library versions.
- the image processor's files, when one was given.

Loading builds the model from its config with transformers' own classes (never remote code), resizes
every module whose stored tensors differ in shape, sets `attrs`, loads the weights with safetensors
(`torch.load` is never used), re-applies dynamic quantization to the recorded modules and sets their
packed weights from the stored tensors, so outputs are bit-identical to the saved model's.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from profiling_agent.tools.io import atomic_dir, read_json, sha256_path, write_json_atomic
from profiling_agent.tools.quantization import apply_dynamic_quantization, dynamic_linear_type, quiet_ao_quantization

logger = logging.getLogger(__name__)

FORMAT = "profiling-agent-artifact"
FORMAT_VERSION = 1
WEIGHTS_FILE = "model.safetensors"
RECIPE_FILE = "recipe.json"
CONFIG_FILE = "config.json"
PROCESSOR_FILES = ("preprocessor_config.json", "processor_config.json")

QWEIGHT, QSCALE, QZERO = "qweight", "qweight_scale", "qweight_zero_point"


class ArtifactError(RuntimeError):
    """A saved artifact is missing, incomplete, corrupt or of an unsupported format version."""


def _first_line(err: BaseException) -> str:
    """Return the first non-empty line of an exception's message, or its type name."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return lines[0] if lines else type(err).__name__


@dataclass
class LoadedArtifact:
    """A model rebuilt from an artifact folder, with its processor and recipe."""

    model: nn.Module
    processor: Any | None = None
    recipe: dict[str, Any] = field(default_factory=dict)


# ---------------------------------------------------------------- counting


def _unique_tensors(model: nn.Module) -> Iterator[torch.Tensor]:
    """Yield every parameter and buffer once (shared tensors counted once)."""
    seen: set[int] = set()
    for tensor in [*model.parameters(), *model.buffers()]:
        if id(tensor) not in seen:
            seen.add(id(tensor))
            yield tensor


def _dynamic_linears(model: nn.Module) -> Iterator[tuple[str, nn.Module]]:
    """Yield (name, module) of every dynamically quantized Linear."""
    dynamic_linear = dynamic_linear_type()
    for name, module in model.named_modules():
        if isinstance(module, dynamic_linear):
            yield name, module


def logical_params(model: nn.Module) -> int:
    """Count parameters, counting a dynamically quantized Linear's weight and bias elements as parameters."""
    total = sum(p.numel() for p in model.parameters())
    for _, module in _dynamic_linears(model):
        weight, bias = module.weight(), module.bias()
        total += weight.numel() + (bias.numel() if bias is not None else 0)
    return int(total)


def state_bytes(model: nn.Module) -> int:
    """Count bytes of parameters, buffers and quantized Linears' weights, bias and qparams as stored."""
    total = sum(t.numel() * t.element_size() for t in _unique_tensors(model))
    for name, module in _dynamic_linears(model):
        total += sum(t.numel() * t.element_size() for t in _quantized_tensors(name, module)[0].values())
    return int(total)


# ---------------------------------------------------------------- saving


def _quantized_tensors(name: str, module: nn.Module) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Return the stored tensors of one dynamically quantized Linear and its scheme description."""
    weight, bias = module.weight(), module.bias()
    tensors: dict[str, torch.Tensor] = {}
    if module._packed_params.dtype == torch.float16:
        scheme: dict[str, Any] = {"dtype": "float16"}
        tensors[f"{name}.{QWEIGHT}"] = weight.to(torch.float16)
    elif weight.qscheme() in (torch.per_tensor_affine, torch.per_tensor_symmetric):
        scheme = {"dtype": "qint8", "qscheme": "per_tensor"}
        tensors[f"{name}.{QWEIGHT}"] = weight.int_repr()
        tensors[f"{name}.{QSCALE}"] = torch.tensor(weight.q_scale(), dtype=torch.float64)
        tensors[f"{name}.{QZERO}"] = torch.tensor(weight.q_zero_point(), dtype=torch.int64)
    else:
        scheme = {"dtype": "qint8", "qscheme": "per_channel", "axis": int(weight.q_per_channel_axis())}
        tensors[f"{name}.{QWEIGHT}"] = weight.int_repr()
        tensors[f"{name}.{QSCALE}"] = weight.q_per_channel_scales().to(torch.float64)
        tensors[f"{name}.{QZERO}"] = weight.q_per_channel_zero_points().to(torch.int64)
    if bias is not None:
        tensors[f"{name}.bias"] = bias.detach()
    return tensors, scheme


def _is_under(key: str, prefixes: Mapping[str, Any]) -> bool:
    """Return True when state-dict `key` belongs to one of the modules named in `prefixes`."""
    return any(key.startswith(f"{prefix}.") for prefix in prefixes)


def collect_tensors(model: nn.Module) -> tuple[dict[str, torch.Tensor], dict[str, dict[str, Any]]]:
    """Gather the tensors to store (contiguous CPU copies) and the scheme of each quantized Linear.

    Raises:
        ValueError: The model holds quantized modules other than dynamic Linears.
    """
    schemes: dict[str, dict[str, Any]] = {}
    tensors: dict[str, torch.Tensor] = {}
    for name, module in _dynamic_linears(model):
        stored, schemes[name] = _quantized_tensors(name, module)
        tensors.update(stored)
    for key, value in model.state_dict().items():
        if _is_under(key, schemes):
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
    import transformers

    own = type(model).__name__
    if isinstance(getattr(transformers, own, None), type):
        return own
    archs = getattr(getattr(model, "config", None), "architectures", None) or []
    return archs[0] if archs else own


def _versions() -> dict[str, str]:
    """Return the versions of the libraries an artifact depends on."""
    import safetensors
    import transformers

    import profiling_agent

    return {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "safetensors": safetensors.__version__,
        "profiling_agent": profiling_agent.__version__,
    }


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
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "architecture": architecture_of(model),
        "model_type": getattr(config, "model_type", ""),
        "attn_implementation": getattr(config, "_attn_implementation", None),
        "config": _portable_config(config),
        "tensors": {k: {"shape": list(v.shape), "dtype": _dtype_name(v.dtype)} for k, v in tensors.items()},
        "modules": module_sizes(model),
        "attrs": _json_attrs(attrs),
        "quantized": {name: scheme["dtype"] for name, scheme in schemes.items()},
        "quantization": {name: dict(scheme) for name, scheme in schemes.items()},
        "params": logical_params(model),
        "state_bytes": state_bytes(model),
        "extra": dict(extra or {}),
        "versions": _versions(),
    }


@contextmanager
def quiet_transformers() -> Iterator[None]:
    """Lower transformers' log level to errors and ignore its warnings (e.g. the PIL-backend fallback)."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        hf_logging.set_verbosity(level)


def _portable_config(config: Any) -> dict[str, Any]:
    """Return the config as a dict without the folder it was loaded from, so artifacts hash the same anywhere."""
    data = config.to_dict()
    data.pop("_name_or_path", None)
    return data


def _write_config(model: nn.Module, folder: Path, architecture: str) -> None:
    """Save the model's config with `architectures` naming the saved class (and no source path)."""
    config = copy.deepcopy(model.config)
    config.architectures = [architecture]
    config._name_or_path = ""
    with quiet_transformers():
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
    from safetensors.torch import save_file

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
            with quiet_transformers():
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


def read_weights(path: Path, recipe: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """Load model.safetensors and check it holds exactly the tensors the recipe lists.

    Raises:
        ArtifactError: The file is missing, corrupt or disagrees with the recipe.
    """
    from safetensors.torch import load_file

    file = path / WEIGHTS_FILE
    if not file.is_file():
        raise ArtifactError(f"{file} is missing")
    try:
        tensors = load_file(str(file))
    except Exception as err:  # safetensors raises its own error types for truncated or garbled files
        raise ArtifactError(f"{file} is corrupt: {_first_line(err)}") from None
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
    import transformers
    from transformers import AutoConfig, AutoModelForImageClassification, PreTrainedModel

    if not (path / CONFIG_FILE).is_file():
        raise ArtifactError(f"{path / CONFIG_FILE} is missing")
    kwargs = {}
    if recipe.get("attn_implementation"):
        kwargs["attn_implementation"] = recipe["attn_implementation"]
    try:  # fork the RNG: random init of the throw-away weights must not shift the caller's seeded streams
        with quiet_transformers(), torch.random.fork_rng(devices=[]):
            config = AutoConfig.from_pretrained(str(path), trust_remote_code=False)
            cls = getattr(transformers, str(recipe["architecture"]), None)
            if isinstance(cls, type) and issubclass(cls, PreTrainedModel):
                return cls._from_config(config, **kwargs)
            logger.warning("unknown architecture %r: using AutoModelForImageClassification", recipe["architecture"])
            return AutoModelForImageClassification.from_config(config, trust_remote_code=False, **kwargs)
    except Exception as err:
        message = f"cannot build {recipe['architecture']} from {path / CONFIG_FILE}: {_first_line(err)}"
        raise ArtifactError(message) from None


def _direct_tensors(module: nn.Module) -> dict[str, torch.Tensor]:
    """Return a module's own (non-recursive) parameters and buffers by local name."""
    own = dict(module.named_parameters(recurse=False))
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
    plain, packed = {}, {}
    for key, tensor in tensors.items():
        (packed if _is_under(key, quantized) else plain)[key] = tensor
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
    missing = [k for k in result.missing_keys if not _is_under(k, quantized)]
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
            module.set_weight_bias(_stored_weight(name, packed, scheme), packed.get(f"{name}.bias"))


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
    from transformers import AutoImageProcessor

    if not any((path / name).is_file() for name in PROCESSOR_FILES):
        return None
    try:
        with quiet_transformers():
            return AutoImageProcessor.from_pretrained(str(path), trust_remote_code=False)
    except Exception as err:
        raise ArtifactError(f"cannot load the image processor in {path}: {_first_line(err)}") from None


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
    schemes = recipe["quantization"]
    resize_model(model, tensors, recipe)
    apply_attrs(model, recipe["attrs"])
    plain, packed = _split_weights(tensors, schemes)
    load_plain(model, plain, schemes)
    restore_quantized(model, packed, schemes)
    model.eval()
    if schemes and torch.device(device).type != "cpu":
        logger.warning("artifact %s is dynamically quantized: keeping it on the CPU instead of %s", path, device)
    else:
        model.to(device)
    return LoadedArtifact(model=model, processor=load_processor(path), recipe=recipe)
