"""The fabric a sweep runs on: which leaf switch NIC k of each node hangs off, which spines each
leaf has an uplink to, and which uplink a flow between two nodes takes. Pure: names in, links out
(docs/SWEEPS.md, "Uplinks"). A link is a value (Cable, Uplink); its string form is for reports
and metric labels only.

A pair of nodes under one leaf crosses only their two cables; a pair on two leaves also crosses
one uplink of each leaf per direction, chosen by the routing:

- `table` (InfiniBand): the subnet manager's forwarding tables send every flow to one destination
  up the same port of a leaf. Without the operator's tables the model is fat-tree routing's
  destination-mod-k rule: the port is the destination's position modulo the leaf's uplinks.
- `ecmp` (RoCE, Ethernet): the leaf hashes each flow onto one of its equal-cost uplinks; the
  model is a fixed hash of (source, destination, rail), the same on every call.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import total_ordering
from typing import Literal, NamedTuple, TypeAlias

Routing = Literal["table", "ecmp"]
ROUTINGS: tuple[Routing, ...] = ("table", "ecmp")


@total_ordering
@dataclass(frozen=True, slots=True)
class Cable:
    """A node's cable on one rail: its NIC to its leaf (node/railK)."""

    node: str
    rail: int

    def __str__(self) -> str:
        return f"{self.node}/rail{self.rail}"

    def __lt__(self, other: Cable) -> bool:
        return str(self) < str(other)  # as its name sorts (rail10 before rail2), as Uplink


@total_ordering
@dataclass(frozen=True, slots=True)
class Uplink:
    """A leaf's uplink to one spine (leaf~spine)."""

    leaf: str
    spine: str

    def __str__(self) -> str:
        return f"{self.leaf}~{self.spine}"

    def __lt__(self, other: Uplink) -> bool:
        # As its name sorts (su11~x before su1~x), not as (leaf, spine): the order candidates
        # are measured in, and so the rounds, stay those of the sweeps recorded before.
        return str(self) < str(other)

    @property
    def ends(self) -> tuple[str, str]:
        """The switches at its two ends: its leaf and its spine."""
        return self.leaf, self.spine


Link: TypeAlias = Cable | Uplink  # what one measurement of a pair-rail depends on


class Hop(NamedTuple):
    """One direction of one uplink, as a flow uses it: up from the leaf, or down into it (a
    tuple: planning a round hashes hundreds of thousands of them)."""

    leaf: str
    spine: str
    up: bool

    @property
    def link(self) -> Uplink:
        return Uplink(self.leaf, self.spine)


@dataclass(frozen=True)
class Fabric:
    leaf_of: Mapping[tuple[str, int], str]  # (node, rail) -> the leaf its NIC hangs off
    spines: Mapping[str, tuple[str, ...]]  # leaf -> the spines of its uplinks, in port order
    routing: Routing = "table"
    # The operator's forwarding tables, where given: leaf -> destination node -> spine.
    tables: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    seed: int = 0  # the ECMP hash's seed
    order: Mapping[str, int] = field(default_factory=dict)  # destination index for mod-k
    _rails: dict[str, int] = field(default_factory=dict, compare=False, repr=False)

    def rail_of(self, leaf: str) -> int:
        """The rail a leaf carries (rail-optimised: each leaf carries one)."""
        if not self._rails:
            for (_, rail), found in self.leaf_of.items():
                self._rails.setdefault(found, rail)
        return self._rails.get(leaf, 0)

    def leaf(self, node: str, rail: int) -> str | None:
        return self.leaf_of.get((node, rail))

    def group(self, node: str, rails: int) -> tuple[str | None, ...]:
        """Its leaf on every rail: nodes of one group (a scalable unit) share every leaf."""
        return tuple(self.leaf(node, rail) for rail in range(rails))

    def spine(self, src: str, dst: str, rail: int) -> str | None:
        """The spine the flow src -> dst crosses on `rail`; None under one leaf or unknown."""
        here, there = self.leaf(src, rail), self.leaf(dst, rail)
        if here is None or there is None or here == there:
            return None
        ports = self.spines.get(here, ())
        if not ports:
            return None
        given = self.tables.get(here, {}).get(dst)
        if given is not None:
            return given
        if self.routing == "ecmp":
            key = f"{self.seed}:{src}:{dst}:{rail}".encode()
            return ports[zlib.crc32(key) % len(ports)]
        return ports[self.order.get(dst, 0) % len(ports)]

    def hops(self, src: str, dst: str, rail: int) -> tuple[Hop, ...]:
        """The uplink directions the flow src -> dst uses on `rail`: up from the source's leaf,
        down into the destination's (a spine has one link to each leaf)."""
        spine = self.spine(src, dst, rail)
        if spine is None:
            return ()
        here, there = self.leaf(src, rail), self.leaf(dst, rail)
        assert here is not None and there is not None
        return (Hop(here, spine, True), Hop(there, spine, False))

    def pair_hops(self, nodes: Sequence[str], rail: int) -> tuple[Hop, ...]:
        """Every direction of every uplink a pair's (or a ring's) all_reduce uses on a rail:
        a ring sends from each member to the next."""
        ring = list(nodes)
        hops: list[Hop] = []
        for i, src in enumerate(ring):
            hops.extend(self.hops(src, ring[(i + 1) % len(ring)], rail))
            if len(ring) == 2:
                hops.extend(self.hops(ring[1], ring[0], rail))
                break
        return tuple(hops)

    def links(self, nodes: Sequence[str], rail: int) -> frozenset[Link]:
        """Every link a pair's measurement on `rail` depends on: its cables and uplinks."""
        cables: list[Link] = [Cable(n, rail) for n in nodes]
        return frozenset(cables + [h.link for h in self.pair_hops(nodes, rail)])

    def crosses(self, nodes: Sequence[str], rail: int) -> bool:
        leaves = {self.leaf(n, rail) for n in nodes}
        return None not in leaves and len(leaves) > 1

    def all_uplinks(self) -> list[Uplink]:
        return [Uplink(leaf, spine) for leaf, spines in self.spines.items() for spine in spines]


def rail_optimised(
    groups: Mapping[str, Sequence[str]],
    rails: int,
    spines: int,
    routing: Routing = "table",
    seed: int = 0,
) -> Fabric:
    """A rail-optimised two-tier fabric: each group (a scalable unit) has one leaf per rail,
    NIC k of its nodes on its rail-k leaf, and every rail-k leaf has one uplink to each of the
    `spines` rail-k spines."""
    leaf_of: dict[tuple[str, int], str] = {}
    spine_names = {
        rail: tuple(_railed(f"spine{j + 1}", rail, rails) for j in range(spines))
        for rail in range(rails)
    }
    uplinks: dict[str, tuple[str, ...]] = {}
    order: dict[str, int] = {}
    for group, members in groups.items():
        for index, node in enumerate(members):
            order[node] = index
            for rail in range(rails):
                leaf = _railed(group, rail, rails)
                leaf_of[(node, rail)] = leaf
                uplinks[leaf] = spine_names[rail]
    return Fabric(leaf_of, uplinks, routing, seed=seed, order=order)


def _railed(name: str, rail: int, rails: int) -> str:
    return name if rails == 1 else f"{name}/rail{rail}"


def flat(nodes: Sequence[str], rails: int) -> Fabric:
    """A cluster under one switch per rail (sweep.fabric: flat): every pair under one leaf,
    no uplink to contend on."""
    return rail_optimised({"flat": list(nodes)}, rails, 0)
