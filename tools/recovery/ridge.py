"""The ridge least-squares refit of one consumer layer, shared by recovery's refit and the probe that predicts it."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

Layer = nn.Linear | nn.Conv2d  # the consumers a refit can rewrite
RIDGE = 1e-2  # ridge strength relative to the mean diagonal of the kept activations' Gram matrix


def ridge_refit(
    gram: torch.Tensor,
    cross: torch.Tensor,
    yy: float,
    prior: torch.Tensor,
    untouched: torch.Tensor,
    n_kept: int,
    ridge: float = RIDGE,
) -> tuple[torch.Tensor, float, float]:
    """Solve min |X theta - Y|^2 + lam |theta - prior|^2 from the accumulated statistics of X and Y.

    lam is `ridge` times the mean diagonal of the Gram matrix's first `n_kept` rows (the kept input columns; a bias
    column may follow). Errors are relative: |X theta - Y|^2 / |Y|^2.

    Args:
        gram: X^T X, float64, (d, d).
        cross: X^T Y, float64, (d, outputs).
        yy: |Y|^2.
        prior: The weights the penalty pulls towards, (d, outputs).
        untouched: The layer's weights as they are (the error before), (d, outputs).
        n_kept: How many leading columns are kept inputs (the rest is the bias column).
        ridge: Relative ridge strength.

    Returns:
        (theta, error before, error after); theta is `untouched` when the solve is not finite or does not improve.
    """
    lam = ridge * (float(gram.diagonal()[:n_kept].mean()) or 1.0)
    eye = torch.eye(gram.shape[0], dtype=torch.float64)
    solved = torch.linalg.solve(gram + lam * eye, cross + lam * prior)

    def error(theta: torch.Tensor) -> float:
        return float((theta * (gram @ theta)).sum() - 2 * (theta * cross).sum() + yy) / max(yy, 1e-30)

    before, after = error(untouched), error(solved)
    if not torch.isfinite(solved).all() or after > before:
        return untouched, before, before
    return solved, before, after


def weight_columns(module: Layer, channels: Iterable[int]) -> list[int]:
    """Expand input channels into the weight columns (flattened kernels) they own."""
    per = 1 if isinstance(module, nn.Linear) else int(module.kernel_size[0] * module.kernel_size[1])
    return [c * per + j for c in channels for j in range(per)]


def bias_sink(model: nn.Module, name: str, module: Layer) -> tuple[str, nn.BatchNorm2d | Layer | None]:
    """Find where a fitted bias goes: the layer's own bias, else the BatchNorm right after it (its running mean).

    Args:
        model: The model (or block) holding the layer.
        name: The layer's name in `model`.
        module: The layer.

    Returns:
        ("bias", the layer), ("batchnorm", the one BatchNorm2d beside it of its width), or ("none", None).
    """
    if module.bias is not None:
        return "bias", module
    parent_name, _, _ = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    norms = [
        m
        for m in parent.children()
        if isinstance(m, nn.BatchNorm2d) and m.num_features == module.weight.shape[0] and m.running_mean is not None
    ]
    return ("batchnorm", norms[0]) if len(norms) == 1 else ("none", None)
