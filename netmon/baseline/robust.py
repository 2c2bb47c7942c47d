"""Robust centre and spread of a short series: what "usual" means for one series of results.

A probe series on a busy host has outliers (a slow run when another process took the CPU), and a
mean and standard deviation follow them; the median and the median absolute deviation (MAD) do
not, as long as fewer than half the values are outliers. Scaled by 1.4826 the MAD estimates the
standard deviation of normally distributed values (NIST/SEMATECH e-Handbook of Statistical
Methods, 1.3.5.6 "Measures of Scale"; P. J. Rousseeuw and C. Croux, "Alternatives to the Median
Absolute Deviation", JASA 88 (1993)), so "k spreads" reads like "k sigma".
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

# 1 / Phi^-1(3/4): makes the MAD a consistent estimate of sigma for normal data.
MAD_TO_SIGMA = 1.4826


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def spread(values: Sequence[float]) -> float:
    """1.4826 x the median absolute deviation from the median; 0 for fewer than two values."""
    if len(values) < 2:
        return 0.0
    centre = statistics.median(values)
    return MAD_TO_SIGMA * float(statistics.median(abs(v - centre) for v in values))


def low_bound(baseline: float, spread_: float, ratio: float, k: float) -> float:
    """The value under which a result counts as low: under `ratio` x baseline AND more than `k`
    spreads under the baseline, so a series' own noise never reads as a fault."""
    return min(ratio * baseline, baseline - k * spread_)
