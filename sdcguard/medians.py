"""The sign test's lower confidence bound on a median: the one statistic both slow-device rules share (the fleet's
golden-case timings, :mod:`sdcguard.fleet.slow`, and training's replayed micro-batches,
:mod:`sdcguard.training.timing`), so it lives in the core, below both wings."""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import cache

__all__ = ["median_lower_bound", "lower_rank"]


def median_lower_bound(values: Sequence[float], confidence: float) -> float | None:
    """A one-sided lower confidence bound on the median of ``values`` (distribution-free: the largest order
    statistic ``x_(k)`` with ``P(Binomial(n, 1/2) < k) <= 1 - confidence``); None when ``n`` is too small."""
    xs = sorted(values)
    k = lower_rank(len(xs), confidence)
    return xs[k - 1] if k >= 1 else None


@cache
def lower_rank(n: int, confidence: float) -> int:
    """The rank ``k`` (1-based; 0: none) of :func:`median_lower_bound`'s order statistic among ``n`` values."""
    alpha = 1.0 - confidence
    cdf, k = 0.0, 0
    for j in range(n):  # cdf = P(B <= j - 1) before adding j
        p = math.comb(n, j) / 2.0**n
        if cdf + p > alpha:
            break
        cdf += p
        k = j + 1
    return k
