"""One sweep's rounds, as a pure state machine: plan a round, record how its pairs came out,
plan the next, until every failed pair is explained (docs/SWEEPS.md, "Naming the bad end").

A node is named only when a pair of it with a node that passed fails too: two failures, one with
a known good partner. When both ends of a failed pair pass with others, the pair is measured
again as it was: failing again names the path between them, passing says it was noise. A
skipped pair (preempted, busy, error, timeout) is never judged; its nodes leave the sweep.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from netmon.baseline.book import BaselineBook
from netmon.sweep import plan
from netmon.sweep.judge import RailVerdict, Rules, history_key, history_lines, judge_rail, tier
from netmon.sweep.plan import Odd, PairPlan, SweepNode
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


@dataclass(frozen=True)
class Suspect:
    node: str
    rails: tuple[int, ...]
    peer: str | None = None  # set when the path between node and peer is named
    round: int = 0


@dataclass
class Localiser:
    nodes: Sequence[SweepNode]
    rules: Rules
    history: BaselineBook
    rng: random.Random
    max_rounds: int = 3
    odd: Odd = "trio"
    judged: list[JudgedPair] = field(default_factory=list)
    good: set[str] = field(default_factory=set)
    named: dict[str, Suspect] = field(default_factory=dict)
    paths: list[Suspect] = field(default_factory=list)
    gone: set[str] = field(default_factory=set)  # skipped: taken by a job, failed, drained
    waiting: list[str] = field(default_factory=list)  # the odd node out, for the next sweep
    # Failed pairs (or trios) not yet explained, each as its sorted members.
    _unresolved: list[tuple[str, ...]] = field(default_factory=list)
    _path_checked: set[tuple[str, ...]] = field(default_factory=set)
    _rounds: int = 0
    _current: Sequence[PairRun] = ()  # the round being recorded

    @property
    def rounds(self) -> int:
        return self._rounds

    def next_round(self) -> list[PairPlan]:
        """The pairs of the next round; empty when the sweep is done."""
        if self._rounds >= self.max_rounds:
            return []
        if self._rounds == 0:
            pairs, self.waiting = plan.first_round(self.nodes, self.rng, self.odd)
        else:
            pairs = self._locate_round()
        if pairs:
            self._rounds += 1
        return pairs

    def _locate_round(self) -> list[PairPlan]:
        open_pairs = [pair for pair in self._unresolved if self._open(pair)]
        to_test = [p for p in open_pairs if not self._both_good(p)]
        checks = [p for p in open_pairs if self._both_good(p) and p not in self._path_checked]
        available = [n for n in self.nodes if n.name not in self.gone]
        return plan.locate_round(
            available,
            self._rounds + 1,
            self._untested(to_test),
            sorted(self.good),
            checks,
            self.rng,
        )

    def _untested(self, groups: Sequence[tuple[str, ...]]) -> list[tuple[str, ...]]:
        """The failed pairs, with the ends already cleared or named dropped."""
        settled = self.good | set(self.named) | self.gone
        return [ends for group in groups if (ends := tuple(n for n in group if n not in settled))]

    def _open(self, pair: tuple[str, ...]) -> bool:
        """Still to explain: an end neither cleared nor named, or both cleared (a path)."""
        if any(n in self.gone for n in pair):
            return False
        if any(n in self.named for n in pair):
            return not all(n in self.named or n in self.good for n in pair)
        return pair not in self._path_checked or not self._both_good(pair)

    def _both_good(self, pair: tuple[str, ...]) -> bool:
        return all(n in self.good for n in pair)

    def record(self, runs: Sequence[PairRun]) -> list[JudgedPair]:
        """Judge one round's runs and update what is known of each node."""
        good_before = set(self.good)
        self._current = runs
        judged = [self._judge(run) for run in runs]
        self._current = ()
        self.judged.extend(judged)
        for pair in judged:
            self._learn_outcome(pair, good_before)
        return judged

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

    def _cohort(self, nodes: Sequence[str], rail: int) -> list[float]:
        """The values of this class measured in this sweep so far, this round's included."""
        cls = self._class(nodes)
        values = [
            r.busbw
            for p in self.judged
            for r in p.rails
            if r.rail == rail and self._class(p.run.plan.nodes) == cls
        ]
        return values + self._round_values(rail, cls)

    def _round_values(self, rail: int, cls: str) -> list[float]:
        # record() judges a round's runs one by one: the cohort is the whole round, so the runs
        # of this round are read from the scheduler's answer, not from earlier verdicts.
        return [
            r.busbw[rail]
            for r in self._current
            if r.outcome == "ok" and rail < len(r.busbw) and self._class(r.plan.nodes) == cls
        ]

    def _class(self, nodes: Sequence[str]) -> str:
        leaves = [self._node(n).leaf for n in nodes]
        return tier(leaves)

    def _node(self, name: str) -> SweepNode:
        return next(n for n in self.nodes if n.name == name)

    def _learn_outcome(self, pair: JudgedPair, good_before: set[str]) -> None:
        nodes = pair.run.plan.nodes
        if pair.passed is None:
            self.gone |= set(nodes)
            return
        if pair.passed:
            self.good |= set(nodes)
            if pair.run.plan.purpose == "path":
                self._path_checked.add(_key(nodes))
            return
        if pair.run.plan.purpose == "path":
            first, *rest = _key(nodes)
            self._path_checked.add(_key(nodes))
            peer = ",".join(rest)
            self.paths.append(Suspect(first, pair.failed_rails, peer, pair.run.plan.round))
            return
        known = [n for n in nodes if n in good_before]
        unknown = [n for n in nodes if n not in good_before]
        if known and len(unknown) == 1:
            node = unknown[0]
            self.named[node] = Suspect(node, pair.failed_rails, None, pair.run.plan.round)
            return
        if len(unknown) >= 2:
            self._unresolved.append(_key(unknown))

    def suspects(self) -> list[Suspect]:
        return sorted(self.named.values(), key=lambda s: s.node) + list(self.paths)

    def undecided(self) -> list[str]:
        """Nodes of failed pairs the sweep could not clear or name in its rounds."""
        settled = self.good | set(self.named) | self.gone
        return sorted({n for pair in self._unresolved for n in pair if n not in settled})

    def learn(self) -> None:
        """After the sweep: every pair that passed teaches both its ends (a named node learns
        nothing; the history's own rule learns only results over its healthy line)."""
        for pair in self.judged:
            if not pair.passed:
                continue
            for node in pair.run.plan.nodes:
                if node in self.named:
                    continue
                for verdict in pair.rails:
                    key = history_key(node, verdict.rail, self.rules.size)
                    self.history.learn_healthy(key, verdict.busbw)


def _key(nodes: Sequence[str]) -> tuple[str, ...]:
    return tuple(sorted(nodes))
