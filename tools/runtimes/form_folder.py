"""One loader for exported form folders (ONNX Runtime and OpenVINO): recipe, format version, runtime, config.

A form folder holds the model file, a `recipe.json` whose "format" names the kind, the model's `config.json`
(labels) and its image processor. `onnx_model` and `openvino_model` describe their folders as a `FolderFormat`
and open them through `open_folder`; `forms.load_form` opens a folder of either kind.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

from profiling_agent.tools.io import read_json

Opened = TypeVar("Opened", bound="OpenedForm")


class OpenedForm(Protocol):
    """A model opened from a form folder (OrtClassifier, OvClassifier): its recipe and config are set on it."""

    recipe: dict[str, Any]
    config: Any

    def eval(self: Opened) -> Opened:
        """Return the model in eval mode."""
        ...


@dataclass(frozen=True)
class FolderFormat:
    """What marks a folder of one kind and how its failures read."""

    label: str  # "ONNX", "OpenVINO": the folder kind in messages
    model_file: str  # the model file every folder of the kind holds
    recipe_file: str  # the recipe beside it
    format: str  # the recipe's "format"
    version: int  # the newest "format_version" this code reads
    error: type[Exception]  # raised with a one-line reason
    opens: str  # "ONNX Runtime cannot open": the start of the message when the runtime refuses the file


def folder_recipe(path: str | os.PathLike, kind: FolderFormat) -> dict[str, Any] | None:
    """Return a form folder's recipe, or None when `path` is not a folder of `kind`."""
    path = Path(path)
    if not (path.is_dir() and (path / kind.model_file).is_file() and (path / kind.recipe_file).is_file()):
        return None
    try:
        recipe = read_json(path / kind.recipe_file)
    except (OSError, ValueError):
        return None
    return recipe if isinstance(recipe, dict) and recipe.get("format") == kind.format else None


def is_form_folder(path: str | os.PathLike, kind: FolderFormat) -> bool:
    """Return True when `path` holds the model file of `kind` and a recipe.json of its format."""
    return folder_recipe(path, kind) is not None


def open_folder(
    path: str | os.PathLike,
    kind: FolderFormat,
    missing: Callable[[], str | None],
    build: Callable[[Path, dict[str, Any]], Opened],
) -> Opened:
    """Open a folder of `kind`: check its recipe and version, build the model, attach recipe and config.

    Args:
        path: The folder.
        kind: The folder kind.
        missing: Why the runtime cannot run here (None when it can).
        build: Makes the model from the model file and the recipe; may raise `kind.error` for a bad recipe.

    Raises:
        kind.error: Not a folder of the kind, a newer format version, the runtime missing, or the file unreadable.
    """
    path = Path(path)
    recipe = folder_recipe(path, kind)
    file = path / kind.model_file
    if recipe is None:
        raise kind.error(
            f"{path} is not an {kind.label} folder ({kind.model_file} plus a {kind.format} {kind.recipe_file})"
        )
    if int(recipe.get("format_version", 0)) > kind.version:
        raise kind.error(f"{path / kind.recipe_file}: format version {recipe.get('format_version')} is too new")
    why = missing()
    if why:
        raise kind.error(f"cannot run {file}: {why}")
    try:
        model = build(file, recipe)
    except kind.error:
        raise
    except Exception as exc:  # noqa: BLE001 - each runtime raises its own error types for bad files
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        raise kind.error(f"{kind.opens} {file}: {first}") from None
    model.recipe = recipe
    if (path / "config.json").is_file():
        from transformers import (
            AutoConfig,
        )  # lazy: transformers takes seconds to import; tools.runtimes.forms loads this module without it

        model.config = AutoConfig.from_pretrained(str(path), trust_remote_code=False)
    return model.eval()
