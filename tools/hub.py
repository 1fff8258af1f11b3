"""Hugging Face plumbing shared by loaders: quiet logging, offline detection, path-or-hub-id tests."""

from __future__ import annotations

import contextlib
import os
import re
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

from profiling_agent.tools.text import one_line


class ModelLoadError(ValueError):
    """A model reference that cannot be loaded; the message is one line, shown to users as-is."""


HUB_TIMEOUT_S = 10.0  # seconds to wait for the hub's metadata answer before giving up


@contextlib.contextmanager
def quiet_hf() -> Iterator[None]:
    """Silence transformers/datasets warnings and progress bars for the duration (restored afterwards)."""
    from datasets.utils import logging as ds_logging  # lazy: datasets; the CLI's flag check runs without it
    from transformers.utils import logging as tf_logging  # lazy: transformers; the CLI's flag check runs without it

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


EMBEDDED_PREFIX = "embedded:"  # a model or dataset shipped with the package ("embedded:vit-digits")


def looks_like_path(ref: str) -> bool:
    """Return True when `ref` is meant as a filesystem path rather than a hub id (or an embedded name).

    A path: it starts with "/", "./", "../", "~" or "." (also a Windows drive or a backslash), has more than one
    "/", names an existing file or folder, or is no valid hub id. A hub id ("org/name", "name") and an embedded
    name ("embedded:digits") are not paths. The CLI's preflight and the model and dataset loaders all use this rule.
    """
    if ref.startswith(EMBEDDED_PREFIX):
        return False
    if ref.startswith(("/", "./", "../", "~", ".")) or "\\" in ref or re.match(r"^[A-Za-z]:", ref):
        return True
    if ref.count("/") > 1 or Path(ref).expanduser().exists():
        return True
    from huggingface_hub.utils import (
        HFValidationError,
        validate_repo_id,
    )  # lazy: huggingface_hub (~80 ms); the CLI's flag check runs without it

    try:
        validate_repo_id(ref)
    except HFValidationError:
        return True
    return False


def hub_probe(
    kind: Literal["model", "dataset"], ref: str, error: type[Exception], revision: str | None = None
) -> str | None:
    """Ask the hub about a model or dataset with a short timeout; return None when it answered, else why not.

    Args:
        kind: What `ref` names.
        ref: The hub id.
        error: The exception raised for a definite answer (gated, not found, no such revision).
        revision: Branch, tag or commit (models only).

    Raises:
        error: The hub answered that the repository or revision does not exist or is gated.
    """
    from huggingface_hub import (
        dataset_info,
        model_info,
    )  # lazy: huggingface_hub's API (~0.2 s); the CLI's flag check runs without it
    from huggingface_hub.errors import (
        GatedRepoError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )  # lazy: huggingface_hub's API (~0.2 s); the CLI's flag check runs without it

    try:
        if kind == "model":
            model_info(ref, revision=revision, timeout=HUB_TIMEOUT_S)
        else:
            dataset_info(ref, timeout=HUB_TIMEOUT_S)
    except GatedRepoError:
        raise error(f"hub {kind} {ref} is gated: accept its terms and log in (hf auth login)") from None
    except RepositoryNotFoundError:
        raise error(f"hub {kind} not found: {ref} (or it is private: log in with hf auth login)") from None
    except RevisionNotFoundError:
        raise error(f"hub {kind} {ref} has no revision '{revision}'") from None
    except Exception as err:  # noqa: BLE001 - network failures of any kind
        return one_line(err, 120)
    return None
