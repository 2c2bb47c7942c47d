"""What a scrape of /metrics says: its samples, its series lines, and latency quantiles."""

from __future__ import annotations

import math
import re
import statistics
from collections import Counter
from collections.abc import Sequence

from prometheus_client.parser import text_string_to_metric_families


def quantile(values: Sequence[float], q: float) -> float:
    """Nearest-rank quantile: a value that was observed."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def latency_summary(values: Sequence[float]) -> dict[str, float]:
    return {
        "p50": quantile(values, 0.50),
        "p90": quantile(values, 0.90),
        "p99": quantile(values, 0.99),
        "max": max(values),
        "min": min(values),
        "mean": statistics.fmean(values),
    }


def parse_samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def series_lines(text: str) -> int:
    return sum(1 for line in text.splitlines() if line and not line.startswith("#"))


def lines_by_metric(text: str) -> dict[str, int]:
    names = Counter(
        re.split(r"[{ ]", line, maxsplit=1)[0]
        for line in text.splitlines()
        if line and not line.startswith("#")
    )
    return dict(sorted(names.items()))
