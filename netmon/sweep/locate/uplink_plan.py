"""Which pairs a round measures across leaves, for the uplinks. Pure (docs/SWEEPS.md,
"Uplinks"; what they said is netmon.sweep.locate.uplinks' Ledger).

Rounds cross uplinks without sharing one: a pair is placed only where none of its flows uses a
direction of an uplink another flow of the round uses, so a pair's busbw is its path's, not its
neighbours'. Candidates of failed observations are measured again first (each with a partner
whose own uplink is clear), then uplinks no flow has crossed yet.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Collection, Hashable, Mapping, Sequence
from dataclasses import dataclass, field

from netmon.sweep.locate.fabric import Fabric, Hop, Uplink
from netmon.sweep.locate.plan import PairPlan, SweepNode
from netmon.sweep.locate.uplinks import Ledger

CANDIDATE_TRIES = 48  # partners tried per candidate uplink in one round
# Uncovered uplinks a later cover round tries to place a pair through: bounds its planning
# time (each try is up to CANDIDATE_TRIES partners); what is left waits a round.
COVER_EACH_MAX = 2048


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


def apart(fabric: Fabric, pairs: Sequence[PairPlan]) -> list[PairPlan]:
    """The round's pairs whose flows share no uplink direction with an earlier one: two
    locate pairs from one leaf to destinations on the same port would halve each other
    and name both healthy ends. Those left out wait for the next round."""
    load = RoundLoad(fabric)
    kept = []
    for pair in pairs:
        if load.fitting(pair.nodes, pair.rails) is None:
            continue
        load.take(pair.nodes, pair.rails)
        kept.append(pair)
    return kept


def plan_round(
    ledger: Ledger,
    nodes: Sequence[SweepNode],
    free: Collection[str],
    taken: Sequence[PairPlan],
    round_: int,
    rng: random.Random,
    group_of: Mapping[str, Hashable] | None = None,
) -> list[PairPlan]:
    """Pairs of `free` (nodes known good) that no pair `taken` in this round already uses:
    first one per candidate uplink, then pairs that cross uplinks no flow has crossed yet; no
    uplink direction used twice in the round."""
    load = RoundLoad(ledger.fabric)
    for pair in taken:
        load.take(pair.nodes, pair.rails)
    busy = {n for pair in taken for n in pair.nodes}
    by_name = {n.name: n for n in nodes}
    rails = max((n.rails for n in nodes), default=1)
    groups = group_of or {n.name: ledger.fabric.group(n.name, rails) for n in nodes}
    names = [name for name in free if name in by_name and name not in busy]
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
    worst: dict[str, Uplink] = {}
    for link in candidates:
        worst.setdefault(link.spine, link)
    plans = []
    for link in candidates:
        rail = fabric.rail_of(link.leaf)
        # Only nodes not yet in a failure of this uplink: a node's cable measured through it
        # twice would confirm its own flapping as the uplink's fault.
        seen = ledger.seen_failing(link)
        here = [n for n in pool.under(link.leaf) if n not in seen]
        if worst[link.spine] == link:
            partner_ok = _clear_beside(ledger, link.leaf)
        else:
            partner_ok = _not_through(set(worst.values()))
        found = _through(ledger, pool, here, (link, rail), load, rng, seen, partner_ok)
        if found is not None:
            plans.append(_place(found, pool, load, round_, "uplink"))
    return plans


def _clear_beside(ledger: Ledger, leaf: str) -> Callable[[Sequence[Hop]], bool]:
    """The partner's uplinks (those not at `leaf`) have all passed at least as often as failed."""
    return lambda hops: all(ledger.clear(h.link) for h in hops if h.leaf != leaf)


def _not_through(links: Collection[Uplink]) -> Callable[[Sequence[Hop]], bool]:
    return lambda hops: not any(h.link in links for h in hops)


def _through(
    ledger: Ledger,
    pool: Pool,
    here: Sequence[str],
    where: tuple[Uplink, int],
    load: RoundLoad,
    rng: random.Random,
    avoid: Collection[str] | None = None,
    partner_ok: Callable[[Sequence[Hop]], bool] | None = None,
) -> tuple[tuple[str, str], list[Hop]] | None:
    """A pair (one node under the uplink's leaf, one elsewhere) one of whose flows on the
    rail goes through the spine, fitting the round. With `avoid` (a retest), the partner is
    none of those; `partner_ok` judges the pair's uplink directions."""
    fabric = ledger.fabric
    link, rail = where
    for x in here[:CANDIDATE_TRIES]:
        for y in pool.elsewhere(link.leaf, rail, rng, CANDIDATE_TRIES):
            if avoid is not None and y in avoid:
                continue
            hops = fabric.pair_hops((x, y), rail)
            if not any(h.spine == link.spine for h in hops):
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
    uncovered: Sequence[Uplink],
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
    covered: set[Uplink] = set()
    for link in todo[:COVER_EACH_MAX]:
        if pool.free() < 2:
            break
        if link in covered:
            continue
        rail = fabric.rail_of(link.leaf)
        found = _through(ledger, pool, pool.under(link.leaf), (link, rail), load, rng)
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
