"""What the rounds of probe_vs_loop.py say: per-size ratios netmon / plain, and the targets.

Each size is judged by the median of the per-round ratios, quoted with their range and a
distribution-free interval for that median: a verdict whose interval straddles the tolerance is
inconclusive.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

from loop_rounds import log
from plain_loop import RANKS

# all_reduce's bus factor 2(n-1)/n (nccl-tests doc/PERFORMANCE.md), written out here so that the
# reference does not borrow netmon's maths.
BUS_FACTOR = 2.0 * (RANKS - 1) / RANKS
TARGETS = (
    ("busbw_16MiB", 16 << 20, "busbw", 0.05),
    ("latency_8B", 8, "latency", 0.10),
    # The same target, with netmon's figure taken as the plain loop takes its own: the slower
    # rank's median (from rank_medians_s) rather than the median of per-sample maxima.
    ("latency_8B_same_statistic", 8, "latency_same_statistic", 0.10),
)

Stats = dict[str, float]


def stats(values: Sequence[float]) -> Stats:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def busbw(size: int, seconds: float) -> float:
    return size / seconds * BUS_FACTOR


def median_interval(
    values: Sequence[float], confidence: float = 0.95
) -> tuple[float, float, float]:
    """A distribution-free interval for the median: (low, high, its actual coverage).

    The k-th smallest and k-th largest values bound the median with probability
    1 - 2 P(Binomial(n, 1/2) < k); k is the largest that keeps at least `confidence`.
    """
    ordered, n = sorted(values), len(values)

    def below(k: int) -> float:  # P(Binomial(n, 1/2) <= k)
        return sum(math.comb(n, i) for i in range(k + 1)) / (1 << n)

    k = 1
    while k + 1 <= n - k and 2 * below(k) <= 1 - confidence:
        k += 1
    return ordered[k - 1], ordered[n - k], 1 - 2 * below(k - 1)


def ratio_stats(numerators: Sequence[float], denominators: Sequence[float]) -> Stats:
    ratios = [n / d for n, d in zip(numerators, denominators, strict=True)]
    low, high, coverage = median_interval(ratios)
    return {**stats(ratios), "ci_low": low, "ci_high": high, "ci_coverage": coverage}


def summarise_size(size: int, rounds: Sequence[dict[str, Any]]) -> dict[str, Any]:
    rows = [r["sizes"][str(size)] for r in rounds]

    def column(name: str) -> list[float]:
        return [float(row[name]) for row in rows]

    plain, plain_batched = column("plain_per_op_s"), column("plain_batched_s")
    per_op, batched = column("netmon_per_op_s"), column("netmon_batched_s")
    # busbw is S / t x factor on both sides, so its ratio is the inverse of the time ratio; it is
    # taken from netmon's own busbw figure, so that a slip in netmon's maths would show here.
    return {
        "size_bytes": size,
        "latency_s": {
            "plain_per_op": stats(plain),
            "plain_per_op_per_sample_max": stats(column("plain_per_op_per_sample_max_s")),
            "netmon_per_op": stats(per_op),
            "netmon_per_op_slower_rank_median": stats(column("netmon_per_op_slower_rank_median_s")),
            "plain_batched": stats(plain_batched),
            "netmon_batched": stats(batched),
        },
        "busbw_bytes_per_second": {
            "plain_per_op": stats([busbw(size, t) for t in plain]),
            "netmon_per_op": stats(column("netmon_per_op_busbw")),
            "plain_batched": stats([busbw(size, t) for t in plain_batched]),
            "netmon_batched": stats(column("netmon_batched_busbw")),
        },
        "ratios": {
            "per_op": {
                "busbw": ratio_stats(
                    column("netmon_per_op_busbw"), [busbw(size, t) for t in plain]
                ),
                "latency": ratio_stats(per_op, plain),
                # Against the plain samples reduced as netmon reduces them (slower rank per
                # sample, then the median): what is left is not the statistic.
                "latency_vs_plain_per_sample_max": ratio_stats(
                    per_op, column("plain_per_op_per_sample_max_s")
                ),
                # And the other way round: netmon's samples reduced as the plain loop reduces
                # its own (each rank's median, then the slower rank).
                "latency_same_statistic": ratio_stats(
                    column("netmon_per_op_slower_rank_median_s"), plain
                ),
            },
            "batched": {
                "busbw": ratio_stats(
                    column("netmon_batched_busbw"), [busbw(size, t) for t in plain_batched]
                ),
                "latency": ratio_stats(batched, plain_batched),
            },
            "netmon_batched_vs_plain_per_op": {"latency": ratio_stats(batched, plain)},
        },
    }


def targets(by_size: dict[int, dict[str, Any]], timing: str) -> list[dict[str, Any]]:
    checks = []
    for name, size, metric, tolerance in TARGETS:
        if size not in by_size or metric not in by_size[size]["ratios"][timing]:
            continue
        ratio = by_size[size]["ratios"][timing][metric]
        low, high = ratio["ci_low"], ratio["ci_high"]
        inside = 1 - tolerance <= low and high <= 1 + tolerance
        outside = high < 1 - tolerance or low > 1 + tolerance
        checks.append(
            {
                "name": name,
                "size_bytes": size,
                "compares": f"netmon {timing} {metric} / plain {timing} {metric}",
                "tolerance": tolerance,
                "median_ratio": ratio["median"],
                "min_ratio": ratio["min"],
                "max_ratio": ratio["max"],
                "met": abs(ratio["median"] - 1.0) <= tolerance,
                # The interval for the median ratio: when it lies wholly inside or wholly
                # outside 1 +- tolerance, more rounds would not change the verdict.
                "median_interval": [ratio["ci_low"], ratio["ci_high"]],
                "interval_coverage": ratio["ci_coverage"],
                "conclusive": inside or outside,
            }
        )
    return checks


def fork_vs_spawn(sizes: Sequence[int], rounds: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per size, netmon's per-op busbw with forked ranks over the same with spawned ranks, both
    in every round: 1 within the interval means starting ranks by fork changes nothing measured."""
    compared = []
    for size in sizes:
        rows = [r["sizes"][str(size)] for r in rounds]
        ratio = ratio_stats(
            [row["netmon_per_op_busbw"] for row in rows],
            [row["netmon_spawned_busbw"] for row in rows],
        )
        compared.append({"size_bytes": size, "forked_over_spawned_busbw": ratio})
        log(
            f"{size} B: forked / spawned busbw, median {ratio['median']:.3f} "
            f"[{ratio['min']:.3f}, {ratio['max']:.3f}], interval for the median "
            f"[{ratio['ci_low']:.3f}, {ratio['ci_high']:.3f}]"
        )
    return compared
