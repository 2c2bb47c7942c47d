"""A sweep rank on GPUs, set up as a real site runs NCCL between nodes (docs/SWEEPS.md, "GPU
pairs"): bound to the CPUs nearest its GPU, on the InfiniBand HCA nearest it, and its NCCL log
read afterwards for the transport NCCL really used.

- **CPUs.** srun gives the task `--cpus-per-task` cores; without binding, the rank's host
  thread (which spins waiting for the GPU) and NCCL's proxy thread may sit on the far socket.
  The rank narrows its affinity to its GPU's CPUs as NVML gives them (nvmlDeviceGetCpuAffinity),
  where that leaves any of the CPUs it was given.
- **HCA.** Rail k is GPU k with the NIC nearest it: the InfiniBand device whose PCI path shares
  the longest prefix with the GPU's (/sys/class/infiniband/<dev>/device, as NCCL's own topology
  search ranks them). NCCL_IB_HCA is set to `=<dev>` (an exact match) unless the node's config
  sets it.
- **Transport.** NCCL_DEBUG=INFO with the INIT and ENV subsystems to a file (the operator's own
  NCCL_DEBUG settings are kept, netmon.probe.debugenv); after the run the log must show NET/IB
  between the nodes, on that HCA, or the pair is `transport_mismatch`: its busbw measured
  another network (a fallback to TCP sockets reads as a slow node otherwise).

Nothing here has run on a GPU (docs/SWEEPS.md, "What is not checked here").
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from netmon.probe import crossnode, nccl_debug
from netmon.probe.debugenv import debug_env

_USING = re.compile(r"NET/IB : Using (.*?)(?:;|$)")
_DEVICE = re.compile(r"\[\d+\]([A-Za-z0-9_.-]+?)(?::\d+)?/")


@dataclass(frozen=True)
class Binding:
    cpus: tuple[int, ...]  # the CPUs the rank runs on, after binding
    hca: str | None  # the HCA NCCL_IB_HCA names (netmon's choice, or the site's exact one)


def cpu_set(cpu_list: str | None) -> set[int]:
    """ "0-51,104-155" (nvidia-smi's and NVML's translation) as a set; empty for none."""
    found: set[int] = set()
    for part in (cpu_list or "").split(","):
        low, _, high = part.strip().partition("-")
        if low.isdigit():
            found.update(range(int(low), int(high or low) + 1))
    return found


def _sysfs_bus_id(bus_id: str) -> str:
    """NVML's "00000000:18:00.0" as sysfs names it ("0000:18:00.0")."""
    domain, _, rest = bus_id.lower().partition(":")
    return f"{domain[-4:].rjust(4, '0')}:{rest}"


def nearest_hca(sys_root: Path, gpu_bus_id: str) -> str | None:
    """The InfiniBand device whose PCI path shares the most components with the GPU's (the
    first by name among equals); None without the GPU's path or any device."""
    gpu = sys_root / "bus" / "pci" / "devices" / _sysfs_bus_id(gpu_bus_id)
    if not gpu.exists():
        return None
    gpu_path = gpu.resolve().parts
    best: tuple[int, str] | None = None
    ib = sys_root / "class" / "infiniband"
    for device in sorted(ib.iterdir()) if ib.is_dir() else []:
        try:
            path = (device / "device").resolve(strict=True).parts
        except OSError:
            continue
        shared = _shared(gpu_path, path)
        if best is None or shared > best[0]:
            best = (shared, device.name)
    return best[1] if best else None


def _shared(a: tuple[str, ...], b: tuple[str, ...]) -> int:
    """How many leading path components two paths share."""
    count = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        count += 1
    return count


def site_hca(environ: Mapping[str, str]) -> str | None:
    """The one HCA an exact NCCL_IB_HCA (`=mlx5_0` or `=mlx5_0:1`) names, else None."""
    value = environ.get("NCCL_IB_HCA", "")
    if not value.startswith("=") or "," in value:
        return None
    return value[1:].partition(":")[0] or None


def ib_devices(log: str) -> list[str]:
    """The devices NCCL's "NET/IB : Using [0]mlx5_0:1/IB ..." line lists (first such line)."""
    found = _USING.search(log)
    return _DEVICE.findall(found.group(1)) if found else []


def transport_faults(log: str, hca: str | None) -> list[str]:
    """Why the log says the pair measured another network than InfiniBand on `hca`: the
    reasons of netmon.probe.crossnode (`net_socket_where_net_ib_expected`, ...), and
    `wrong_hca` when NCCL used other devices. An unreadable log (no connection line) is no
    fault: nothing is known."""
    report = nccl_debug.parse(log)
    faults = crossnode.judge_network(report, "net_ib")
    devices = ib_devices(log)
    if hca is not None and devices and devices != [hca]:
        faults.append("wrong_hca")
    return faults


def prepare(
    environ: Mapping[str, str], gpu_index: int, log_file: str
) -> tuple[Binding, dict[str, str]]:
    """Bind this process to its GPU's CPUs; return the binding and what to add to the
    environment before NCCL starts (the HCA, the debug log)."""
    from netmon.gpu.nvml import NvmlUnavailable, read_topology

    cpus: set[int] = set()
    bus_id: str | None = None
    try:
        gpu = read_topology().gpu(gpu_index)
        cpus, bus_id = cpu_set(gpu.cpu_affinity), gpu.pci_bus_id
    except (NvmlUnavailable, KeyError, IndexError):
        pass
    allowed = os.sched_getaffinity(0)
    if cpus & allowed:
        os.sched_setaffinity(0, cpus & allowed)
    added: dict[str, str] = {}
    hca = site_hca(environ)
    if "NCCL_IB_HCA" not in environ and bus_id is not None:
        hca = nearest_hca(Path(environ.get("NETMON_SYSFS", "/sys")), bus_id)
        if hca is not None:
            added["NCCL_IB_HCA"] = f"={hca}"
    added |= debug_env({**environ, **added}, log_file)
    return Binding(tuple(sorted(os.sched_getaffinity(0))), hca), added
