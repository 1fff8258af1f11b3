"""Device and thread-count resolution shared by profiling and evaluation."""

from __future__ import annotations

import torch


def resolve_device(choice: str = "auto") -> torch.device:
    """Map 'cpu' | 'cuda' | 'auto' to a torch.device; 'cuda' without a GPU raises ValueError."""
    if choice == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if choice == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda was requested but no CUDA device is available")
    if choice not in ("cpu", "cuda"):
        raise ValueError(f"unknown device {choice!r}: use cpu, cuda or auto")
    return torch.device(choice)


def set_threads(threads: int | None) -> int:
    """Set torch's intra-op thread count (None keeps the current one) and return the count in force."""
    if threads:
        torch.set_num_threads(int(threads))
    return torch.get_num_threads()
