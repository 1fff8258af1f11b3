"""The planning trial's refit, handed to the recover step when it refits the same pruned weights on the same images.

The analyze step's back-off trial prunes a fresh copy of the baseline by a plan and refits it (`reconstruct`) on the
calibration images; the recover step then prunes the baseline by the chosen plan and refits it again on the same
images with the same seed. When the pruned units, the images, the seed and the baseline are the same, the two refits
are the same computation (on full-size ViT-B/16 about 110 CPU-s). The trial keeps the refitted weights of its last
few plans in memory (`TrialRefits`), the analyze step writes the chosen plan's to the round's folder (`save`), and
the recover step loads them when the key it computes from its own pruned units matches (`load`), or refits.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from profiling_agent.state import PruneEntry
from profiling_agent.tools.compression.units import PrunedGroup
from profiling_agent.tools.io import atomic_dir, hash_tensor, read_json, write_json_atomic

FOLDER = "trial_refit"  # in the round's folder: weights.safetensors + refit.json
KEEP = 2  # trials whose refitted weights are held in memory (the chosen plan is almost always one of the last)


def refit_key(applied: Sequence[PrunedGroup], calib: torch.Tensor, seed: int, baseline_sha: str) -> str:
    """Return what a refit depends on, hashed: the removed units of every group, the images, the seed, the baseline."""
    digest = hashlib.sha256()
    rows = [row.model_dump(mode="json") for row in applied]
    digest.update(json.dumps({"applied": rows, "seed": seed, "baseline": baseline_sha}, sort_keys=True).encode())
    hash_tensor(digest, calib)
    return digest.hexdigest()


def plan_key(pruning: Sequence[Any]) -> str:
    """Return a plan's pruning entries as canonical JSON (how a trial is found again once the plan is chosen).

    Without their justification: two plans that prune alike have the same trial, whatever their words say.
    """
    rows = []
    for row in pruning:
        try:  # a raw plan's entry and the validated plan's are the same entry
            rows.append(PruneEntry.model_validate(row).model_dump(mode="json", exclude={"justification"}))
        except ValueError:
            rows.append(row.model_dump(mode="json") if hasattr(row, "model_dump") else dict(row))
    return json.dumps(rows, sort_keys=True)


class TrialRefits:
    """The refitted weights (and refit facts) of the last KEEP trials, by plan."""

    def __init__(self) -> None:
        self._held: OrderedDict[str, tuple[str, dict[str, torch.Tensor], dict[str, Any]]] = OrderedDict()

    def remember(self, pruning: Sequence[Any], key: str, model: nn.Module, info: dict[str, Any]) -> None:
        """Hold a copy of `model`'s refitted weights for the plan `pruning` (taken before any quantization)."""
        state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        plan = plan_key(pruning)
        self._held[plan] = (key, state, info)
        self._held.move_to_end(plan)
        while len(self._held) > KEEP:
            self._held.popitem(last=False)

    def save(self, pruning: Sequence[Any], folder: Path) -> bool:
        """Write the trial of plan `pruning` to `folder`/FOLDER, replacing an older one; False when none is held."""
        held = self._held.get(plan_key(pruning))
        if held is None:
            return False
        key, state, info = held
        with atomic_dir(folder / FOLDER) as tmp:
            save_file({k: v.contiguous() for k, v in state.items()}, str(tmp / "weights.safetensors"))
            write_json_atomic(tmp / "refit.json", {"key": key, "info": info})
        return True


def load(folder: Path, key: str, model: nn.Module) -> dict[str, Any] | None:
    """Load the saved trial refit into `model` when its key is `key`; return its refit facts, or None (refit)."""
    saved = folder / FOLDER
    try:
        meta = read_json(saved / "refit.json")
        if meta.get("key") != key:
            return None
        state = load_file(str(saved / "weights.safetensors"))
    except Exception:  # noqa: BLE001 - none saved, or a torn or foreign file: the refit runs
        return None
    own = model.state_dict()
    if set(state) != set(own) or any(state[k].shape != own[k].shape for k in own):
        return None
    model.load_state_dict(state)
    return dict(meta.get("info") or {})


def discard(folder: Path) -> None:
    """Remove the saved trial refit (the recovered weights are saved; it would only take disk space)."""
    shutil.rmtree(folder / FOLDER, ignore_errors=True)
