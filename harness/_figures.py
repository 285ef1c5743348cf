"""Figures the benchmarks compute alike (imported by them, never by ``src``)."""

from __future__ import annotations

import math


def percentile(values: list[float], q: float) -> float:
    """The ``q``-quantile (nearest rank: the value at or above a ``q`` share of the data)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]
