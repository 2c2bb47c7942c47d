"""The topology and its pair plan for people (a terminal table) and for programs (JSON)."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from typing import Any

from netmon.topology.model import Pair, Topology


def _fit(line: str, width: int | None) -> list[str]:
    """A prose line in lines of at most `width` (continuations indented), or whole."""
    if width is None or len(line) <= width:
        return [line]
    indent = " " * (len(line) - len(line.lstrip()) + 4)
    return textwrap.wrap(line, width, subsequent_indent=indent, break_on_hyphens=False)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _columns(table: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    return [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in table
    ]


def _matrix(topology: Topology, nics: Sequence[str]) -> list[str]:
    """The rows of `nvidia-smi topo -m`: GPU to GPU, then to the NICs named, then affinities."""
    table: list[list[str]] = [
        ["", *(f"GPU{i}" for i in topology.indices), *nics, "CPU Affinity", "NUMA Affinity"]
    ]
    for gpu in topology.gpus:
        cells = [str(topology.path_between(gpu.index, other)) for other in topology.indices]
        cells += [str(topology.nic_path.get((gpu.index, nic), "?")) for nic in nics]
        table.append(
            [
                f"GPU{gpu.index}",
                *cells,
                gpu.cpu_affinity or "N/A",
                "N/A" if gpu.numa is None else str(gpu.numa),
            ]
        )
    return _columns(table)


def _nic_matrix(topology: Topology, nics: Sequence[str]) -> list[str]:
    table = [["", *nics]]
    for gpu in topology.gpus:
        cells = [str(topology.nic_path.get((gpu.index, nic), "?")) for nic in nics]
        table.append([f"GPU{gpu.index}", *cells])
    return _columns(table)


def render_text(
    topology: Topology, rounds: Sequence[Sequence[Pair]], width: int | None = None
) -> str:
    """The matrix, the path classes with their counts, and the pair plan, for a terminal.

    With a `width`, a matrix wider than it (8 GPUs beside 9 NICs is 135 columns) shows the GPU
    to NIC paths as a table of their own under the GPU one, and long lists wrap; None: one
    matrix as nvidia-smi prints it, every line whole.
    """
    nics = [nic.name for nic in topology.nics]
    lines = _matrix(topology, nics)
    if width is not None and max(map(len, lines)) > width and nics:
        lines = [*_matrix(topology, []), "", "GPU to NIC paths:", *_nic_matrix(topology, nics)]

    devices = [f"{nic.name}: {nic.device}" for nic in topology.nics if nic.device]
    if devices:
        lines += ["", *_fit("NICs: " + ", ".join(devices), width)]
    ids = [g for g in topology.gpus if g.uuid or g.pci_bus_id]
    if ids:
        lines += [""] + [f"GPU{g.index}: {g.uuid or '?'} at {g.pci_bus_id or '?'}" for g in ids]
    asymmetric = topology.asymmetric_pairs()
    if asymmetric:
        listed = ", ".join(f"GPU{a}-GPU{b}" for a, b in asymmetric)
        lines += ["", *_fit("Asymmetric cells (the farther class is used): " + listed, width)]

    classes = topology.classes()
    lines += ["", "Path classes (GPU pairs):"]
    lines += [f"  {path}: {count}" for path, count in classes.items()] or ["  none"]
    planned = sum(len(members) for members in rounds)
    lines += [
        "",
        f"Pair plan: {_count(planned, 'pair')} in {_count(len(rounds), 'round')}",
    ]
    for n, members in enumerate(rounds, start=1):
        listed = "  ".join(f"{a}-{b} ({topology.path_between(a, b)})" for a, b in members)
        lines += _fit(f"  round {n}: {listed}", width)
    return "\n".join(lines) + "\n"


def to_json(topology: Topology, rounds: Sequence[Sequence[Pair]]) -> dict[str, Any]:
    """The topology and plan as JSON-ready data. A contract: keys are only ever added.

    gpus: [{index, uuid?, pci_bus_id?, numa?, cpu_affinity?}] (keys present when known);
    nics: [{name, device?, paths: [{gpu, path}]}];
    pairs: [{gpu, peer_gpu, path}] for gpu < peer_gpu; classes: {path: count};
    rounds: [[[gpu, peer_gpu], ...], ...].
    """
    gpus: list[dict[str, Any]] = []
    for gpu in topology.gpus:
        entry: dict[str, Any] = {"index": gpu.index}
        for key in ("uuid", "pci_bus_id", "numa", "cpu_affinity"):
            value = getattr(gpu, key)
            if value is not None:
                entry[key] = value
        gpus.append(entry)
    nics: list[dict[str, Any]] = []
    for nic in topology.nics:
        item: dict[str, Any] = {"name": nic.name}
        if nic.device is not None:
            item["device"] = nic.device
        item["paths"] = [
            {"gpu": g, "path": str(topology.nic_path[(g, nic.name)])}
            for g in topology.indices
            if (g, nic.name) in topology.nic_path
        ]
        nics.append(item)
    return {
        "gpus": gpus,
        "nics": nics,
        "pairs": [
            {"gpu": a, "peer_gpu": b, "path": str(path)}
            for (a, b), path in topology.pairs().items()
        ],
        "classes": {str(path): count for path, count in topology.classes().items()},
        "rounds": [[[a, b] for a, b in members] for members in rounds],
    }
