"""Hugging Face plumbing shared by loaders: quiet logging, offline detection, path-or-hub-id tests."""

from __future__ import annotations

import contextlib
import os
import re
import warnings
from collections.abc import Iterator


class ModelLoadError(ValueError):
    """A model reference that cannot be loaded; the message is one line, shown to users as-is."""


HUB_TIMEOUT_S = 10.0  # seconds to wait for the hub's metadata answer before giving up


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
