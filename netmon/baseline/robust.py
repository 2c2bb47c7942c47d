"""Robust centre and spread of a short series, and the lines a series is judged by.

A probe series on a busy host has outliers (a slow run when another process took the CPU), and a
mean and standard deviation follow them; the median and the median absolute deviation (MAD) do
not, as long as fewer than half the values are outliers. Scaled by 1.4826 the MAD estimates the
standard deviation of normally distributed values (NIST/SEMATECH e-Handbook of Statistical
Methods, 1.3.5.6 "Measures of Scale"; P. J. Rousseeuw and C. Croux, "Alternatives to the Median
Absolute Deviation", JASA 88 (1993)), so "k spreads" reads like "k sigma".
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

# 1 / Phi^-1(3/4): makes the MAD a consistent estimate of sigma for normal data.
MAD_TO_SIGMA = 1.4826
# The standard error of the median of n normal values is about sqrt(pi / 2) x sigma / sqrt(n)
# (asymptotic relative efficiency of the median, 2 / pi).
MEDIAN_SE = math.sqrt(math.pi / 2)


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def quantile(values: Sequence[float], q: float) -> float:
    """The q-quantile of `values` by linear interpolation between order statistics."""
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    below = math.floor(position)
    above = min(below + 1, len(ordered) - 1)
    return ordered[below] + (ordered[above] - ordered[below]) * (position - below)


def spread(values: Sequence[float]) -> float:
    """1.4826 x the median absolute deviation from the median; 0 for fewer than two values."""
    if len(values) < 2:
        return 0.0
    centre = statistics.median(values)
    return MAD_TO_SIGMA * float(statistics.median(abs(v - centre) for v in values))


def low_bound(expected: float, spread_: float, ratio: float, k: float) -> float:
    """The statistical line under which a result counts as low: under `ratio` x expected AND
    more than `k` spreads under it, so a series' own noise never reads as a fault."""
    return min(ratio * expected, expected - k * spread_)


def floored(line: float, expected: float, floor: float) -> tuple[float, bool]:
    """`line`, never under floor x expected; and whether the floor set it."""
    lowest = floor * expected
    return (lowest, True) if line < lowest else (line, False)


def level_bound(expected: float, spread_: float, ratio: float, k: float, n: int) -> float:
    """The line under which the median of `n` results is low: the same rule as one result's,
    with the median's own standard error in place of one result's spread."""
    return low_bound(expected, MEDIAN_SE * spread_ / math.sqrt(max(n, 1)), ratio, k)


def clear_bound(expected: float, ratio: float) -> float:
    """Where the recent level must be back before a degradation clears: halfway between the
    line and the expected level, so a held cut that a burst of good results lifts toward the
    line does not clear."""
    return (1 + ratio) / 2 * expected
