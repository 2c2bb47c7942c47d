"""Robust centre and spread of a short series, and the lines a series is judged by.

A probe series on a busy host has outliers (a slow run when another process took the CPU), and a
mean and standard deviation follow them; the median and the median absolute deviation (MAD) do
not, as long as fewer than half the values are outliers. Scaled by 1.4826 the MAD estimates the
standard deviation of normally distributed values (NIST/SEMATECH e-Handbook of Statistical
Methods, 1.3.5.6 "Measures of Scale"; P. J. Rousseeuw and C. Croux, "Alternatives to the Median
Absolute Deviation", JASA 88 (1993)), so "k spreads" reads like "k sigma".
"""

from __future__ import annotations

import bisect
import functools
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


def midmean(values: Sequence[float]) -> float:
    """The mean of the middle half of `values` (the interquartile mean): as robust as the
    median to a quarter of outliers, and steady where the median is not: on a series with two
    levels (NCCL's tuner switching between two algorithms, two rings), the median of a window
    jumps from one level to the other as their counts change, the middle half's mean moves by
    a result's worth. For fewer than four values, the median."""
    return midmean_of_ordered(sorted(values))


def midmean_of_ordered(ordered: Sequence[float]) -> float:
    """midmean() of values already in order."""
    n = len(ordered)
    if n < 4:
        return median(ordered)
    cut = n // 4
    middle = ordered[cut : n - cut]
    return float(sum(middle) / len(middle))


def trimmed_mean(values: Sequence[float], share: float, at_least: int = 0) -> float:
    """The mean of `values` without the lowest and the highest `share` of them, and at least
    `at_least` at each end (at least one value kept)."""
    return trimmed_mean_of_ordered(sorted(values), share, at_least)


def trimmed_mean_of_ordered(ordered: Sequence[float], share: float, at_least: int = 0) -> float:
    """trimmed_mean() of values already in order."""
    cut = min(max(int(len(ordered) * share), at_least), (len(ordered) - 1) // 2)
    kept = ordered[cut : len(ordered) - cut]
    return float(math.fsum(kept) / len(kept))


def quantile(values: Sequence[float], q: float) -> float:
    """The q-quantile of `values` by linear interpolation between order statistics."""
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    below = math.floor(position)
    above = min(below + 1, len(ordered) - 1)
    return ordered[below] + (ordered[above] - ordered[below]) * (position - below)


def spread(values: Sequence[float]) -> float:
    """1.4826 x the median absolute deviation from the median; 0 for fewer than two values."""
    return spread_of_ordered(sorted(values))


def spread_of_ordered(ordered: Sequence[float]) -> float:
    """spread() of values already in order."""
    if len(ordered) < 2:
        return 0.0
    centre = _middle(ordered)
    # statistics.median's figures bit for bit, with one full sort instead of two (the daemon
    # takes a spread of up to 69 values on every result): the deviations under the centre grow
    # leftwards and those over it rightwards, two ordered runs that sorted() merges in one pass.
    # For v <= centre, centre - v is exactly abs(v - centre): IEEE subtraction is symmetric.
    split = bisect.bisect_left(ordered, centre)
    deviations = [centre - v for v in ordered[split - 1 :: -1]] if split else []
    deviations += [v - centre for v in ordered[split:]]
    return MAD_TO_SIGMA * float(_middle(sorted(deviations)))


def _middle(ordered: Sequence[float]) -> float:
    """statistics.median of values already in order (its arithmetic: the middle one, or the
    mean of the two middle ones)."""
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


@functools.lru_cache(maxsize=4096)
def _binomial_needed(n: int, rate: float, alpha: float) -> int:
    tail = 0.0
    for k in range(n, -1, -1):  # from the top: P(X >= k) grows as k falls
        tail += math.comb(n, k) * rate**k * (1 - rate) ** (n - k)
        if tail > alpha:
            return k + 1
    return 0


def binomial_needed(n: int, rate: float, alpha: float) -> int:
    """The fewest successes k out of `n` trials at `rate` each with P(X >= k) <= alpha (n + 1
    when even all n are likelier). The rate is rounded up to 1e-4, so the cache stays small
    and the bound stays on its side."""
    return _binomial_needed(n, math.ceil(rate * 1e4) / 1e4, alpha)


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
