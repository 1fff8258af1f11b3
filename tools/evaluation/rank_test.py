"""A one-sided Mann-Whitney U test: whether one sample's values tend to be larger than another's."""

from __future__ import annotations

import math
from collections.abc import Sequence

EXACT_MAX = 60  # exact null distribution (no ties) up to this many values in all; the normal approximation above


def u_statistic(x: Sequence[float], y: Sequence[float]) -> float:
    """Return U of `x`: the pairs (x_i, y_j) with x_i > y_j, a tie counting one half."""
    return sum(1.0 if a > b else 0.5 if a == b else 0.0 for a in x for b in y)


def _exact_upper_tail(u: float, n1: int, n2: int) -> float:
    """Return P(U >= u) under the null hypothesis without ties (the Gaussian binomial coefficient's coefficients)."""
    counts = [1] + [0] * (n1 * n2)  # counts[k]: orderings of n1 x's among n2 y's with U == k
    for i in range(1, n1 + 1):  # multiply by (1 - q^(n2 + i)), then divide by (1 - q^i): each step stays exact
        step = n2 + i
        for k in range(len(counts) - 1, step - 1, -1):
            counts[k] -= counts[k - step]
        for k in range(i, len(counts)):
            counts[k] += counts[k - i]
    total = math.comb(n1 + n2, n1)
    return sum(counts[math.ceil(u) :]) / total


def _normal_upper_tail(x: Sequence[float], y: Sequence[float], u: float) -> float:
    """Return P(U >= u) by the normal approximation, corrected for ties and for continuity."""
    n1, n2 = len(x), len(y)
    n = n1 + n2
    values = sorted([*x, *y])
    ties = 0
    start = 0
    while start < n:
        end = start
        while end + 1 < n and values[end + 1] == values[start]:
            end += 1
        t = end - start + 1
        ties += t**3 - t
        start = end + 1
    variance = n1 * n2 / 12.0 * ((n + 1) - ties / (n * (n - 1)))
    if variance <= 0:
        return 1.0  # every value equal: no evidence either way
    z = (u - n1 * n2 / 2.0 - 0.5) / math.sqrt(variance)
    return 0.5 * math.erfc(z / math.sqrt(2.0))


def p_greater(x: Sequence[float], y: Sequence[float]) -> float:
    """Return the one-sided p-value of "values of `x` tend to be larger than those of `y`" (Mann-Whitney U).

    Exact (the null distribution of U) when there are no ties and at most EXACT_MAX values in all; otherwise the
    normal approximation with tie and continuity corrections. An empty sample gives 1.0 (no evidence).

    Args:
        x: The sample suspected of larger values (e.g. reference times during a timing block).
        y: The sample it is compared with (e.g. the quiet calibration's reference times).

    Returns:
        The p-value in [0, 1].
    """
    if not x or not y:
        return 1.0
    u = u_statistic(x, y)
    if len(x) + len(y) <= EXACT_MAX and len(set(x) | set(y)) == len(x) + len(y):
        return min(1.0, _exact_upper_tail(u, len(x), len(y)))
    return min(1.0, _normal_upper_tail(x, y, u))
