"""Nearest-rank percentiles, the one definition the stats and the SLO check share."""

from __future__ import annotations

import math
from typing import Iterable

__all__ = ["percentile"]


def percentile(values: Iterable[float], q: float) -> float | None:
    """Nearest-rank percentile.

    Args:
        values: samples (any order).
        q: percentile in [0, 100].
    Returns:
        the ceil(q/100 * n)-th smallest value (the smallest for q=0); None for no samples.
    Raises:
        ValueError: q outside [0, 100].
    """
    if not 0 <= q <= 100:
        raise ValueError(f"percentile q must be within [0, 100], got {q}")
    xs = sorted(values)
    if not xs:
        return None
    rank = max(1, math.ceil(q / 100 * len(xs)))
    return xs[rank - 1]
