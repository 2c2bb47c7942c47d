"""NVML's answers about a node, as plain values, turned into the topology model.

Pure: netmon.gpu.nvml asks NVML and hands the answers here, so tests drive the translation with
literal values. The NVML enum values used are restated here, so this module needs no pynvml; the
tests check them against pynvml's.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from netmon.topology.model import (
    NODE,
    NOT_AVAILABLE,
    PHB,
    PIX,
    PXB,
    SYS,
    Gpu,
    Pair,
    PathClass,
    Topology,
)

# nvmlGpuTopologyLevel_t. INTERNAL means two GPUs on one board (Tesla K80): `nvidia-smi topo -h`
# describes that level as "a single PCIe switch on a dual GPU board", so it is PIX, never X.
NVML_TOPOLOGY_INTERNAL = 0
NVML_TOPOLOGY_SINGLE = 10
NVML_TOPOLOGY_MULTIPLE = 20
NVML_TOPOLOGY_HOSTBRIDGE = 30
NVML_TOPOLOGY_NODE = 40
NVML_TOPOLOGY_SYSTEM = 50
_ANCESTOR_CLASS: dict[int, PathClass] = {
    NVML_TOPOLOGY_INTERNAL: PIX,
    NVML_TOPOLOGY_SINGLE: PIX,
    NVML_TOPOLOGY_MULTIPLE: PXB,
    NVML_TOPOLOGY_HOSTBRIDGE: PHB,
    NVML_TOPOLOGY_NODE: NODE,
    NVML_TOPOLOGY_SYSTEM: SYS,
}
# nvmlIntNvLinkDeviceType_t
NVML_NVLINK_DEVICE_TYPE_GPU = 0
NVML_NVLINK_DEVICE_TYPE_IBMNPU = 1
NVML_NVLINK_DEVICE_TYPE_SWITCH = 2
NVML_NVLINK_DEVICE_TYPE_UNKNOWN = 0xFF


@dataclass(frozen=True)
class NvLinkReading:
    """One active NVLink of a GPU."""

    remote_bus_id: str | None  # PCI bus id of the far end; None when NVML could not say
    remote_type: int | None = None  # nvmlIntNvLinkDeviceType_t; None on drivers without it


@dataclass(frozen=True)
class GpuTopologyReading:
    index: int
    uuid: str | None
    pci_bus_id: str | None
    numa: int | None
    cpu_affinity: str | None
    links: tuple[NvLinkReading, ...] = ()  # active links only


def _bus_key(bus_id: str | None) -> tuple[int, ...] | str | None:
    """A bus id comparable across NVML's spellings ("00000000:18:00.0", legacy "0000:18:00.0")."""
    if bus_id is None:
        return None
    match = re.match(
        r"^\s*(?:([0-9a-fA-F]+):)?([0-9a-fA-F]+):([0-9a-fA-F]+)\.([0-9a-fA-F]+)\s*$", bus_id
    )
    if not match:
        return bus_id.strip().lower()
    domain, bus, device, function = match.groups()
    return (int(domain or "0", 16), int(bus, 16), int(device, 16), int(function, 16))


def _nvlinks(
    a: GpuTopologyReading,
    b: GpuTopologyReading,
    gpu_buses: set[tuple[int, ...] | str] | None,
) -> int:
    """Bonded NVLinks between two GPUs: links from one to the other, or, on an NVSwitch board,
    the links both have into the switches (nvidia-smi shows NV18 for every HGX H100 pair)."""

    def direct(src: GpuTopologyReading, dst: GpuTopologyReading) -> int:
        target = _bus_key(dst.pci_bus_id)
        if target is None:
            return 0
        return sum(1 for link in src.links if _bus_key(link.remote_bus_id) == target)

    def to_switch(gpu: GpuTopologyReading) -> int:
        count = 0
        for link in gpu.links:
            if link.remote_type == NVML_NVLINK_DEVICE_TYPE_SWITCH:
                count += 1
            elif link.remote_type in (None, NVML_NVLINK_DEVICE_TYPE_UNKNOWN):
                # No type from the driver: a far end that is no GPU of ours is a switch, if every
                # GPU's address is known. (An IBM NPU, the POWER CPU's end, is typed on every
                # driver that has such links.)
                key = _bus_key(link.remote_bus_id)
                count += gpu_buses is not None and key is not None and key not in gpu_buses
        return count

    ab, ba = direct(a, b), direct(b, a)
    if ab or ba:
        # Both ends see the same links; if one end's remote info failed, trust the other.
        return min(ab, ba) if ab and ba else max(ab, ba)
    return min(to_switch(a), to_switch(b))


def topology_from_readings(
    gpus: Sequence[GpuTopologyReading],
    common_ancestor: Mapping[Pair, int | None],
) -> Topology:
    """The topology NVML describes: `common_ancestor[(a, b)]` is nvmlDeviceGetTopologyCommonAncestor
    for GPUs a and b (either order; None or absent when NVML could not say, which gives N/A).
    NVLink, where present, wins over the PCIe class, as in `nvidia-smi topo -m`. NVML sees no
    NICs, so the result has none.
    """
    ordered = sorted(gpus, key=lambda g: g.index)
    keys = [_bus_key(g.pci_bus_id) for g in ordered]
    buses = {key for key in keys if key is not None} if None not in keys else None
    path: dict[Pair, PathClass] = {}
    for n, a in enumerate(ordered):
        for b in ordered[n + 1 :]:
            links = _nvlinks(a, b, buses)
            if links:
                found = PathClass.nvlink(links)
            else:
                level = common_ancestor.get((a.index, b.index))
                if level is None:
                    level = common_ancestor.get((b.index, a.index))
                found = (
                    NOT_AVAILABLE if level is None else _ANCESTOR_CLASS.get(level, NOT_AVAILABLE)
                )
            path[(a.index, b.index)] = path[(b.index, a.index)] = found
    return Topology(
        gpus=tuple(Gpu(g.index, g.uuid, g.pci_bus_id, g.numa, g.cpu_affinity) for g in ordered),
        path=path,
    )


def cpu_list(mask: Iterable[int], bits_per_word: int = 64) -> str | None:
    """A CPU (or NUMA node) bitmask, as NVML returns it in words, written as nvidia-smi writes
    it: "0-51,104-155". None for an empty mask."""
    members = [
        word_index * bits_per_word + bit
        for word_index, word in enumerate(mask)
        for bit in range(bits_per_word)
        if int(word) >> bit & 1
    ]
    if not members:
        return None
    spans: list[str] = []
    first = last = members[0]
    for member in [*members[1:], None]:
        if member is not None and member == last + 1:
            last = member
            continue
        spans.append(str(first) if first == last else f"{first}-{last}")
        if member is not None:
            first = last = member
    return ",".join(spans)


def single_node(mask: Iterable[int], bits_per_word: int = 64) -> int | None:
    """The NUMA node of a node mask with exactly one node set; None otherwise."""
    listed = cpu_list(mask, bits_per_word)
    return int(listed) if listed is not None and listed.isdigit() else None
