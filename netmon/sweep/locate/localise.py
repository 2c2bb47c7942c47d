"""One sweep's rounds, as a pure state machine: plan a round, record how its pairs came out,
plan the next, until every failed pair is explained (docs/SWEEPS.md, "Naming the bad end").

A node is named only when a pair of it with a node that passed (never the partner it failed with)
fails too, on a rail it failed on before: two failures, one with a known good partner. When both
ends of a failed pair pass with others, the pair is measured again as it was: failing again
names the path between them, passing says it was noise. A skipped pair (preempted, busy, error,
timeout) is never judged: its nodes are tried again while they stay idle, and a failed pair the
rounds could not explain is reported undecided. How each pair is judged is
netmon.sweep.locate.pair_verdict's; what each node showed so far, netmon.sweep.locate.partners'.
"""

from __future__ import annotations

import dataclasses
import logging
import random
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

from netmon.baseline.book import BaselineBook
from netmon.sweep.locate import blind, plan, uplink_plan
from netmon.sweep.locate.fabric import Cable, Fabric, Uplink
from netmon.sweep.locate.judge import Rules
from netmon.sweep.locate.pair_verdict import JudgedPair, SweepJudge
from netmon.sweep.locate.partners import Partners
from netmon.sweep.locate.plan import Odd, PairPlan, SweepNode
from netmon.sweep.locate.uplinks import Ledger
from netmon.sweep.scheduler import PairRun

log = logging.getLogger(__name__)

# Pairs across leaves, measured for the uplinks they cross: their failures are the uplink
# ledger's to explain, not the nodes'.
UPLINK_PURPOSES = ("uplink", "cover")
# Pairs whose failure can name a node, a path or an uplink: they measure confirm_repeats times.
CONFIRMING = ("locate", "path", "uplink", "quiet")


@dataclass(frozen=True)
class Suspect:
    node: str  # the node; for an uplink, its leaf switch; for a switch, the switch
    rails: tuple[int, ...]
    # The other node of a named path; for an uplink, its spine; for a switch, its level.
    peer: str | None = None
    round: int = 0
    kind: str = "node"  # node, path, uplink or switch
    ratio: float | None = None  # the worst failure's busbw over its expected level

    @property
    def uplink(self) -> Uplink | None:
        """The uplink named, for an uplink (its leaf and spine); None for other kinds."""
        if self.kind != "uplink" or self.peer is None:
            return None
        return Uplink(self.node, self.peer)


@dataclass
class Localiser:
    nodes: Sequence[SweepNode]
    rules: Rules
    history: BaselineBook
    rng: random.Random
    max_rounds: int = 4
    odd: Odd = "trio"
    confirm_repeats: int = 1
    judged: list[JudgedPair] = field(default_factory=list)
    good: set[str] = field(default_factory=set)
    named: dict[str, Suspect] = field(default_factory=dict)
    paths: list[Suspect] = field(default_factory=list)
    gone: set[str] = field(default_factory=set)  # no longer idle: taken by a job, drained
    waiting: list[str] = field(default_factory=list)  # the odd node out, for the next sweep
    # Failed pairs (or trios) not yet explained, each as its sorted members, with the rails
    # they failed on; and whom every node passed and failed with, on which rails.
    _groups: dict[tuple[str, ...], frozenset[int]] = field(default_factory=dict)
    _partners: Partners = field(default_factory=Partners)
    _path_checked: set[tuple[str, ...]] = field(default_factory=set)
    _rounds: int = 0
    _judge: SweepJudge = field(init=False)
    # Where the fabric is known: round 1 inside groups, uplinks crossed and named.
    fabric: Fabric | None = None
    ledger: Ledger | None = None
    _group_of: dict[str, tuple[str | None, ...]] = field(default_factory=dict)
    # Why the sweep names nothing from what it measured (one line), where it cannot tell a bad
    # node from the fabric it was not told: its report's `error`.
    refused: str | None = None
    # Without a fabric: nodes about to be named, each confirmed alone first (blind.quiet_pair).
    _provisional: dict[str, Suspect] = field(default_factory=dict)
    max_nodes_without_fabric: int = blind.MAX_NODES_WITHOUT_FABRIC

    def __post_init__(self) -> None:
        self._judge = SweepJudge(self.nodes, self.rules, self.history, self.fabric)
        if self.fabric is not None:
            self.ledger = self.ledger or Ledger(self.fabric)
            self._group_of = {n.name: self.fabric.group(n.name, n.rails) for n in self.nodes}

    @property
    def rounds(self) -> int:
        return self._rounds

    def next_round(self, available: Collection[str] | None = None) -> list[PairPlan]:
        """The pairs of the next round; empty when the sweep is done. `available`: the nodes
        still idle (the scheduler's answer now); the others leave the sweep."""
        if available is not None:
            self.gone |= {n.name for n in self.nodes} - set(available)
        if self._rounds >= self.max_rounds or self.refused is not None:
            return []
        if self._rounds == 0 and self.fabric is None:
            self.refused = blind.before(len(self.nodes), self.max_nodes_without_fabric)
            if self.refused is not None:
                return []
        if self._rounds == 0:
            nodes = [n for n in self.nodes if n.name not in self.gone]
            if self.fabric is not None:
                pairs, self.waiting = plan.grouped_first_round(
                    nodes, self._group_of, self.rng, self.odd
                )
            else:
                pairs, self.waiting = plan.first_round(nodes, self.rng, self.odd)
        else:
            pairs = self._locate_round()
        if pairs:
            self._rounds += 1
        return pairs

    def _settled(self) -> set[str]:
        return self.good | set(self.named)

    def _explained(self, group: tuple[str, ...]) -> bool:
        """A failed group is explained by a named member, the others cleared; or, all cleared,
        by a path check (a trio's path is not checked: it stays undecided)."""
        settled = self._settled()
        if not all(n in settled for n in group):
            return False
        if any(n in self.named for n in group):
            return True
        return group in self._path_checked

    def _locate_round(self) -> list[PairPlan]:
        for node in list(self._provisional):
            witnesses = self._partners.witnesses(sorted(self.good - self.gone))
            quiet = blind.quiet_pair(
                node,
                self._judge.node(node).rails,
                witnesses,
                self._partners.avoid().get(node, ()),
                self._rounds + 1,
            )
            if quiet is not None and node not in self.gone:
                return [self._confirming(quiet)]
            del self._provisional[node]  # no witness left: it stays undecided
        open_groups = [g for g in self._groups if not self._explained(g)]
        settled = self._settled()
        to_test = [
            ends
            for g in open_groups
            if (ends := tuple(n for n in g if n not in settled and n not in self.gone))
        ]
        # Ends that passed once only are tried with another partner before their pair's path
        # is blamed: a flapping end passes half the time, and its path "fails again".
        to_test += [
            ends
            for g in open_groups
            if len(g) == 2
            and all(n in self.good for n in g)
            and (ends := tuple(n for n in g if not self._vouched(n) and n not in self.gone))
        ]
        checks = [
            g
            for g in open_groups
            if len(g) == 2 and all(self._vouched(n) for n in g) and not self.gone & set(g)
        ]
        if self.fabric is None and checks:
            checks, to_test = checks[:1], []  # without a fabric, a path is measured alone
        available = [n for n in self.nodes if n.name not in self.gone]
        good = sorted(self.good - self.gone)
        pairs = plan.locate_round(
            available,
            self._rounds + 1,
            to_test,
            self._partners.witnesses(good),
            checks,
            self.rng,
            self._partners.avoid(),
            self._group_of or None,
            self._judge.class_levels(),
        )
        if self.ledger is not None and self.fabric is not None:
            pairs = uplink_plan.apart(self.fabric, pairs)
            free = [n for n in good if n not in self.named]
            pairs += uplink_plan.plan_round(
                self.ledger, available, free, pairs, self._rounds + 1, self.rng, self._group_of
            )
        return [self._confirming(pair) for pair in pairs]

    def _vouched(self, node: str) -> bool:
        return self._partners.vouched(node, self._judge.has_history)

    def _confirming(self, pair: PairPlan) -> PairPlan:
        if pair.purpose in CONFIRMING:
            return dataclasses.replace(pair, repeats=self.confirm_repeats)
        return pair

    def record(self, runs: Sequence[PairRun]) -> list[JudgedPair]:
        """Judge one round's runs and update what is known of each node."""
        good_before = set(self.good)
        judged = self._judge.judge_round(runs, [p.run for p in self.judged])
        self.judged.extend(judged)
        if self.ledger is not None:
            for pair in judged:
                for verdict in pair.rails:
                    self.ledger.record(
                        pair.run.plan.nodes,
                        verdict.rail,
                        verdict.passed,
                        pair.run.plan.round,
                        verdict.ratio,
                        pair.run.plan.purpose == "uplink",
                    )
            if self.ledger.mismatch is None and self.ledger.check_routing(self._rounds):
                log.warning("sweep: %s", self.ledger.mismatch)
            self.ledger.settle(self._rounds)
        if self.fabric is None and self._rounds == 1:
            self.refused = blind.after_first_round(
                [pair.passed for pair in judged if pair.passed is not None]
            )
            if self.refused is not None:
                return judged  # measured, reported, and judged no further
        for pair in judged:
            self._learn_outcome(pair, good_before)
        return judged

    def _learn_outcome(self, pair: JudgedPair, good_before: set[str]) -> None:
        nodes = pair.run.plan.nodes
        if pair.passed is None:
            return  # not measured: tried again while its nodes stay idle
        if pair.run.plan.purpose == "quiet":
            suspect = self._provisional.pop(nodes[0])
            if not pair.passed and set(pair.failed_rails) & set(suspect.rails):
                self.named[nodes[0]] = dataclasses.replace(suspect, round=pair.run.plan.round)
                return
        if pair.passed:
            self.good |= set(nodes)
            self._partners.passed(nodes)
            if pair.run.plan.purpose == "path":
                self._path_checked.add(_key(nodes))
            return
        if pair.run.plan.purpose in UPLINK_PURPOSES:
            return  # good nodes across leaves: the uplink ledger explains it
        failed = frozenset(pair.failed_rails)
        if pair.run.plan.purpose == "path":
            group = _key(nodes)
            self._path_checked.add(group)
            rails = failed & self._groups.get(group, failed)  # the same rail both times
            if rails:
                self.paths.append(
                    Suspect(
                        group[0],
                        tuple(sorted(rails)),
                        group[1],
                        pair.run.plan.round,
                        "path",
                        pair.worst_ratio,
                    )
                )
            return
        self._partners.failed(nodes)
        unknown = [n for n in nodes if self._partners.suspect_end(n, good_before)]
        if not unknown:
            return  # between witnesses: one failure of a node cleared before, noise
        if len(unknown) == 1 and len(nodes) > 1:
            rails = frozenset(r for r in failed if self._uplinks_clear(nodes, r, unknown[0]))
            if rails:
                self._against_good(unknown[0], rails, pair.run.plan.round, pair.worst_ratio)
            return
        for node in unknown:
            self._partners.failed_on(node, failed)
        self._groups[_key(unknown)] = failed

    def _uplinks_clear(self, nodes: Sequence[str], rail: int, node: str) -> bool:
        """A failure across leaves names a node only when every uplink its pair crossed has
        passed since (a slow uplink fails the cables beside it too)."""
        if self.ledger is None or self.fabric is None:
            return True
        hops = self.fabric.pair_hops(nodes, rail)
        return all(self.ledger.clear(h.link, Cable(node, rail)) for h in hops)

    def _against_good(
        self, node: str, failed: frozenset[int], round_: int, ratio: float | None
    ) -> None:
        """`node` failed with a good partner: named on the rails it failed on both times; on
        other rails only, it is tried again (noise on one rail, then on another, is noise)."""
        before = self._partners.rails_failed(node)
        rails = failed & before if before else failed
        if rails:
            suspect = Suspect(node, tuple(sorted(rails)), None, round_, "node", ratio)
            if self.fabric is None:
                self._provisional[node] = suspect  # named once a quiet round confirms it
                return
            self.named[node] = suspect
            if self.ledger is not None:
                self.ledger.named_cables |= {Cable(node, r) for r in rails}
        else:
            self._partners.failed_on(node, failed)

    def suspects(self) -> list[Suspect]:
        named = sorted(self.named.values(), key=lambda s: s.node) + list(self.paths)
        if self.ledger is not None:
            named += [
                Suspect(u.link.leaf, (u.rail,), u.link.spine, u.round, "uplink", u.ratio)
                for u in self.ledger.named.values()
            ]
            named += [
                Suspect(w.switch, (w.rail,), w.level, w.round, "switch", w.ratio)
                for w in self.ledger.named_switches.values()
            ]
        return named

    def ranked(self) -> list[Suspect]:
        """Suspects, the worst (lowest busbw over expected) first."""
        return sorted(self.suspects(), key=lambda s: s.ratio if s.ratio is not None else 1.0)

    def undecided(self) -> list[str]:
        """Nodes of failed pairs the sweep could neither clear nor name in its rounds: an end
        never measured again, or a pair whose path was not measured again."""
        return sorted(
            {n for g in self._groups if not self._explained(g) for n in g} - set(self.named)
        )

    def learn(self) -> None:
        """After the sweep: every pair that passed teaches both its ends' history."""
        self._judge.learn(self.judged, self.named)


def _key(nodes: Sequence[str]) -> tuple[str, ...]:
    return tuple(sorted(nodes))
