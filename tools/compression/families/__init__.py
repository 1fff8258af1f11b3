"""Family adapters (ViT, DeiT, Swin, ResNet, generic) and the registry that picks one for a model."""

from __future__ import annotations

import importlib
import logging

from torch import nn

from profiling_agent.tools.compression.families.base import FamilyAdapter, PrunableGroup
from profiling_agent.tools.compression.families.generic import GenericAdapter
from profiling_agent.tools.compression.families.resnet import ResNetAdapter
from profiling_agent.tools.compression.families.vit import ViTAdapter

logger = logging.getLogger(__name__)

__all__ = [
    "ADAPTERS",
    "FamilyAdapter",
    "PrunableGroup",
    "adapter_by_name",
    "adapter_for",
    "planning_groups",
    "register_adapter",
]


def _optional_adapter(module: str, cls: str) -> FamilyAdapter | None:
    """Instantiate `cls` from `module` when that module exists; errors inside it propagate."""
    full = f"profiling_agent.tools.compression.families.{module}"
    try:
        mod = importlib.import_module(full)
    except ModuleNotFoundError as exc:
        if exc.name != full:  # the module exists but something it imports is missing: a real error
            raise
        logger.debug("family module %s not present; %s not registered", full, cls)
        return None
    return getattr(mod, cls)()


def _default_adapters() -> list[FamilyAdapter]:
    """Build the default order: specific families first (DeiT before ViT), the generic fallback last."""
    candidates = [
        _optional_adapter("deit", "DeiTAdapter"),
        ViTAdapter(),
        _optional_adapter("swin", "SwinAdapter"),
        ResNetAdapter(),
        GenericAdapter(),
    ]
    return [adapter for adapter in candidates if adapter is not None]


ADAPTERS: list[FamilyAdapter] = _default_adapters()


def register_adapter(adapter: FamilyAdapter, first: bool = False) -> None:
    """Add `adapter` to the registry: first of all, or last before the unsafe fallbacks."""
    if first:
        ADAPTERS.insert(0, adapter)
        return
    fallback_at = next((i for i, a in enumerate(ADAPTERS) if not a.safe), len(ADAPTERS))
    ADAPTERS.insert(fallback_at, adapter)


def adapter_for(model: nn.Module) -> FamilyAdapter:
    """Return the first registered adapter whose `matches(model)` is true.

    Raises:
        LookupError: If no adapter matches (only possible when the generic fallback was removed).
    """
    for adapter in ADAPTERS:
        if adapter.matches(model):
            if not adapter.safe:
                logger.warning(
                    "no family adapter matches %s; using the %r fallback (only simple in-block groups are pruned)",
                    type(model).__name__,
                    adapter.name,
                )
            return adapter
    raise LookupError(f"no family adapter matches {type(model).__name__}")


def adapter_by_name(name: str) -> FamilyAdapter:
    """Return the registered adapter called `name` (e.g. to rebuild a saved artifact).

    Raises:
        KeyError: If no registered adapter has that name.
    """
    for adapter in ADAPTERS:
        if adapter.name == name:
            return adapter
    raise KeyError(f"no family adapter named {name!r}; known: {[a.name for a in ADAPTERS]}")


def planning_groups(model: nn.Module, depth: bool = False) -> list[PrunableGroup]:
    """Return the groups a plan may prune: channel and head groups, then (with `depth`) the removable blocks."""
    adapter = adapter_for(model)
    return [*adapter.prunable_groups(model), *(adapter.block_groups(model) if depth else [])]
