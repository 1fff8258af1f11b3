"""Save and restore distillation steps (student, optimizer, progress) as safetensors + JSON, never pickle."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save
from torch import nn

from profiling_agent.tools.io import read_json, write_bytes_atomic, write_json_atomic

LATEST = "latest.json"


def _optimizer_tensors(optimizer: torch.optim.Optimizer, names: dict[int, str]) -> dict[str, torch.Tensor]:
    """Flatten the optimizer's per-parameter state into named tensors ("<param>::<key>")."""
    out = {}
    for param, state in optimizer.state.items():
        for key, value in state.items():
            tensor = value if isinstance(value, torch.Tensor) else torch.tensor(value)
            out[f"{names[id(param)]}::{key}"] = tensor.detach().cpu().contiguous()
    return out


def save_step(
    folder: Path, step: int, student: nn.Module, optimizer: torch.optim.Optimizer, info: dict[str, Any]
) -> Path:
    """Write step `step` to folder/step_NNNNNN, then point latest.json at it and drop older steps.

    A step folder is complete before latest.json names it (the pointer is replaced atomically), so a kill at any
    moment leaves the last complete step readable. The tensors are serialized in memory and written by Python, so
    a failed write (a full disk) raises OSError naming the file, never a library-specific error.

    Raises:
        OSError: A file could not be written; the previous step stays the latest.
    """
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / f"step_{step:06d}"
    if target.exists():
        shutil.rmtree(target)
    partial = folder / f".step_{step:06d}.partial"
    if partial.exists():
        shutil.rmtree(partial)
    partial.mkdir()
    names = {id(p): n for n, p in student.named_parameters()}
    weights = {k: v.detach().cpu().contiguous().clone() for k, v in student.state_dict().items()}
    groups = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
    try:
        write_bytes_atomic(partial / "student.safetensors", save(weights))
        write_bytes_atomic(partial / "optimizer.safetensors", save(_optimizer_tensors(optimizer, names)))
        write_json_atomic(partial / "state.json", {**info, "step": step, "param_groups": groups})
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    partial.rename(target)
    write_json_atomic(folder / LATEST, {"step": step, "folder": target.name})
    for old in folder.glob("step_*"):
        if old != target:
            shutil.rmtree(old, ignore_errors=True)
    return target


def peek(folder: Path) -> dict[str, Any] | None:
    """Return the JSON of the last saved step without loading any tensor (None when nothing is saved)."""
    pointer = folder / LATEST
    if not pointer.is_file():
        return None
    return read_json(folder / read_json(pointer)["folder"] / "state.json")


def load_latest(folder: Path, student: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any] | None:
    """Restore the last saved step into `student` and `optimizer`; return its JSON, or None when there is none."""
    pointer = folder / LATEST
    if not pointer.is_file():
        return None
    target = folder / read_json(pointer)["folder"]
    info = read_json(target / "state.json")
    device = next(student.parameters()).device
    student.load_state_dict(load_file(str(target / "student.safetensors"), device=str(device)))
    saved = load_file(str(target / "optimizer.safetensors"), device=str(device))
    params = dict(student.named_parameters())
    optimizer.state.clear()
    for key, value in saved.items():
        name, _, slot = key.partition("::")
        # AdamW keeps `step` on the CPU unless it runs fused/capturable
        optimizer.state[params[name]][slot] = value.cpu() if slot == "step" else value
    for group, saved_group in zip(optimizer.param_groups, info["param_groups"], strict=True):
        group.update({k: tuple(v) if isinstance(v, list) else v for k, v in saved_group.items()})
    return info


def clear(folder: Path) -> None:
    """Remove every saved step (a finished or invalidated recovery)."""
    shutil.rmtree(folder, ignore_errors=True)
