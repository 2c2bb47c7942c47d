"""The hardware a node's references were learned on: its GPUs, its NICs and the node itself.

A replaced part is new hardware, and a reference learned on the old one means nothing for it:
BaselineBook.adopt_identity forgets the series that depend on a part that changed. Each part is
a set of ids that change only when the hardware does:
- gpus: NVML's GPU UUIDs (nvmlDeviceGetUUID), from the topology the daemon reads at start;
- nics: an InfiniBand/RoCE HCA's node GUID (/sys/class/infiniband/<dev>/node_guid), and a
  physical network interface's permanent address (/sys/class/net/<if>/address where
  addr_assign_type is 0, NET_ADDR_PERM; sysfs-class-net(5)). Virtual interfaces (veth, bridges,
  a pod's network namespace) have no device and are left out, and so are SR-IOV virtual
  functions (device/physfn), which come and go as pods take them;
- node: the board's SMBIOS UUID (/sys/class/dmi/id/product_uuid, readable by root only).
A part that cannot be read is left out, never compared as empty; an id that is only missing (a
GPU off the bus) is a fault, not new hardware: only a replacement (an id gone and a new one
come) forgets (BaselineBook.adopt_identity).
"""

from __future__ import annotations

from pathlib import Path

from netmon.topology.model import Topology


def read_identity(
    topology: Topology | None, sys_root: Path = Path("/sys")
) -> dict[str, tuple[str, ...]]:
    parts = {
        "gpus": _gpus(topology),
        "nics": tuple(sorted(_hca_guids(sys_root) + _permanent_addresses(sys_root))),
        "node": _read(sys_root / "class/dmi/id/product_uuid"),
    }
    return {part: ids for part, ids in parts.items() if ids}


def _gpus(topology: Topology | None) -> tuple[str, ...]:
    if topology is None:
        return ()
    uuids = [topology.gpu(i).uuid for i in topology.indices]
    return tuple(sorted(u for u in uuids if u))


def _hca_guids(sys_root: Path) -> list[str]:
    found = []
    for device in _children(sys_root / "class/infiniband"):
        guid = _read(device / "node_guid")
        found += [g for g in guid if g.strip("0:")]  # the id, not the name udev gave it
    return found


def _permanent_addresses(sys_root: Path) -> list[str]:
    found = []
    for interface in _children(sys_root / "class/net"):
        device = interface / "device"
        # SR-IOV virtual functions (device/physfn) come and go as pods take them.
        if not device.exists() or (device / "physfn").exists():
            continue
        if _read(interface / "addr_assign_type") != ("0",):
            continue
        found += list(_read(interface / "address"))
    return found


def _children(directory: Path) -> list[Path]:
    try:
        return sorted(directory.iterdir())
    except OSError:
        return []


def _read(path: Path) -> tuple[str, ...]:
    try:
        text = path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return ()
    return (text,) if text else ()
