"""The baseline's logits on the trial slice, computed once per run and kept in the run folder.

The probe (token merging's damage), the plan trials' reference and each recover step's check of its candidate all
compare with the baseline on the same trial slice; on a full-size ViT-B/16 one pass over its 128 images costs about
40 CPU-s on one core. The first of them predicts it and writes `run_layout.TRIAL_LOGITS`; the others read it back
when it was made from the same images, by the same baseline, on the same kind of device (else they predict again
and replace it).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save
from torch import nn

from profiling_agent.tools import run_layout
from profiling_agent.tools.io import hash_tensor, write_bytes_atomic
from profiling_agent.tools.runtimes.forward import batched_logits, model_device


def slice_key(pixels: torch.Tensor, baseline_sha: str, device: str) -> str:
    """Return what the baseline's logits on `pixels` depend on, hashed: the images, the baseline and the device."""
    digest = hashlib.sha256(f"{baseline_sha}|{torch.device(device).type}".encode())
    hash_tensor(digest, pixels)
    return digest.hexdigest()


def baseline_trial_logits(run: Path, pixels: torch.Tensor, baseline_sha: str, model: nn.Module) -> torch.Tensor:
    """Return the baseline's float32 CPU logits on the trial slice `pixels`: read from the run folder, or predicted.

    Args:
        run: The run folder.
        pixels: The trial slice's images.
        baseline_sha: The baseline artifact's sha256.
        model: The baseline, on the device it predicts on (only run when the run keeps no logits for this key).
    """
    key, path = slice_key(pixels, baseline_sha, str(model_device(model))), Path(run) / run_layout.TRIAL_LOGITS
    if path.is_file():
        try:
            with safe_open(str(path), framework="pt") as f:
                if (f.metadata() or {}).get("key") == key:
                    return f.get_tensor("logits").clone()  # not a view of the file
        except (OSError, SafetensorError):  # a file cut short is predicted again and replaced
            pass
    logits = batched_logits(model, pixels).float().contiguous()
    path.parent.mkdir(parents=True, exist_ok=True)
    write_bytes_atomic(path, save({"logits": logits}, metadata={"key": key}))
    return logits
