"""Uplinks named from node pairs: which links each measured pair crossed, which of them a
failure leaves unexplained, and which pairs to measure next. Pure (docs/SWEEPS.md, "Uplinks").

Every measured rail of a pair is an observation over the links it depends on (its two cables
and, across leaves, one uplink of each leaf per direction: netmon.sweep.fabric). A link is
clear once it passed at least as often as it failed. A failed observation whose other links are
all clear blames the one left; an uplink blamed by two observations (two different pairs, so
two different partners' uplinks, one of them a pair placed to measure it again) and failing
more often than passing is named: a hitting set of
size one per failure, confirmed, as NetBouncer confirms a link with paths through good switches.

Rounds cross uplinks without sharing one: a pair is placed only where none of its flows uses a
direction of an uplink another flow of the round uses, so a pair's busbw is its path's, not its
neighbours'. Candidates of failed observations are measured again first (each with a partner
whose own uplink is clear), then uplinks no flow has crossed yet.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Collection, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from netmon.sweep.fabric import Fabric, Hop
from netmon.sweep.plan import PairPlan, SweepNode

CONFIRM = 2  # isolated failures that name an uplink
# The sweep's failures across leaves (their cables clear) that need more uplinks than this to
# explain, under the routing model, say the model is not the fabric's: flows the planner kept
# apart shared real uplinks, and contention reads as bad uplinks everywhere. The share is of
# the uplinks crossed so far; the floor leaves room for a few real faults at once.
MISMATCH_MIN_UPLINKS = 5
MISMATCH_SHARE = 0.02
# ... and more switches than this: a bad leaf or spine slows every uplink it has, which takes
# many uplinks but one switch to explain.
MISMATCH_MIN_SWITCHES = 2
CANDIDATE_TRIES = 48  # partners tried per candidate uplink in one round
# Uncovered uplinks a later cover round tries to place a pair through: bounds its planning
# time (each try is up to CANDIDATE_TRIES partners); what is left waits a round.
COVER_EACH_MAX = 2048


@dataclass(frozen=True)
class Observation:
    nodes: tuple[str, ...]
    rail: int
    links: frozenset[str]
    passed: bool
    round: int
    ratio: float | None = None
    confirming: bool = False  # a pair placed to measure a candidate uplink again


@dataclass(frozen=True)
class NamedUplink:
    link: str
    leaf: str
    spine: str
    rail: int
    round: int
    ratio: float | None  # the worst isolated failure's busbw over its expected level


@dataclass
class Ledger:
    """What every measured pair-rail said about the links it crossed."""

    fabric: Fabric
    confirm: int = CONFIRM
    observations: list[Observation] = field(default_factory=list)
    passes: dict[str, int] = field(default_factory=dict)
    fails: dict[str, list[int]] = field(default_factory=dict)  # link -> failed observations
    crossed: set[str] = field(default_factory=set)  # uplinks some observation crossed
    named: dict[str, NamedUplink] = field(default_factory=dict)
    named_cables: set[str] = field(default_factory=set)  # the node sweep's named cables
    # Why the routing model does not fit the fabric, once a round showed it: from then on no
    # uplink is named or measured again, and those named before are withdrawn.
    mismatch: str | None = None

    def record(
        self,
        nodes: Sequence[str],
        rail: int,
        passed: bool,
        round_: int,
        ratio: float | None,
        confirming: bool = False,
    ) -> None:
        links = self.fabric.links(nodes, rail)
        index = len(self.observations)
        self.observations.append(
            Observation(tuple(nodes), rail, links, passed, round_, ratio, confirming)
        )
        for link in links:
            if passed:
                self.passes[link] = self.passes.get(link, 0) + 1
            else:
                self.fails.setdefault(link, []).append(index)
        self.crossed |= {h.link for h in self.fabric.pair_hops(nodes, rail)}

    def clear(self, link: str, given: str | None = None) -> bool:
        """Passed at least once, and at least as often as it failed; failures shared with
        `given` are that link's to explain (a bad uplink fails the cables beside it too)."""
        passes = self.passes.get(link, 0)
        fails = self.fails.get(link, ())
        if given is not None:
            fails = [i for i in fails if given not in self.observations[i].links]
        return passes >= 1 and passes >= len(fails)

    def _bad(self, link: str) -> bool:
        return len(self.fails.get(link, ())) > self.passes.get(link, 0)

    def _uplinks(self, obs: Observation) -> set[str]:
        return {link for link in obs.links if "~" in link}

    def isolated(self, link: str) -> list[Observation]:
        """Failed observations of `link` whose every other link is clear."""
        found = []
        for index in self.fails.get(link, ()):
            obs = self.observations[index]
            if all(self.clear(other, link) for other in obs.links if other != link):
                found.append(obs)
        return found

    def check_routing(self, round_: int) -> str | None:
        """After a round: do the sweep's failures across leaves fit a few bad uplinks, or a few
        bad switches, under the routing model? When they need more of both (greedy hitting
        sets), the model is not the fabric's. Counted over every round so far: a collision or
        two per round adds up."""
        if self.mismatch is not None:
            return self.mismatch
        unexplained = [
            self._uplinks(obs)
            for obs in self._failed()
            if self._uplinks(obs)
            and not self._explained(obs)
            and all(self.clear(link) for link in obs.links if "~" not in link)
        ]
        limit = max(MISMATCH_MIN_UPLINKS, math.ceil(MISMATCH_SHARE * len(self.crossed)))
        needed = hitting_set_size(unexplained)
        if needed <= limit:
            return None
        switches = hitting_set_size([_switches(links) for links in unexplained])
        if switches <= MISMATCH_MIN_SWITCHES:
            return None  # a leaf or a spine bad on all its uplinks: the candidates show which
        self.mismatch = (
            f"by round {round_}: {len(unexplained)} failures across leaves, with their cables "
            f"good, need {needed} uplinks (more than {limit}) and {switches} switches (more "
            f"than {MISMATCH_MIN_SWITCHES}) to explain under sweep.routing={self.fabric.routing}:"
            " the fabric routes otherwise (ECMP with another hash, or forwarding tables to give "
            "in the fabric file), so no uplink is named"
        )
        self.named.clear()
        return self.mismatch

    def settle(self, round_: int) -> list[NamedUplink]:
        """Name the uplinks the observations so far confirm; returns the newly named."""
        if self.mismatch is not None:
            return []
        new = []
        for link in sorted({u for obs in self._failed() for u in self._uplinks(obs)}):
            if link in self.named or not self._bad(link):
                continue
            blamed = _apart(self.isolated(link))
            # Two pairs with no node in common, one of them placed (and measured longer) to
            # confirm: two noisy pairs of one round that share an uplink do not name it, nor
            # one flapping cable measured twice through it.
            if len(blamed) < self.confirm or not any(obs.confirming for obs in blamed):
                continue
            leaf, _, spine = link.partition("~")
            ratios = [obs.ratio for obs in blamed if obs.ratio is not None]
            named = NamedUplink(
                link, leaf, spine, blamed[0].rail, round_, min(ratios) if ratios else None
            )
            self.named[link] = named
            new.append(named)
        return new

    def _failed(self) -> Iterable[Observation]:
        return (obs for obs in self.observations if not obs.passed)

    def _explained(self, obs: Observation) -> bool:
        """By a named uplink or node, or as noise: every link it crossed has passed since at
        least as often as it failed."""
        if obs.links & set(self.named) or obs.links & self.named_cables:
            return True
        return all(self.clear(link) for link in obs.links)

    def seen_failing(self, link: str) -> set[str]:
        """Nodes of the failed observations of `link`."""
        return {n for i in self.fails.get(link, ()) for n in self.observations[i].nodes}

    def candidates(self) -> list[str]:
        """Uplinks of failed observations still unexplained, worst first: measure these again
        (none once the routing model is known not to fit)."""
        if self.mismatch is not None:
            return []
        found: dict[str, int] = {}
        for obs in self._failed():
            if self._explained(obs):
                continue
            for link in self._uplinks(obs):
                if link not in self.named and not self.clear(link):
                    found[link] = found.get(link, 0) + 1
        return sorted(found, key=lambda link: (-found[link], link))

    def undecided(self) -> list[str]:
        return self.candidates()

    def uncovered(self) -> list[str]:
        if self.mismatch is not None:
            return []  # crossing more of them would tell nothing
        return [link for link in self.fabric.all_uplinks() if link not in self.crossed]


def _apart(observations: Sequence[Observation]) -> list[Observation]:
    """Observations no two of which share a node (the first of each clash kept)."""
    kept: list[Observation] = []
    for obs in observations:
        if not any(set(obs.nodes) & set(other.nodes) for other in kept):
            kept.append(obs)
    return kept


def _switches(links: Collection[str]) -> set[str]:
    """The leaves and spines of uplinks (leaf~spine)."""
    return {switch for link in links for switch in link.split("~")}


def hitting_set_size(sets: Sequence[Collection[str]]) -> int:
    """How many elements a greedy pick needs to touch every set (within ln n + 1 times the
    optimum, and the optimum itself when one element or a few disjoint ones do)."""
    left = [set(s) for s in sets if s]
    picked = 0
    while left:
        counts: dict[str, int] = {}
        for members in left:
            for element in members:
                counts[element] = counts.get(element, 0) + 1
        best = max(sorted(counts), key=lambda element: counts[element])
        left = [members for members in left if best not in members]
        picked += 1
    return picked


@dataclass
class RoundLoad:
    """The uplink directions this round's flows already use."""

    fabric: Fabric
    used: set[Hop] = field(default_factory=set)

    def hops(self, nodes: Sequence[str], rails: int) -> list[Hop]:
        return [h for rail in range(rails) for h in self.fabric.pair_hops(nodes, rail)]

    def fitting(self, nodes: Sequence[str], rails: int) -> list[Hop] | None:
        """The pair's uplink directions if none is used yet (nor twice by the pair itself);
        None at the first clash (most tries clash early)."""
        found: list[Hop] = []
        seen: set[Hop] = set()
        for rail in range(rails):
            for hop in self.fabric.pair_hops(nodes, rail):
                if hop in self.used or hop in seen:
                    return None
                seen.add(hop)
                found.append(hop)
        return found

    def take(self, nodes: Sequence[str], rails: int) -> None:
        self.used |= set(self.hops(nodes, rails))


@dataclass
class Pool:
    """The nodes a round may still place: by leaf, with their rails and groups."""

    names: list[str]  # in random order
    by_name: Mapping[str, SweepNode]
    group_of: Mapping[str, Hashable]
    fabric: Fabric
    placed: set[str] = field(default_factory=set)
    _under: dict[str, list[str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in self.names:
            for rail in range(self.by_name[name].rails):
                leaf = self.fabric.leaf(name, rail)
                if leaf is not None:
                    self._under.setdefault(leaf, []).append(name)

    def rails(self, names: Sequence[str]) -> int:
        return min(self.by_name[n].rails for n in names)

    def under(self, leaf: str) -> list[str]:
        return [n for n in self._under.get(leaf, ()) if n not in self.placed]

    def elsewhere(self, leaf: str, rail: int, rng: random.Random, count: int) -> list[str]:
        """Up to `count` free nodes, at random, not under `leaf` on `rail`."""
        picked: list[str] = []
        for name in rng.sample(self.names, min(len(self.names), count * 2)):
            if name in self.placed or self.fabric.leaf(name, rail) in (leaf, None):
                continue
            picked.append(name)
            if len(picked) == count:
                break
        return picked

    def free(self) -> int:
        return len(self.names) - len(self.placed)


def plan_round(
    ledger: Ledger,
    nodes: Sequence[SweepNode],
    free: Collection[str],
    load: RoundLoad,
    round_: int,
    rng: random.Random,
    group_of: Mapping[str, Hashable] | None = None,
) -> list[PairPlan]:
    """Pairs of `free` (nodes known good, not in another pair this round): first one per
    candidate uplink, then pairs that cross uplinks no flow has crossed yet."""
    by_name = {n.name: n for n in nodes}
    rails = max((n.rails for n in nodes), default=1)
    groups = group_of or {n.name: ledger.fabric.group(n.name, rails) for n in nodes}
    names = [name for name in free if name in by_name]
    rng.shuffle(names)
    pool = Pool(names, by_name, groups, ledger.fabric)
    plans = _retests(ledger, pool, load, round_, rng)
    uncovered = ledger.uncovered()
    if len(uncovered) * 2 > len(ledger.fabric.all_uplinks()):
        plans += _cover_groups(pool, load, round_)
    elif uncovered:
        plans += _cover_each(ledger, uncovered, pool, load, round_, rng)
    return plans


def _retests(
    ledger: Ledger, pool: Pool, load: RoundLoad, round_: int, rng: random.Random
) -> list[PairPlan]:
    """One pair per candidate uplink. The worst candidate of each spine is measured with a
    partner whose own uplink is clear; the others beside it (a failure through a bad uplink
    makes the partner leaf's uplink a candidate too) with any partner but through the worst:
    their passing clears them, and the worst then has clear partners in the next round."""
    fabric = ledger.fabric
    candidates = ledger.candidates()
    worst: dict[str, str] = {}
    for link in candidates:
        worst.setdefault(link.partition("~")[2], link)
    plans = []
    for link in candidates:
        leaf, _, spine = link.partition("~")
        rail = fabric.rail_of(leaf)
        # Only nodes not yet in a failure of this uplink: a node's cable measured through it
        # twice would confirm its own flapping as the uplink's fault.
        seen = ledger.seen_failing(link)
        here = [n for n in pool.under(leaf) if n not in seen]
        if worst[spine] == link:
            partner_ok = _clear_beside(ledger, leaf)
        else:
            partner_ok = _not_through(set(worst.values()))
        found = _through(ledger, pool, here, (leaf, rail, spine), load, rng, seen, partner_ok)
        if found is not None:
            plans.append(_place(found, pool, load, round_, "uplink"))
    return plans


def _clear_beside(ledger: Ledger, leaf: str) -> Callable[[Sequence[Hop]], bool]:
    """The partner's uplinks (those not at `leaf`) have all passed at least as often as failed."""
    return lambda hops: all(ledger.clear(h.link) for h in hops if h.leaf != leaf)


def _not_through(links: Collection[str]) -> Callable[[Sequence[Hop]], bool]:
    return lambda hops: not any(h.link in links for h in hops)


def _through(
    ledger: Ledger,
    pool: Pool,
    here: Sequence[str],
    where: tuple[str, int, str],
    load: RoundLoad,
    rng: random.Random,
    avoid: Collection[str] | None = None,
    partner_ok: Callable[[Sequence[Hop]], bool] | None = None,
) -> tuple[tuple[str, str], list[Hop]] | None:
    """A pair (one node under the uplink's leaf, one elsewhere) one of whose flows on the
    rail goes through the spine, fitting the round. With `avoid` (a retest), the partner is
    none of those; `partner_ok` judges the pair's uplink directions."""
    fabric = ledger.fabric
    leaf, rail, spine = where
    for x in here[:CANDIDATE_TRIES]:
        for y in pool.elsewhere(leaf, rail, rng, CANDIDATE_TRIES):
            if avoid is not None and y in avoid:
                continue
            hops = fabric.pair_hops((x, y), rail)
            if not any(h.spine == spine for h in hops):
                continue
            if partner_ok is not None and not partner_ok(hops):
                continue
            rails = pool.rails((x, y))
            if rails <= rail:
                continue  # a node with fewer rails does not measure this one
            fits = load.fitting((x, y), rails)
            if fits is not None:
                return (x, y), fits
    return None


def _cover_groups(pool: Pool, load: RoundLoad, round_: int) -> list[PairPlan]:
    """The first cover: groups matched at random, and each node of a group paired with the
    first node of its partner group whose flows fit the round. Under destination-mod-k
    routing every such pair fits (each destination has its own port), so one round crosses
    every uplink of both groups; under ECMP the hash decides, and what is left waits."""
    members: dict[Hashable, list[str]] = {}
    for name in pool.names:
        if name not in pool.placed:
            members.setdefault(pool.group_of.get(name), []).append(name)
    keys = list(members)  # in the pool's random order
    plans = []
    for a, b in zip(keys[0::2], keys[1::2], strict=False):
        partners = list(members[b])
        for x in members[a]:
            for y in partners:
                fits = load.fitting((x, y), pool.rails((x, y)))
                if fits is not None:
                    partners.remove(y)
                    plans.append(_place(((x, y), fits), pool, load, round_, "cover"))
                    break
    return plans


def _cover_each(
    ledger: Ledger,
    uncovered: Sequence[str],
    pool: Pool,
    load: RoundLoad,
    round_: int,
    rng: random.Random,
) -> list[PairPlan]:
    """Later covers: one pair through each uplink no flow has crossed yet."""
    fabric = ledger.fabric
    plans = []
    todo = list(uncovered)
    rng.shuffle(todo)
    covered: set[str] = set()
    for link in todo[:COVER_EACH_MAX]:
        if pool.free() < 2:
            break
        if link in covered:
            continue
        leaf, _, spine = link.partition("~")
        rail = fabric.rail_of(leaf)
        found = _through(ledger, pool, pool.under(leaf), (leaf, rail, spine), load, rng)
        if found is not None:
            covered |= {h.link for h in found[1]}
            plans.append(_place(found, pool, load, round_, "cover"))
    return plans


def _place(
    found: tuple[tuple[str, str], list[Hop]],
    pool: Pool,
    load: RoundLoad,
    round_: int,
    purpose: str,
) -> PairPlan:
    names, hops = found
    load.used |= set(hops)
    pool.placed |= set(names)
    rails = pool.rails(names)
    return PairPlan(nodes=names, round=round_, rails=rails, purpose=purpose)  # type: ignore[arg-type]
