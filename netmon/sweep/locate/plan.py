"""Which nodes a sweep pairs, round by round. Pure: nodes, what earlier rounds found, and a
random generator in; pairs out. The simulator of large fabrics runs the same functions.

Round 1 is a random perfect matching: every node in one pair, every pair at once, so a sweep's
first round costs one pair's time whatever the cluster's size. Each pair measures all its rails
at once, rank k of one node with rank k of the other (rail-aligned: on a rail-optimised fabric
NIC k of every node hangs off leaf k). Later rounds pair each node of a failed pair with a node
that passed, so the end that fails again is named (docs/SWEEPS.md).
"""

from __future__ import annotations

import random
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

Odd = Literal["trio", "wait"]


@dataclass(frozen=True)
class SweepNode:
    name: str
    rails: int = 1  # ranks per node: one per NIC rail (GPU k with the NIC nearest it)
    leaf: str | None = None  # the switch its NICs hang off, where the fabric is known
    address: str | None = None  # where its daemon and its rank 0 are reached
    # Its node class: GPU type, features, NICs and link rate (netmon.sweep.locate.classes). Nodes
    # are matched and judged among their own class: a slower type is not a slow node.
    kind: str = ""


@dataclass(frozen=True)
class PairPlan:
    """One job: two nodes (three for an odd one out), all rails at once."""

    nodes: tuple[str, ...]
    round: int
    rails: int
    # match: round 1; locate: a failed end with a good node; path: a failed pair again;
    # uplink: across leaves through a candidate uplink; cover: across leaves, uplinks not crossed;
    # quiet: without a fabric, a node about to be named, again with a good node, alone.
    purpose: Literal["match", "locate", "path", "uplink", "cover", "quiet"] = "match"
    # Times the usual measurement (sweep.iters) it runs: a pair whose failure would name a
    # node or an uplink measures longer, so that one slow stretch does not name it.
    repeats: int = 1

    @property
    def label(self) -> str:
        return "-".join(self.nodes)


def rails_of(nodes: Iterable[SweepNode], names: Iterable[str]) -> int:
    by_name = {n.name: n for n in nodes}
    return min(by_name[name].rails for name in names)


def first_round(
    nodes: Sequence[SweepNode], rng: random.Random, odd: Odd = "trio"
) -> tuple[list[PairPlan], list[str]]:
    """A random perfect matching of `nodes`, and the node left out (odd count, odd="wait").

    Nodes of one class with the same number of rails are matched together first, so that
    every rail of a pair is measured and each pair is judged among its own class; what is
    left over is matched across (on the rails both have)."""
    groups: dict[tuple[int, str], list[SweepNode]] = {}
    for node in nodes:
        groups.setdefault((node.rails, node.kind), []).append(node)
    leftover: list[SweepNode] = []
    pairs: list[tuple[SweepNode, ...]] = []
    for rails in sorted(groups):
        members = list(groups[rails])
        rng.shuffle(members)
        if len(members) % 2:
            leftover.append(members.pop())
        pairs.extend(zip(members[0::2], members[1::2], strict=True))
    rng.shuffle(leftover)
    if len(leftover) % 2:
        last = leftover.pop()
        waiting = _place_odd(last, pairs, leftover, odd)
    else:
        waiting = []
    pairs.extend(zip(leftover[0::2], leftover[1::2], strict=True))
    plans = [_plan(group, 1, "match") for group in pairs]
    return plans, waiting


def grouped_first_round(
    nodes: Sequence[SweepNode],
    group_of: Mapping[str, Hashable],
    rng: random.Random,
    odd: Odd = "trio",
) -> tuple[list[PairPlan], list[str]]:
    """Round 1 where the fabric is known: a random matching inside each group of nodes that
    share every leaf (a scalable unit), so that round 1 crosses no uplink and no pair's busbw
    depends on another's; the nodes left over are matched across groups."""
    groups: dict[Hashable, list[SweepNode]] = {}
    for node in nodes:
        groups.setdefault(group_of.get(node.name), []).append(node)
    plans: list[PairPlan] = []
    leftover: list[SweepNode] = []
    for members in groups.values():
        inside, waiting = first_round(members, rng, "wait")
        plans += inside
        leftover += [n for n in members if n.name in set(waiting)]
    across, waiting = first_round(leftover, rng, odd)
    if waiting and odd == "trio" and plans:
        # One node over in all: it joins a pair of its own group, as first_round's trio.
        (last,) = waiting
        mates = [i for i, p in enumerate(plans) if group_of.get(p.nodes[0]) == group_of.get(last)]
        index = mates[-1] if mates else len(plans) - 1
        joined = plans[index]
        rails = min(joined.rails, *(n.rails for n in nodes if n.name == last))
        plans[index] = PairPlan((*joined.nodes, last), 1, rails, "match")
        waiting = []
    return plans + across, waiting


def _place_odd(
    last: SweepNode, pairs: list[tuple[SweepNode, ...]], leftover: list[SweepNode], odd: Odd
) -> list[str]:
    if odd == "wait":
        return [last.name]
    if pairs:
        pairs[-1] = (*pairs[-1], last)
    elif leftover:
        leftover.append(last)  # the odd one joins the last leftover pair as a third
        pairs.append(tuple(leftover[-3:]))
        del leftover[-3:]
    else:
        return [last.name]  # a lone node: nothing to pair it with
    return []


def _plan(group: Sequence[SweepNode], round_: int, purpose: str) -> PairPlan:
    return PairPlan(
        nodes=tuple(n.name for n in group),
        round=round_,
        rails=min(n.rails for n in group),
        purpose=purpose,  # type: ignore[arg-type]
    )


def locate_round(
    nodes: Sequence[SweepNode],
    round_: int,
    unresolved: Sequence[tuple[str, ...]],
    good: Iterable[str],
    path_checks: Iterable[tuple[str, ...]],
    rng: random.Random,
    failed_with: Mapping[str, set[str]] | None = None,
    group_of: Mapping[str, Hashable] | None = None,
    level_of: Mapping[str, float] | None = None,
) -> list[PairPlan]:
    """The next round of localisation.

    `unresolved`: the ends of each failed pair (or trio) not yet cleared or named. `good`:
    nodes known to pass. `path_checks`: failed pairs whose ends all passed with other nodes:
    measured again as they were, to tell a path at fault from a noisy measurement.

    One end of each failed pair is taken first, so every failed pair is split; each end goes
    with a good node while good nodes last, and the ends left over are paired across failed
    pairs: a pass then clears both. A node is never paired with one it failed with
    (`failed_with`): a slow path between them would read as a bad node. Where the fabric is
    known (`group_of`), a good node of the same group comes first: their pair crosses no
    uplink. A partner of a slower class (`level_of`: each class's level) never comes first:
    the pair would run at its speed and hide a cut on the faster end.
    """
    by_name = {n.name: n for n in nodes}
    free_good = [name for name in good if name in by_name]
    rng.shuffle(free_good)
    busy: set[str] = set()
    plans: list[PairPlan] = []
    for group in path_checks:
        if not busy & set(group):
            plans.append(_plan([by_name[n] for n in group], round_, "path"))
            busy |= set(group)
    free_good = [g for g in free_good if g not in busy]
    partner_of = _partners(unresolved, failed_with or {})
    order = _split_order(unresolved)
    waiting: list[str] = []
    for name in order:
        if name in busy:
            continue
        good_partner = _take(
            free_good,
            by_name[name],
            by_name,
            partner_of.get(name, set()),
            group_of or {},
            level_of or {},
        )
        if good_partner is None:
            waiting.append(name)
            continue
        plans.append(_plan([by_name[name], by_name[good_partner]], round_, "locate"))
        busy |= {name, good_partner}
    plans.extend(_cross(waiting, partner_of, by_name, round_, busy))
    return plans


def _partners(
    unresolved: Sequence[tuple[str, ...]], failed_with: Mapping[str, set[str]]
) -> Mapping[str, set[str]]:
    partner_of: dict[str, set[str]] = {name: set(peers) for name, peers in failed_with.items()}
    for group in unresolved:
        for name in group:
            partner_of.setdefault(name, set()).update(group)
    return partner_of


def _split_order(unresolved: Sequence[tuple[str, ...]]) -> list[str]:
    """First ends of every failed pair, then second ends: with few good nodes, each failed pair
    still gets one end measured against a good node."""
    seen: set[str] = set()
    order: list[str] = []
    for position in range(max((len(group) for group in unresolved), default=0)):
        for group in unresolved:
            if position >= len(group):
                continue
            name = group[position]
            if name not in seen:
                seen.add(name)
                order.append(name)
    return order


def _take(
    free_good: list[str],
    node: SweepNode,
    by_name: Mapping[str, SweepNode],
    avoid: set[str],
    group_of: Mapping[str, Hashable],
    level_of: Mapping[str, float],
) -> str | None:
    """The best good partner, never one in `avoid`: not of a slower class, with at least this
    node's rails, of its group (no uplink between them), of its class; else the best there is."""
    group = group_of.get(node.name)
    mine = level_of.get(node.kind)
    best: tuple[int, int] | None = None  # (rank, index): 0 is the best there is
    for index, name in enumerate(free_good):
        if name in avoid:
            continue
        partner = by_name[name]
        level = level_of.get(partner.kind)
        slower = partner.kind != node.kind and (mine is None or level is None or level < mine)
        rank = 8 * slower + 4 * (partner.rails < node.rails)
        rank += 2 * (group is None or group_of.get(name) != group)
        rank += partner.kind != node.kind
        if best is None or rank < best[0]:
            best = (rank, index)
            if rank == 0:
                break
    return free_good.pop(best[1]) if best is not None else None


def _cross(
    waiting: Sequence[str],
    partner_of: Mapping[str, set[str]],
    by_name: Mapping[str, SweepNode],
    round_: int,
    busy: set[str],
) -> list[PairPlan]:
    plans: list[PairPlan] = []
    pool = [name for name in waiting if name not in busy]
    while len(pool) >= 2:
        first = pool.pop(0)
        mate = next((m for m in pool if m not in partner_of.get(first, set())), None)
        if mate is None:
            continue
        pool.remove(mate)
        plans.append(_plan([by_name[first], by_name[mate]], round_, "locate"))
        busy |= {first, mate}
    return plans
