"""The fabric from where it is written down: Slurm's tree or block topology (topology.conf, or
what `scontrol show topology` prints) or netmon's own fabric file (docs/SWEEPS.md, "Uplinks").
A block (`BlockName=b1 Nodes=n[1-18]`, topology/block) is a group of nodes round 1 stays in;
how blocks connect is not told, so no uplink between them is named.

Slurm's topology.conf (topology/tree) lists each leaf switch with its nodes and each upper
switch with the switches under it (`SwitchName=leaf1 Nodes=n[1-32]`, `SwitchName=spine1
Switches=leaf[1-8]`). It knows one switch per node: on a rail-optimised fabric that is the
node's scalable unit, and rail k of it is taken to hang off that unit's rail-k leaf, whose
uplinks go to the rail-k plane of the same spines. A fabric that is not so is written in a
fabric file instead:

    routing: table            # or ecmp
    leaves:
      su1-r0: {rail: 0, nodes: "n[001-032]", spines: "sp[01-32]-r0"}
    tables:                   # optional: the subnet manager's choices, leaf -> node -> spine
      su1-r0: {n040: sp07-r0}
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from netmon import documents
from netmon.errors import describe_yaml_error
from netmon.sweep.locate import hostlist
from netmon.sweep.locate.fabric import ROUTINGS, Fabric, Routing


def parse_topology(text: str, rails: int, routing: Routing = "table") -> Fabric:
    """topology.conf or `scontrol show topology` output; a ValueError names the line."""
    members: dict[str, list[str]] = {}
    children: dict[str, list[str]] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        fields = dict(_field(token, number) for token in line.split())
        if set(fields) == {"blocksizes"}:
            continue  # topology/block: the sizes jobs are placed in, not the fabric
        # topology/block (BlockName=b1 Nodes=...): each block a group, its uplinks not told.
        name = fields.get("switchname") or fields.get("blockname")
        if name is None:
            raise ValueError(f"topology line {number}: no SwitchName= or BlockName= in {line!r}")
        if "switches" in fields:
            children[name] = hostlist.expand(fields["switches"])
        elif "nodes" in fields:
            # Only a leaf's: `scontrol show topology` lists an upper switch's nodes too
            # (every node below it), beside its Switches=.
            members[name] = hostlist.expand(fields["nodes"])
    spines_of: dict[str, list[str]] = {}
    for spine, below in children.items():
        for leaf in below:
            spines_of.setdefault(leaf, []).append(spine)
    leaf_of: dict[tuple[str, int], str] = {}
    uplinks: dict[str, tuple[str, ...]] = {}
    order: dict[str, int] = {}
    for leaf, nodes in members.items():
        for rail in range(rails):
            railed = _railed(leaf, rail, rails)
            uplinks[railed] = tuple(_railed(s, rail, rails) for s in spines_of.get(leaf, ()))
            for index, node in enumerate(nodes):
                leaf_of[(node, rail)] = railed
                order[node] = index
    return Fabric(leaf_of, uplinks, routing, order=order)


def _field(token: str, number: int) -> tuple[str, str]:
    key, sep, value = token.partition("=")
    if not sep:
        raise ValueError(f"topology line {number}: {token!r} is not key=value")
    return key.lower(), value


def _railed(name: str, rail: int, rails: int) -> str:
    return name if rails == 1 else f"{name}/rail{rail}"


def parse_fabric_file(document: Mapping[str, Any]) -> Fabric:
    """netmon's fabric file, already read from YAML; a ValueError names the field."""
    routing = document.get("routing", "table")
    if routing not in ROUTINGS:
        raise ValueError(f"fabric routing: {routing!r} is not one of {', '.join(ROUTINGS)}")
    leaves = document.get("leaves")
    if not isinstance(leaves, Mapping) or not leaves:
        raise ValueError("fabric leaves: a mapping of leaf name to {rail, nodes, spines}")
    leaf_of: dict[tuple[str, int], str] = {}
    uplinks: dict[str, tuple[str, ...]] = {}
    order: dict[str, int] = {}
    for leaf, spec in leaves.items():
        if not isinstance(spec, Mapping) or "nodes" not in spec:
            raise ValueError(f"fabric leaves.{leaf}: needs nodes (a hostlist)")
        rail = int(spec.get("rail", 0))
        uplinks[str(leaf)] = tuple(hostlist.expand(str(spec.get("spines", ""))))
        for index, node in enumerate(hostlist.expand(str(spec["nodes"]))):
            leaf_of[(node, rail)] = str(leaf)
            order.setdefault(node, index)
    tables = document.get("tables") or {}
    if not isinstance(tables, Mapping) or not all(isinstance(v, Mapping) for v in tables.values()):
        raise ValueError("fabric tables: a mapping of leaf to {destination node: spine}")
    return Fabric(
        leaf_of,
        uplinks,
        routing,
        tables={str(k): dict(v) for k, v in tables.items()},
        seed=int(document.get("ecmp_seed", 0)),
        order=order,
    )


def load(path: Path, rails: int, routing: Routing = "table") -> Fabric:
    """A topology.conf (it has SwitchName= or BlockName=) or a fabric file (YAML)."""
    text = path.read_text()
    if "switchname=" in text.lower() or "blockname=" in text.lower():
        return parse_topology(text, rails, routing)
    try:
        document = documents.load(text)
    except Exception as exc:  # YAMLError (a key twice, say), and what PyYAML's constructors raise
        raise ValueError(f"{path}: {describe_yaml_error(exc)}") from None
    if not isinstance(document, Mapping):
        raise ValueError(f"{path}: neither a topology.conf nor a fabric file (YAML mapping)")
    return parse_fabric_file(document)
