"""The baseline's logits on an image set a run reads more than once, computed once and kept in the run folder.

The probe (token merging's damage), the plan trials' reference and each recover step's check of its candidate all
compare with the baseline on the same trial slice, and each recover step's agreement probe on the calibration
images; on a full-size ViT-B/16 one pass over the 128-image slice costs about 40 CPU-s on one core. The first reader
predicts the set and writes it under `run_layout.BASELINE_LOGITS`, named by what the logits depend on (the images,
the baseline artifact, the kind of device); later readers load it (a file cut short is predicted again and replaced).
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

NAME_CHARS = 24  # hex characters of the key in a kept file's name (the whole key is in its metadata)


def logits_key(pixels: torch.Tensor, baseline_sha: str, device: str) -> str:
    """Return what the baseline's logits on `pixels` depend on, hashed: the images, the baseline and the device."""
    digest = hashlib.sha256(f"{baseline_sha}|{torch.device(device).type}".encode())
    hash_tensor(digest, pixels)
    return digest.hexdigest()


def kept_baseline_logits(run: Path, pixels: torch.Tensor, baseline_sha: str, model: nn.Module) -> torch.Tensor:
    """Return the baseline's float32 CPU logits on `pixels`: read from the run folder, or predicted and kept there.

    Args:
        run: The run folder.
        pixels: The images (N, C, H, W).
        baseline_sha: The baseline artifact's sha256.
        model: The baseline, on the device it predicts on (run only when the run keeps no logits for this key).
    """
    key = logits_key(pixels, baseline_sha, str(model_device(model)))
    path = Path(run) / run_layout.BASELINE_LOGITS / f"{key[:NAME_CHARS]}.safetensors"
    if path.is_file():
        try:
            with safe_open(str(path), framework="pt") as f:
                if (f.metadata() or {}).get("key") == key:
                    return f.get_tensor("logits").clone()  # not a view of the file
        except (OSError, SafetensorError):  # a file cut short: predicted again below
            pass
    logits = batched_logits(model, pixels).float().contiguous()
    path.parent.mkdir(parents=True, exist_ok=True)
    write_bytes_atomic(path, save({"logits": logits}, metadata={"key": key}))
    return logits
