"""Whether one rail of one pair passed: against its cohort in this sweep, against each end's
learned history, and against `min_busbw`. Pure: values in, a verdict out.

A random matching rarely repeats a pair, so a per-pair baseline would seldom exist; the pairs of
one class (same rail, same fabric tier) measured in the same sweep are the comparison instead,
and each node's own history of passing pairs (the daemon's rule: expected level with the
long-term reference, a spread-aware line, never under the floor) is the second. A fault only
slows a pair down, so the cohort's level is its upper quartile: it stays put while up to three
quarters of a class are slow, and a first sweep on a new cluster already names an outlier.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from netmon.bandwidth import percentile
from netmon.baseline import robust
from netmon.baseline.book import BaselineBook, BaselineKey
from netmon.baseline.lines import Lines
from netmon.baseline.policy import BaselinePolicy

# A cohort's spread counts once it holds this many values (a MAD of fewer says little).
MIN_COHORT_SPREAD = 5
COHORT_QUANTILE = 0.75


@dataclass(frozen=True)
class Rules:
    """What a pair is judged by; from the `sweep:` and `baseline:` settings."""

    policy: BaselinePolicy = field(default_factory=BaselinePolicy)
    size: int = 16 << 20
    cohort_ratio: float = 0.8
    min_cohort: int = 2
    min_busbw: float | None = None
    # Spreads under the cohort's level that a pair must fall to fail: wider than the daemon's
    # 3, since a sweep draws thousands of lines at once (bench/sweep_sim.py: 3 names about 10
    # healthy nodes per 10,000 node-sweeps, 4 none).
    spread_k: float = 4.0


@dataclass(frozen=True)
class RailVerdict:
    rail: int
    busbw: float
    passed: bool
    expected: float | None  # the level the ratio is taken to: history's, else the cohort's
    lines: Mapping[str, float]  # each applicable line by name: cohort, history, min_busbw
    failed_by: tuple[str, ...]  # the lines it fell under

    @property
    def ratio(self) -> float | None:
        return self.busbw / self.expected if self.expected else None


def tier(leaves: Sequence[str | None]) -> str:
    """A pair's fabric tier: under one leaf, across leaves, or not known."""
    if any(leaf is None for leaf in leaves):
        return "any"
    return "leaf" if len(set(leaves)) == 1 else "spine"


def history_key(node: str, rail: int, size: int) -> BaselineKey:
    """The series of one node's rail in the sweep history (a BaselineBook)."""
    return ("sweep", "all_reduce", size, f"{node}/rail{rail}", 2)


@dataclass(frozen=True)
class Cohort:
    """A class's round-1 values, summed up once per round: its level and its own spread."""

    level: float
    spread: float  # 0 for a class too small to tell its own

    @classmethod
    def of(cls, values: Sequence[float], rules: Rules) -> Cohort | None:
        """None for a class too small to be a cohort."""
        if len(values) < rules.min_cohort:
            return None
        level = percentile(sorted(values), COHORT_QUANTILE)
        own = robust.spread(values) if len(values) >= MIN_COHORT_SPREAD else 0.0
        return cls(level, own)

    def line(self, rules: Rules, relative_spread: float = 0.0) -> float:
        """`relative_spread`: the pair's own noise as history knows it (spread / expected): a
        cohort of a few pairs cannot tell its own, and a line drawn without it pages on noise."""
        spread = max(self.spread, relative_spread * self.level)
        raw = robust.low_bound(self.level, spread, rules.cohort_ratio, rules.spread_k)
        line, _ = robust.floored(raw, self.level, rules.policy.floor_for(rules.size))
        return line


def class_cohorts(
    values: Mapping[tuple[str, int], Sequence[float]], rules: Rules
) -> dict[tuple[str, int], Cohort]:
    """Each (class, rail)'s cohort, its spread at least its class's usual relative spread over
    all rails: every rail of a class is measured the same way at the same time, and one rail's
    MAD of a few dozen values can come out at half the noise, drawing a line that pages on it."""
    found = {key: Cohort.of(vals, rules) for key, vals in values.items()}
    cohorts = {key: c for key, c in found.items() if c is not None}
    relative: dict[str, list[float]] = {}
    for (cls, _), cohort in cohorts.items():
        if cohort.spread > 0 and cohort.level > 0:
            relative.setdefault(cls, []).append(cohort.spread / cohort.level)
    pooled = {cls: robust.median(spreads) for cls, spreads in relative.items()}
    return {
        key: Cohort(c.level, max(c.spread, pooled.get(key[0], 0.0) * c.level))
        for key, c in cohorts.items()
    }


def cohort_line(
    values: Sequence[float], rules: Rules, relative_spread: float = 0.0
) -> tuple[float, float] | None:
    """(level, line) of a class's values in this sweep; None for a class too small."""
    cohort = Cohort.of(values, rules)
    return None if cohort is None else (cohort.level, cohort.line(rules, relative_spread))


def history_lines(book: BaselineBook, nodes: Sequence[str], rail: int, size: int) -> Lines | None:
    """The lines of the end with the lower expected level: a pair runs at its slower end."""
    known = [book.lines(history_key(node, rail, size)) for node in nodes]
    present = [lines for lines in known if lines is not None]
    return min(present, key=lambda lines: lines.expected) if present else None


def judge_rail(
    rail: int,
    busbw: float,
    cohort: Cohort | Sequence[float] | None,
    history: Lines | None,
    rules: Rules,
) -> RailVerdict:
    lines: dict[str, float] = {}
    expected: float | None = None
    noise = history.spread / history.expected if history and history.expected > 0 else 0.0
    if cohort is not None and not isinstance(cohort, Cohort):
        cohort = Cohort.of(cohort, rules)
    if cohort is not None:
        expected, lines["cohort"] = cohort.level, cohort.line(rules, noise)
    if history is not None:
        lines["history"] = history.low
        expected = history.expected
    if rules.min_busbw is not None:
        lines["min_busbw"] = rules.min_busbw
    failed = tuple(name for name, line in lines.items() if not busbw >= line)
    return RailVerdict(rail, busbw, not failed, expected, lines, failed)


# A class with fewer pairs than this on a rail is judged with its node classes' other tiers.
SMALL_COHORT = 8


def widened(values: dict[tuple[str, int], list[float]]) -> dict[tuple[str, int], list[float]]:
    """A class with fewer than SMALL_COHORT values on a rail takes its node classes' values
    at every tier: the upper quartile of three pairs is their best, and a minority node type
    matched across leaves would be judged against it."""
    by_kinds: dict[tuple[str, int], list[float]] = {}
    for (cls, rail), found in values.items():
        by_kinds.setdefault((cls.partition("@")[0], rail), []).extend(found)
    return {
        (cls, rail): found
        if len(found) >= SMALL_COHORT
        else by_kinds[(cls.partition("@")[0], rail)]
        for (cls, rail), found in values.items()
    }


def class_name(kinds: Iterable[str]) -> str:
    """The node classes of a pair, as one name: "a", or "a+b" across classes."""
    return "+".join(sorted(set(kinds)))
