"""What a sweep may claim without its fabric. Pure (docs/SWEEPS.md, "Without the fabric").

Without the fabric the planner matches nodes at random across the whole cluster, so on more
than one leaf most pairs cross leaf-to-spine uplinks at once; under static routing their flows
collide, and contention reads as slow nodes: on a fault-free 1,024-node fabric a third of round
1's pairs fail (bench/sweep_sim.py --planner-fabric none). A sweep cannot tell those from bad
nodes, so it does not try: it refuses up front where the nodes are too many to share one leaf,
and names nobody where round 1 fails more pairs than faults explain. A node that failed with two
good partners is named only after a third pair with a good node, measured alone in its round
(a "quiet" round), fails too: alone, its flows have every uplink they cross to themselves.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from netmon.sweep.locate.plan import PairPlan

# More nodes than this may span leaves: a 64-port leaf holds 32 nodes under a non-blocking
# fat tree (64 with none), and a rail-optimised scalable unit 32.
MAX_NODES_WITHOUT_FABRIC = 64
# Round 1 failures that faults do not explain: more pairs than this share of them, and at
# least this many (a few bad nodes on a small cluster are a few failed pairs).
CONTENTION_SHARE = 0.15
CONTENTION_MIN_PAIRS = 4
HOW = (
    "give the sweep its fabric (sweep.fabric: slurm, with TopologyPlugin=topology/tree or "
    "topology/block; a topology.conf or fabric file; on Kubernetes the nodes' topology "
    "labels)"
)


def before(nodes: int, limit: int = MAX_NODES_WITHOUT_FABRIC) -> str | None:
    """Why a sweep of `nodes` nodes without a fabric refuses to start, or None."""
    if nodes <= limit:
        return None
    return (
        f"no fabric known and {nodes} nodes may span more than one leaf switch (more than "
        f"sweep.max_nodes_without_fabric={limit}): pairs across leaves would contend on "
        f"uplinks the sweep cannot see and read as bad nodes; {HOW}"
    )


def after_first_round(outcomes: Sequence[bool]) -> str | None:
    """Why round 1's failures (False) name nobody: too many for faults, or None."""
    failed = sum(1 for passed in outcomes if not passed)
    if failed < CONTENTION_MIN_PAIRS or failed <= CONTENTION_SHARE * len(outcomes):
        return None
    return (
        f"no fabric known and round 1 failed {failed} of {len(outcomes)} pairs: that is "
        f"contention on uplinks the sweep cannot see, not {failed} bad pairs, so nobody is "
        f"named; {HOW}"
    )


def quiet_pair(
    node: str, rails: int, witnesses: Sequence[str], avoid: Collection[str], round_: int
) -> PairPlan | None:
    """The round that confirms `node` without a fabric: it with a witness it was never
    measured with, and no other pair."""
    partner = next((w for w in witnesses if w != node and w not in avoid), None)
    if partner is None:
        return None
    return PairPlan((node, partner), round_, rails, "quiet")
