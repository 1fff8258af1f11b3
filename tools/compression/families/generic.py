"""Fallback adapter for unknown architectures: a few structural patterns that are usually safe to prune."""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from profiling_agent.tools.compression.families.base import FamilyAdapter, PrunableGroup

_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)


@dataclass(frozen=True)
class _ConvUnit:
    """A conv (and its BatchNorm, if any) that is a direct child of a parent, or one level below it."""

    conv: str
    norm: str | None
    out_channels: int
    in_channels: int


def _is_protected(name: str, protected: list[str]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in protected)


def _join(parent: str, child: str) -> str:
    return f"{parent}.{child}" if parent else child


def _norm_of(module: nn.Module, conv: nn.Conv2d) -> bool:
    return isinstance(module, _NORMS) and module.num_features == conv.out_channels


def _conv_units(parent: str, module: nn.Module) -> list[_ConvUnit]:
    """Collect the plain convs under `module`, direct or wrapped one level deep (conv+bn+act layers), in order."""
    units: list[_ConvUnit] = []
    pending: tuple[str, nn.Conv2d] | None = None

    def flush(norm: str | None = None) -> None:
        nonlocal pending
        if pending is not None:
            name, conv = pending
            units.append(_ConvUnit(name, norm, conv.out_channels, conv.in_channels))
            pending = None

    for child_name, child in module.named_children():
        full = _join(parent, child_name)
        if isinstance(child, nn.Conv2d):
            flush()
            pending = (full, child)
        elif pending is not None and _norm_of(child, pending[1]):
            flush(full)
        elif not isinstance(child, _NORMS):
            inner = [(n, c) for n, c in child.named_children() if isinstance(c, nn.Conv2d)]
            if len(inner) == 1:
                flush()
                conv_name, conv = inner[0]
                norms = [n for n, c in child.named_children() if _norm_of(c, conv)]
                norm = _join(full, norms[0]) if norms else None
                units.append(_ConvUnit(_join(full, conv_name), norm, conv.out_channels, conv.in_channels))
    flush()
    return units


class GenericAdapter(FamilyAdapter):
    """Guess in-block groups for any model: Linear->act->Linear MLPs and conv->bn->conv chains.

    The guesses are structural (no tracing): an MLP is two consecutive Linear children of one module that
    expand and then restore the width (so the block's output width is unchanged); a conv chain is a conv
    followed by a conv of the same parent that consumes its channels, so the parent's last conv (which usually
    feeds a residual add) is never a root. The pruning engine still traces every group with torch-pruning's
    DependencyGraph and drops (with a warning) any group whose coupling reaches beyond its members.
    """

    name = "generic"
    safe = False

    def matches(self, model: nn.Module) -> bool:
        """Return True for any module (this is the fallback)."""
        return isinstance(model, nn.Module)

    def protected_modules(self, model: nn.Module) -> list[str]:
        """Name the classifier (the last Linear), every nn.Embedding and every module called *embed*."""
        names: list[str] = []
        last_linear = ""
        for name, module in model.named_modules():
            if not name:
                continue
            if isinstance(module, nn.Linear):
                last_linear = name
            if isinstance(module, nn.Embedding) or "embed" in name.rsplit(".", 1)[-1].lower():
                names.append(name)
        if last_linear:
            names.append(last_linear)
        return names

    def prunable_groups(self, model: nn.Module) -> list[PrunableGroup]:
        """List MLP and conv-chain groups that avoid protected modules, in module order."""
        protected = self.protected_modules(model)
        groups: list[PrunableGroup] = []
        for parent, module in model.named_modules():
            groups += self._mlp_groups(parent, module, protected)
            groups += self._conv_groups(parent, module, protected)
        return groups

    def _mlp_groups(self, parent: str, module: nn.Module, protected: list[str]) -> list[PrunableGroup]:
        linears = [(_join(parent, n), c) for n, c in module.named_children() if isinstance(c, nn.Linear)]
        groups = []
        for (name_a, a), (name_b, b) in zip(linears, linears[1:], strict=False):
            shape_ok = a.out_features == b.in_features and b.out_features == a.in_features != a.out_features
            if not shape_ok or _is_protected(name_a, protected) or _is_protected(name_b, protected):
                continue
            groups.append(
                PrunableGroup(
                    name=name_a,
                    kind="structured",
                    module=name_a,
                    roots=(name_a,),
                    members=(name_a, name_b),
                    units=a.out_features,
                    block=parent,
                )
            )
        return groups

    def _conv_groups(self, parent: str, module: nn.Module, protected: list[str]) -> list[PrunableGroup]:
        units = _conv_units(parent, module)
        groups = []
        for i in range(len(units) - 1):  # the parent's last conv (often feeding a residual add) is never a root
            a, b = units[i], units[i + 1]
            conv_a, conv_b = module_at(module, parent, a.conv), module_at(module, parent, b.conv)
            if a.out_channels != b.in_channels or conv_a.groups != 1 or conv_b.groups != 1:
                continue
            members = (a.conv, *((a.norm,) if a.norm else ()), b.conv)
            if any(_is_protected(m, protected) for m in members):
                continue
            groups.append(
                PrunableGroup(
                    name=a.conv,
                    kind="structured",
                    module=a.conv,
                    roots=(a.conv,),
                    members=members,
                    units=a.out_channels,
                    block=parent,
                )
            )
        return groups


def module_at(root: nn.Module, root_name: str, name: str) -> nn.Module:
    """Return the submodule `name` (a full model name) of `root`, whose own full name is `root_name`."""
    relative = name[len(root_name) + 1 :] if root_name else name
    return root.get_submodule(relative)
