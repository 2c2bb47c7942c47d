"""Pure verdicts over pairwise link measurements: which pair, or which GPU (or node), is suspect.

Every pair is compared with the median of pairs of its own path class only (NV18 with NV18, PIX
with PIX), so a board that has fewer links between some GPUs by design raises no alarm. A member
all of whose pairs are low is the suspect itself; its pairs are then not named separately.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass

Pair = tuple[int, int]

DEFAULT_RATIO = 0.7
# With fewer pairs than this in a class, its median says nothing about which pair is odd.
MIN_CLASS_PAIRS = 3


@dataclass(frozen=True)
class PairVerdict:
    busbw: float
    path: str
    class_median: float | None
    ratio: float | None  # busbw / class median
    low: bool


@dataclass(frozen=True)
class LinkVerdict:
    pairs: Mapping[Pair, PairVerdict]
    suspect_pairs: tuple[Pair, ...]
    suspect_members: tuple[int, ...]  # GPUs, or nodes for node pairs

    def describe(self) -> str:
        if not self.suspect_pairs and not self.suspect_members:
            return "all pairs within their path class"
        parts = [f"member {m} (all its pairs low)" for m in self.suspect_members]
        parts += [
            f"pair {a}-{b} ({self.pairs[(a, b)].ratio or 0:.2f} of its class median)"
            for a, b in self.suspect_pairs
        ]
        return "suspect: " + ", ".join(parts)


def _normal(pair: Pair) -> Pair:
    a, b = pair
    return (a, b) if a < b else (b, a)


def judge_pairs(
    busbw: Mapping[Pair, float], paths: Mapping[Pair, str], ratio: float = DEFAULT_RATIO
) -> LinkVerdict:
    """Name suspects among pairs measured in one sweep (busbw at one size)."""
    measured = {_normal(pair): value for pair, value in busbw.items()}
    classes: dict[str, list[float]] = {}
    for pair, value in measured.items():
        classes.setdefault(paths.get(pair, "unknown"), []).append(value)
    medians = {
        path: statistics.median(values)
        for path, values in classes.items()
        if len(values) >= MIN_CLASS_PAIRS
    }
    verdicts: dict[Pair, PairVerdict] = {}
    for pair, value in sorted(measured.items()):
        path = paths.get(pair, "unknown")
        median = medians.get(path)
        pair_ratio = value / median if median else None
        low = pair_ratio is not None and pair_ratio < ratio
        verdicts[pair] = PairVerdict(value, path, median, pair_ratio, low)
    members = sorted({m for pair in verdicts for m in pair})
    suspect_members = tuple(m for m in members if _all_low(m, verdicts))
    suspect_pairs = tuple(
        pair
        for pair, verdict in verdicts.items()
        if verdict.low and not (set(pair) & set(suspect_members))
    )
    return LinkVerdict(verdicts, suspect_pairs, suspect_members)


def _all_low(member: int, verdicts: Mapping[Pair, PairVerdict]) -> bool:
    judged = [v for pair, v in verdicts.items() if member in pair and v.ratio is not None]
    # One low pair is a link; a member is suspect only when it is low with at least two peers.
    return len(judged) >= 2 and all(v.low for v in judged)
