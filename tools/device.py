"""Device and thread-count resolution shared by profiling and evaluation."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import torch


def cpu_flags() -> set[str]:
    """Return the CPU's feature flags from /proc/cpuinfo (empty where there is none)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def native_bf16_cpu() -> bool:
    """Return whether this CPU computes bf16 natively (AVX-512 BF16 or AMX), not by emulation."""
    return bool(cpu_flags() & {"avx512_bf16", "amx_bf16"})


def resolve_device(choice: str = "auto") -> torch.device:
    """Map 'cpu' | 'cuda' | 'cuda:N' | 'auto' to a torch.device; CUDA without a GPU raises ValueError.

    'cuda:N' is what a model on a GPU names as its device (`str(tensor.device)`), and what a rank of a job uses.
    """
    if choice == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    kind, colon, index = choice.partition(":")
    if kind not in ("cpu", "cuda") or (colon and (kind != "cuda" or not index.isdigit())):
        raise ValueError(f"unknown device {choice!r}: use cpu, cuda, cuda:N or auto")
    if kind == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {choice} was requested but no CUDA device is available")
    return torch.device(choice)


def set_threads(threads: int | None) -> int:
    """Set torch's intra-op thread count (None keeps the current one) and return the count in force."""
    if threads:
        torch.set_num_threads(int(threads))
    return torch.get_num_threads()


CPU_ONLY_FORMS = ("ort_", "ov_")  # ONNX Runtime and OpenVINO forms: this package runs them on the CPU


def cpu_only(forms: Iterable[str] = (), *, quantized: bool = False) -> bool:
    """Return True when a measurement must run on the CPU: torch dynamic quantization and the runtimes' forms.

    Args:
        forms: Form names measured together (`ort_*` and `ov_*` run on the CPU only).
        quantized: A dynamically quantized torch model is among them.
    """
    return quantized or any(str(name).startswith(CPU_ONLY_FORMS) for name in forms)


def measure_device(requested: str, forms: Iterable[str] = (), *, quantized: bool = False) -> str:
    """Return the device models are measured on: the CPU when any of them runs there only, else `requested`."""
    return "cpu" if cpu_only(forms, quantized=quantized) else str(resolve_device(requested))
