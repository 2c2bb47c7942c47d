"""Uplinks named from node pairs: which links each measured pair crossed, which of them a
failure leaves unexplained, and which pairs to measure next. Pure (docs/SWEEPS.md, "Uplinks").

Every measured rail of a pair is an observation over the links it depends on (its two cables
and, across leaves, one uplink of each leaf per direction: netmon.sweep.locate.fabric). A link is
clear once it passed at least as often as it failed. A failed observation whose other links are
all clear blames the one left; an uplink blamed by two observations (two different pairs, so
two different partners' uplinks, one of them a pair placed to measure it again) and failing
more often than passing is named: a hitting set of
size one per failure, confirmed, as NetBouncer confirms a link with paths through good switches.

Which pairs a round measures across leaves is netmon.sweep.locate.uplink_plan's; a leaf or spine
slow on all its uplinks is netmon.sweep.locate.switches'.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from netmon.sweep.locate import switches
from netmon.sweep.locate.fabric import Cable, Fabric, Link, Uplink

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

Element = TypeVar("Element", str, Uplink)  # what a hitting set picks: uplinks, or switches


@dataclass(frozen=True)
class Observation:
    nodes: tuple[str, ...]
    rail: int
    links: frozenset[Link]
    passed: bool
    round: int
    ratio: float | None = None
    confirming: bool = False  # a pair placed to measure a candidate uplink again


@dataclass(frozen=True)
class NamedUplink:
    link: Uplink
    rail: int
    round: int
    ratio: float | None  # the worst isolated failure's busbw over its expected level


@dataclass
class Ledger:
    """What every measured pair-rail said about the links it crossed."""

    fabric: Fabric
    confirm: int = CONFIRM
    observations: list[Observation] = field(default_factory=list)
    passes: dict[Link, int] = field(default_factory=dict)
    fails: dict[Link, list[int]] = field(default_factory=dict)  # link -> failed observations
    crossed: set[Uplink] = field(default_factory=set)  # uplinks some observation crossed
    named: dict[Uplink, NamedUplink] = field(default_factory=dict)
    named_cables: set[Cable] = field(default_factory=set)  # the node sweep's named cables
    # Leaves and spines slow on all their uplinks (netmon.sweep.locate.switches): their uplinks'
    # failures are theirs, and none of those uplinks is named alone.
    named_switches: dict[str, switches.NamedSwitch] = field(default_factory=dict)
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

    def clear(self, link: Link, given: Link | None = None) -> bool:
        """Passed at least once, and at least as often as it failed; failures shared with
        `given` are that link's to explain (a bad uplink fails the cables beside it too)."""
        passes = self.passes.get(link, 0)
        fails = self.fails.get(link, ())
        if given is not None:
            fails = [i for i in fails if given not in self.observations[i].links]
        return passes >= 1 and passes >= len(fails)

    def _bad(self, link: Uplink) -> bool:
        return len(self.fails.get(link, ())) > self.passes.get(link, 0)

    def _uplinks(self, obs: Observation) -> set[Uplink]:
        return {link for link in obs.links if isinstance(link, Uplink)}

    def isolated(self, link: Uplink) -> list[Observation]:
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
            and all(self.clear(link) for link in obs.links if isinstance(link, Cable))
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
        self._name_switches(round_)
        new = []
        for link in sorted({u for obs in self._failed() for u in self._uplinks(obs)}):
            if link in self.named or self._on_named_switch(link) or not self._bad(link):
                continue
            blamed = switches.apart(self.isolated(link))
            # Pairs with no node in common, `confirm` of them placed (and measured longer) to
            # confirm it: two noisy pairs of one round that share an uplink do not name it,
            # nor one flapping cable measured twice through it, nor a noisy cover pair and a
            # retest that met a flapping cable.
            if sum(obs.confirming for obs in blamed) < self.confirm:
                continue
            ratios = [obs.ratio for obs in blamed if obs.ratio is not None]
            named = NamedUplink(link, blamed[0].rail, round_, min(ratios) if ratios else None)
            self.named[link] = named
            new.append(named)
        return new

    def _name_switches(self, round_: int) -> None:
        found = switches.tally(self.observations, self._cables_clear_but)
        for named in switches.name(found, self.named_switches, round_):
            self.named_switches[named.switch] = named

    def _cables_clear_but(self, obs: switches.Seen, switch: str) -> bool:
        """The observation's cables have passed at least as often as they failed, not
        counting failures through `switch`."""
        for link in obs.links:
            if isinstance(link, Uplink):
                continue
            passes = self.passes.get(link, 0)
            fails = [
                i
                for i in self.fails.get(link, ())
                if not any(switch in u.ends for u in self._uplinks(self.observations[i]))
            ]
            if passes < 1 or passes < len(fails):
                return False
        return True

    def _on_named_switch(self, link: Uplink) -> bool:
        return any(end in self.named_switches for end in link.ends)

    def _failed(self) -> Iterable[Observation]:
        return (obs for obs in self.observations if not obs.passed)

    def _explained(self, obs: Observation) -> bool:
        """By a named uplink or node, or as noise: every link it crossed has passed since at
        least as often as it failed."""
        if obs.links & set(self.named) or obs.links & self.named_cables:
            return True
        if any(self._on_named_switch(link) for link in self._uplinks(obs)):
            return True
        return all(self.clear(link) for link in obs.links)

    def seen_failing(self, link: Uplink) -> set[str]:
        """Nodes of the failed observations of `link`."""
        return {n for i in self.fails.get(link, ()) for n in self.observations[i].nodes}

    def candidates(self) -> list[Uplink]:
        """Uplinks of failed observations still unexplained, worst first: measure these again
        (none once the routing model is known not to fit)."""
        if self.mismatch is not None:
            return []
        found: dict[Uplink, int] = {}
        for obs in self._failed():
            if self._explained(obs):
                continue
            for link in self._uplinks(obs):
                if (
                    link not in self.named
                    and not self._on_named_switch(link)
                    and not self.clear(link)
                ):
                    found[link] = found.get(link, 0) + 1
        return sorted(found, key=lambda link: (-found[link], link))

    def undecided(self) -> list[Uplink]:
        return self.candidates()

    def uncovered(self) -> list[Uplink]:
        if self.mismatch is not None:
            return []  # crossing more of them would tell nothing
        return [link for link in self.fabric.all_uplinks() if link not in self.crossed]


def _switches(links: Collection[Uplink]) -> set[str]:
    """The leaves and spines of uplinks."""
    return {switch for link in links for switch in link.ends}


def hitting_set_size(sets: Sequence[Collection[Element]]) -> int:
    """How many elements a greedy pick needs to touch every set (within ln n + 1 times the
    optimum, and the optimum itself when one element or a few disjoint ones do)."""
    left = [set(s) for s in sets if s]
    picked = 0
    while left:
        counts: dict[Element, int] = {}
        for members in left:
            for element in members:
                counts[element] = counts.get(element, 0) + 1
        best = max(sorted(counts), key=lambda element: counts[element])
        left = [members for members in left if best not in members]
        picked += 1
    return picked
