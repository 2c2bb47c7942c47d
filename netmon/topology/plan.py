"""Which GPU pairs to probe together: every pair once, in rounds of pairs that share no GPU and,
as far as the topology tells, no PCIe uplink, so that one pair's traffic does not slow another's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from netmon.topology.model import PIX, PXB, SELF, Gpu, Pair, PathClass, Topology

AvoidTogether = Callable[[Pair, Pair], bool]


def _circle_rounds(n: int) -> list[list[Pair]]:
    """The circle method: fix one seat, rotate the rest. With n odd a phantom seat gives a bye."""
    if n < 2:
        return []
    seats = n + n % 2
    ring = list(range(seats))
    rounds = []
    for _ in range(seats - 1):
        pairs = [
            (min(ring[i], ring[-1 - i]), max(ring[i], ring[-1 - i]))
            for i in range(seats // 2)
            if ring[i] < n and ring[-1 - i] < n
        ]
        rounds.append(sorted(pairs))
        ring = [ring[0], ring[-1], *ring[1:-1]]
    return rounds


def plan_pair_rounds(n_gpus: int, avoid_together: AvoidTogether | None = None) -> list[list[Pair]]:
    """Every unordered pair of GPUs 0..n_gpus-1 exactly once, in rounds of disjoint pairs.

    Without a constraint this is the circle method and minimal: n-1 rounds of n/2 pairs for n
    even, n rounds of (n-1)/2 for n odd (one GPU sits out each round). `avoid_together(p, q)`
    says two pairs must not run in one round (asked both ways round). Such pairs are repaired
    by moving: each circle round keeps the pairs that fit, and every pair moved out goes into
    the first round where it fits, or a new round at the end. That is a greedy colouring, not a
    minimal one, but the unconstrained plan comes out unchanged.
    """
    if n_gpus < 0:
        raise ValueError(f"n_gpus must be >= 0, got {n_gpus}")
    rounds = _circle_rounds(n_gpus)
    if avoid_together is None:
        return rounds

    def fits(pair: Pair, members: list[Pair]) -> bool:
        return all(
            not set(pair) & set(other)
            and not avoid_together(pair, other)
            and not avoid_together(other, pair)
            for other in members
        )

    planned: list[list[Pair]] = []
    moved: list[Pair] = []
    for pairs in rounds:
        kept: list[Pair] = []
        for pair in pairs:
            (kept if fits(pair, kept) else moved).append(pair)
        planned.append(kept)
    for pair in moved:
        for members in planned:
            if fits(pair, members):
                members.append(pair)
                break
        else:
            planned.append([pair])
    return [sorted(members) for members in planned]


class _Groups:
    """Union-find over GPUs and NICs."""

    def __init__(self) -> None:
        self._parent: dict[object, object] = {}

    def find(self, item: object) -> object:
        parent = self._parent.setdefault(item, item)
        if parent != item:
            parent = self._parent[item] = self.find(parent)
        return parent

    def union(self, a: object, b: object) -> None:
        self._parent[self.find(a)] = self.find(b)


def shares_uplink(topology: Topology, *, through_host: bool = False) -> AvoidTogether:
    """A predicate for plan_pair_rounds: True when two pairs would share a PCIe uplink.

    The heuristic, from the path classes alone. In a PCIe tree, devices that are PIX to each
    other sit under one switch (the "leaf"); devices that are PIX or PXB to each other sit under
    one root port, below the host bridge (the "tree"); both relations are transitive, and NICs
    link GPUs into the same groups (two GPUs PIX to one NIC share its switch). A pair's traffic
    climbs out of whatever it must leave:

    - NV# or PIX: nothing (NVLink, or peer-to-peer inside one switch);
    - PXB: the leaf-switch uplink of each GPU;
    - PHB, NODE, SYS (and SOC, N/A, unknown: assumed far): leaf and tree uplinks of each GPU.

    Two pairs conflict when they climb through a common uplink. With `through_host` every pair
    goes through host memory and so climbs both uplinks of both GPUs: that is the PCIe-path
    probe (NCCL_P2P_DISABLE=1, SHM), and any pair whose GPUs cannot do P2P (`topo -p2p` GNS).
    Limit: `topo -m` shows NV# instead of the PCIe class of NVLink pairs, so GPUs sharing a
    switch only behind NVLink are not seen as sharing it.
    """
    leaf, tree = _Groups(), _Groups()
    edges: list[tuple[object, object, PathClass]] = [
        (("gpu", a), ("gpu", b), path) for (a, b), path in topology.pairs().items()
    ]
    edges += [(("gpu", g), ("nic", nic), path) for (g, nic), path in topology.nic_path.items()]
    for a, b, path in edges:
        if path == PIX:
            leaf.union(a, b)
        if path in (PIX, PXB):
            tree.union(a, b)

    def climbs(pair: Pair, path: PathClass) -> frozenset[object]:
        leaves = {("leaf", leaf.find(("gpu", gpu))) for gpu in pair}
        trees = {("tree", tree.find(("gpu", gpu))) for gpu in pair}
        if through_host:
            return frozenset(leaves | trees)
        if path.is_nvlink or path in (PIX, SELF):
            return frozenset()
        if path == PXB:
            return frozenset(leaves)
        return frozenset(leaves | trees)

    uplinks = {pair: climbs(pair, path) for pair, path in topology.pairs().items()}
    nothing: frozenset[object] = frozenset()

    def avoid(p: Pair, q: Pair) -> bool:
        first = uplinks.get((min(p), max(p)), nothing)
        second = uplinks.get((min(q), max(q)), nothing)
        return bool(first & second)

    return avoid


def plan_rounds(topology: Topology, *, through_host: bool = False) -> list[list[Pair]]:
    """plan_pair_rounds over the topology's GPUs (by their indices) with shares_uplink."""
    indices = topology.indices
    avoid = shares_uplink(topology, through_host=through_host)

    def by_index(p: Pair) -> Pair:
        return (indices[p[0]], indices[p[1]])

    rounds = plan_pair_rounds(len(indices), lambda p, q: avoid(by_index(p), by_index(q)))
    return [[by_index(pair) for pair in members] for members in rounds]


def uniform(members: int, code: str = "SYS") -> Topology:
    """`members` ranks all joined by one path class: CPU ranks on a node without GPUs."""
    if members < 2:
        raise ValueError("pair probes need at least 2 members")
    path = PathClass.parse(code)
    gpus = tuple(Gpu(index) for index in range(members))
    links = {(a, b): path for a in range(members) for b in range(members) if a != b}
    return Topology(gpus, path=links)


def idle_set(topology: Topology | None, idle: Sequence[int], min_gpus: int) -> tuple[int, ...]:
    """The GPUs a collective on the idle set runs on (NVML indexes), or () when too few are idle.

    The largest NVLink island among the idle GPUs, when it has `min_gpus`: its traffic then takes
    NVLink only, as it would on the whole node. Equal islands: the one on fewest NUMA nodes, then
    the lowest indexes. Otherwise every idle GPU, when there are `min_gpus` of them (a node
    without NVLink, or islands too small: the collective crosses PCIe as such a node's must).
    """
    chosen = tuple(sorted(set(idle)))
    if len(chosen) < min_gpus:
        return ()
    if topology is None:
        return chosen
    islands = _Groups()
    for a in chosen:
        for b in chosen:
            if a < b and topology.is_nvlink(a, b):
                islands.union(a, b)
    members: dict[object, list[int]] = {}
    for gpu in chosen:
        members.setdefault(islands.find(gpu), []).append(gpu)

    def preference(island: list[int]) -> tuple[int, int, list[int]]:
        numa = {topology.gpu(g).numa for g in island}
        return (-len(island), len(numa), island)

    best = min(members.values(), key=preference)
    return tuple(best) if len(best) >= min_gpus else chosen
