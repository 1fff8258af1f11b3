"""The ridge least-squares refit of one consumer layer, shared by recovery's refit and the probe that predicts it."""

from __future__ import annotations

import torch

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
