"""Each measured pair's verdict: its rails judged against its class's cohort in this sweep and
against its nodes' history. Pure: runs in, verdicts out (docs/SWEEPS.md, "Naming the bad end").

Each class's level is its round-1 matching's: later rounds are made of failed ends, and would
pull it down. A pair's class is its nodes' classes and its fabric tier (under one leaf, or
across leaves): a slower node type, or a longer path, is not a slow node.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

from netmon.baseline.book import BaselineBook
from netmon.sweep.locate.fabric import Fabric
from netmon.sweep.locate.judge import (
    Cohort,
    RailVerdict,
    Rules,
    class_cohorts,
    class_name,
    history_key,
    history_lines,
    judge_rail,
    tier,
    widened,
)
from netmon.sweep.locate.plan import SweepNode
from netmon.sweep.scheduler import PairRun


@dataclass(frozen=True)
class JudgedPair:
    run: PairRun
    rails: tuple[RailVerdict, ...] = ()  # empty when skipped

    @property
    def passed(self) -> bool | None:
        """True, False, or None when it was not measured."""
        if self.run.outcome != "ok":
            return None
        return all(r.passed for r in self.rails)

    @property
    def failed_rails(self) -> tuple[int, ...]:
        return tuple(r.rail for r in self.rails if not r.passed)

    @property
    def worst_ratio(self) -> float | None:
        """The lowest busbw over expected of its failed rails."""
        ratios = [r.ratio for r in self.rails if not r.passed and r.ratio is not None]
        return min(ratios) if ratios else None


@dataclass
class SweepJudge:
    """The cohorts of one sweep, and the judging of its runs against them and the history."""

    nodes: Sequence[SweepNode]
    rules: Rules
    history: BaselineBook
    fabric: Fabric | None = None
    _cohorts: dict[tuple[str, int], Cohort] = field(default_factory=dict)
    _by_name: dict[str, SweepNode] = field(default_factory=dict)

    def node(self, name: str) -> SweepNode:
        if len(self._by_name) != len(self.nodes):
            self._by_name = {n.name: n for n in self.nodes}
        return self._by_name[name]

    def judge_round(self, runs: Sequence[PairRun], before: Sequence[PairRun]) -> list[JudgedPair]:
        """One round's runs judged; `before`: the earlier rounds' (the cohorts are all runs')."""
        self._cohorts = self._round_cohorts([*before, *runs])
        return [self._judge(run) for run in runs]

    def _judge(self, run: PairRun) -> JudgedPair:
        if run.outcome != "ok":
            return JudgedPair(run)
        nodes = run.plan.nodes
        rails = tuple(
            judge_rail(
                rail,
                busbw,
                self._cohort(nodes, rail),
                history_lines(self.history, nodes, rail, self.rules.size),
                self.rules,
            )
            for rail, busbw in enumerate(run.busbw)
        )
        return JudgedPair(run, rails)

    def _round_cohorts(self, runs: Sequence[PairRun]) -> dict[tuple[str, int], Cohort]:
        """Each (class, rail)'s cohort: round 1's matching, not later rounds of failed ends."""
        values: dict[tuple[str, int], list[float]] = {}
        for run in runs:
            if run.outcome != "ok" or run.plan.purpose not in ("match", "cover"):
                continue
            for rail, busbw in enumerate(run.busbw):
                values.setdefault((self._class(run.plan.nodes, rail), rail), []).append(busbw)
        return class_cohorts(widened(values), self.rules)

    def _class(self, nodes: Sequence[str], rail: int) -> str:
        """The pair's node classes and fabric tier: what its busbw is compared within."""
        if self.fabric is not None:
            where = tier([self.fabric.leaf(n, rail) for n in nodes])
        else:
            where = tier([self.node(n).leaf for n in nodes])
        return f"{class_name(self.node(n).kind for n in nodes)}@{where}"

    def _cohort(self, nodes: Sequence[str], rail: int) -> Cohort | None:
        """The pair's class's cohort; a pair across classes, which runs at its slower end's
        speed, takes the slowest of its members' own classes' (same tier)."""
        found = self._cohorts.get((self._class(nodes, rail), rail))
        if found is not None:
            return found
        kinds = {self.node(n).kind for n in nodes}
        if len(kinds) < 2:
            return None
        where = self._class(nodes, rail).partition("@")[2]
        own = [self._cohorts.get((f"{class_name([k])}@{where}", rail)) for k in kinds]
        present = [c for c in own if c is not None]
        return min(present, key=lambda c: c.level) if len(present) == len(own) else None

    def class_levels(self) -> dict[str, float]:
        """Each node class's level (its own cohorts' mean over rails and tiers)."""
        levels: dict[str, list[float]] = {}
        for (cls, _), cohort in self._cohorts.items():
            kinds = cls.partition("@")[0]
            if "+" not in kinds:
                levels.setdefault(kinds, []).append(cohort.level)
        return {kind: sum(found) / len(found) for kind, found in levels.items()}

    def has_history(self, node: str) -> bool:
        """Every rail of the node has a history of passing sweeps."""
        rails = self.node(node).rails
        return all(self.history.lines(history_key(node, r, self.rules.size)) for r in range(rails))

    def learn(self, judged: Sequence[JudgedPair], named: Collection[str]) -> None:
        """After the sweep: every pair that passed teaches both its ends (a named node learns
        nothing; the history's own rule learns only results over its healthy line)."""
        for pair in judged:
            if not pair.passed:
                continue
            for node in pair.run.plan.nodes:
                if node in named:
                    continue
                for verdict in pair.rails:
                    key = history_key(node, verdict.rail, self.rules.size)
                    self.history.learn_healthy(key, verdict.busbw)
