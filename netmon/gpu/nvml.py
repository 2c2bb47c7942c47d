"""Thin NVML access (nvidia-ml-py): the session every reader opens, GPU count and models, idle
readings and the topology; the links' readings are netmon.gpu.nvml_links.

Every reader opens NVML through `session` and hands the answers to a pure translation
(netmon.gpu.idle_reading, netmon.topology.readings, netmon.gpu.p2p). Never initialises CUDA.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from netmon.gpu.idle import GpuReading, IdleSourceError
from netmon.gpu.idle_reading import reading_from_raw
from netmon.gpu.models import GpuName
from netmon.gpu.p2p import p2p_from_codes
from netmon.topology.model import P2PMatrix, Pair, Topology
from netmon.topology.readings import (
    GpuTopologyReading,
    NvLinkReading,
    cpu_list,
    single_node,
    topology_from_readings,
)

log = logging.getLogger(__name__)

_DRIVER_GPUS = Path("/proc/driver/nvidia/gpus")


class NvmlUnavailable(IdleSourceError):
    """NVML cannot be used on this machine (no driver, no library, no nvidia-ml-py)."""


@contextmanager
def session(nvml: Any = None) -> Iterator[Any]:
    """The pynvml module, initialised for the block and shut down after it (NVML counts its
    inits, so sessions may overlap). `nvml` is a stand-in for pynvml: tests pass one, as no GPU
    exists where they run. NvmlUnavailable where NVML cannot be used. On a simulated node
    (`--simulate`), the stand-in answers from the node file (netmon.sim.nvml)."""
    if nvml is None:
        nvml = _simulated()
    if nvml is None:
        try:
            import pynvml
        except ImportError as exc:
            raise NvmlUnavailable(
                "NVML unavailable: nvidia-ml-py (module pynvml) is not installed"
            ) from exc
        nvml = pynvml
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        raise NvmlUnavailable(
            f"NVML unavailable: {exc} (is the NVIDIA driver installed and loaded?)"
        ) from exc
    try:
        yield nvml
    finally:
        nvml.nvmlShutdown()


def _simulated() -> Any:
    from netmon import sim

    try:
        node = sim.active()
    except sim.SimulationError as exc:
        raise NvmlUnavailable(f"NVML unavailable: {exc}") from exc
    if node is None:
        return None
    from netmon.sim.nvml import SimulatedNvml

    return SimulatedNvml(node)


def asker(nv: Any) -> Callable[..., Any]:
    """ask(call, *args): call(*args), or None where NVML cannot answer (NotSupported,
    NoPermission, ...), so one missing value never costs the others."""
    # NVMLLibraryMismatchError (a driver older than pynvml's process calls) is no NVMLError; older
    # pynvml versions lack it.
    unanswered = (nv.NVMLError, getattr(nv, "NVMLLibraryMismatchError", nv.NVMLError))

    def ask(call: Callable[..., Any], *args: object) -> Any:
        try:
            return call(*args)
        except unanswered as exc:
            log.debug("NVML: %s%s unanswered: %s", getattr(call, "__name__", call), args[1:], exc)
            return None

    return ask


def gpu_handles(nv: Any, left_out: str) -> Iterator[tuple[int, Any]]:
    """(index, handle) of every GPU NVML can open. One it cannot is logged and left out: a lost
    GPU must not stop the healthy ones from being read."""
    for index in range(int(nv.nvmlDeviceGetCount())):
        try:
            handle = nv.nvmlDeviceGetHandleByIndex(index)
        except nv.NVMLError as exc:
            log.warning("NVML: GPU %d unreadable, %s: %s", index, left_out, exc)
            continue
        yield index, handle


def as_text(value: str | bytes) -> str:
    """A text NVML answered, as str: older pynvml versions return bytes where newer ones return
    str."""
    return value.decode() if isinstance(value, bytes) else value


def gpu_count() -> int:
    """GPUs visible to NVML; 0 on a machine without the driver, never an exception."""
    try:
        with session() as nv:
            return int(nv.nvmlDeviceGetCount())
    except Exception as exc:  # NvmlUnavailable, NVMLError, a broken library...
        log.debug("NVML gave no GPU count: %s", exc)
    # The driver lists its GPUs here even when libnvidia-ml is not installed.
    try:
        return sum(1 for _ in _DRIVER_GPUS.iterdir())
    except OSError:
        return 0


def mig_gpus(nvml: Any = None) -> tuple[int, ...]:
    """The NVML indices of GPUs in MIG mode now (current mode); () where NVML cannot say."""
    try:
        with session(nvml) as nv:
            ask = asker(nv)
            found = []
            for index, handle in gpu_handles(nv, "its MIG mode not read"):
                mode = ask(nv.nvmlDeviceGetMigMode, handle)
                if mode is not None and int(mode[0]) == 1:
                    found.append(index)
            return tuple(found)
    except NvmlUnavailable:
        return ()


def read_gpu_names(nvml: Any = None) -> tuple[GpuName, ...]:
    """Every GPU's index, UUID and model name (netmon.gpu.models picks the node's). Raises
    NvmlUnavailable where NVML cannot be used; a name NVML cannot give is None."""
    with session(nvml) as nv:
        ask = asker(nv)
        named = []
        for index, handle in gpu_handles(nv, "its model not read"):
            uuid, name = ask(nv.nvmlDeviceGetUUID, handle), ask(nv.nvmlDeviceGetName, handle)
            text = [None if value is None else as_text(value) for value in (uuid, name)]
            named.append(GpuName(index, text[0], text[1]))
    return tuple(named)


# --- Idle readings ------------------------------------------------------------------------------


class NvmlSource:
    """Reads every GPU through NVML for the idle check. Initialises NVML once; call close().

    Raises NvmlUnavailable when constructed on a machine without a working NVML.
    """

    def __init__(self, nvml: Any = None) -> None:
        self._held = ExitStack()
        self._nv: Any = self._held.enter_context(session(nvml))
        self._ask = asker(self._nv)
        self._lock = threading.Lock()
        self._open = True

    def __enter__(self) -> NvmlSource:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        """Releases NVML (its init is reference counted, so gpu_count() elsewhere is unaffected)."""
        with self._lock:
            if self._open:
                self._open = False
                self._held.close()

    def read(self) -> list[GpuReading]:
        nv = self._nv
        with self._lock:
            if not self._open:
                raise IdleSourceError("NvmlSource is closed")
            readings = []
            for index, handle in gpu_handles(nv, "skipped"):
                try:
                    uuid = nv.nvmlDeviceGetUUID(handle)
                except nv.NVMLError as exc:
                    # Left out, so a probe asking for it is refused as gpu_missing; the others
                    # are still read.
                    log.warning("NVML: GPU %d unreadable, skipped: %s", index, exc)
                    continue
                readings.append(
                    reading_from_raw(
                        index,
                        uuid,
                        utilization=self._ask(nv.nvmlDeviceGetUtilizationRates, handle),
                        memory=self._memory(handle),
                        processes=self._ask(nv.nvmlDeviceGetComputeRunningProcesses, handle),
                        mig_mode=self._ask(nv.nvmlDeviceGetMigMode, handle),
                        compute_mode=self._ask(nv.nvmlDeviceGetComputeMode, handle),
                        minor=self._ask(nv.nvmlDeviceGetMinorNumber, handle),
                    )
                )
            return readings

    def _memory(self, handle: object) -> Any:
        # v2 reports `used` without the memory the driver reserves for itself (hundreds of MiB on
        # large GPUs), which v1 counts as used; drivers before v2 existed only answer v1.
        version = getattr(self._nv, "nvmlMemory_v2", None)
        if version is not None:
            answer = self._ask(self._nv.nvmlDeviceGetMemoryInfo, handle, version)
            if answer is not None:
                return answer
        return self._ask(self._nv.nvmlDeviceGetMemoryInfo, handle)


# --- Topology -----------------------------------------------------------------------------------

_NODE_MASK_WORDS = 16  # 1024 NUMA nodes, far beyond any machine


def read_topology(nvml: Any = None) -> Topology:
    """This node's GPU topology as `nvidia-smi topo -m` would show it (without NICs, which NVML
    does not see). The translation is netmon.topology.readings.topology_from_readings.

    Raises NvmlUnavailable where NVML cannot be used. A GPU NVML cannot open is left out with a
    warning; a value NVML cannot give is unknown (N/A), never a guess.
    """
    if nvml is None:
        simulated = _simulated()
        if simulated is not None:
            # The node file's `nvidia-smi topo -m`, with the UUIDs and bus ids NVML gives, and
            # P2P as the simulated NVML answers it.
            topology: Topology = simulated.node.topology()
            return dataclasses.replace(topology, p2p=read_p2p(simulated))
    return dataclasses.replace(_read_topology(nvml), p2p=read_p2p(nvml))


def read_p2p(nvml: Any = None) -> P2PMatrix | None:
    """Whether CUDA peer-to-peer reads work between each two GPUs, as NVML says: what NCCL asks
    NVML for a peer its rank cannot see (each rank sees one GPU; NCCL's p2p.cc and paths.cc),
    so a set without it runs with P2P disabled (netmon.probe.build). None where NVML cannot
    say; a pair it cannot answer is left out ("U" is never guessed; netmon.gpu.p2p)."""
    try:
        with session(nvml) as nv:
            ask = asker(nv)
            found = list(gpu_handles(nv, "left out of the P2P matrix"))
            codes = {
                (a, b): ask(
                    nv.nvmlDeviceGetP2PStatus, handle_a, handle_b, nv.NVML_P2P_CAPS_INDEX_READ
                )
                for a, handle_a in found
                for b, handle_b in found
                if a != b
            }
    except NvmlUnavailable:
        return None
    return p2p_from_codes(tuple(index for index, _ in found), codes)


def _read_topology(nvml: Any) -> Topology:
    # CPU ids can exceed the online count (offline or isolated CPUs): one spare word.
    cpu_words = ((os.cpu_count() or 1) + 63) // 64 + 1
    with session(nvml) as nv:
        ask = asker(nv)
        node_scope = getattr(nv, "NVML_AFFINITY_SCOPE_NODE", 0)
        handles: list[object] = []
        readings: list[GpuTopologyReading] = []
        for index, handle in gpu_handles(nv, "left out of the topology"):
            uuid = ask(nv.nvmlDeviceGetUUID, handle)
            pci = ask(nv.nvmlDeviceGetPciInfo, handle)
            cpus = ask(nv.nvmlDeviceGetCpuAffinity, handle, cpu_words)
            nodes = ask(nv.nvmlDeviceGetMemoryAffinity, handle, _NODE_MASK_WORDS, node_scope)
            links = []
            # Every link number is asked: a link NVML cannot answer says nothing of the next.
            for link in range(int(nv.NVML_NVLINK_MAX_LINKS)):
                if ask(nv.nvmlDeviceGetNvLinkState, handle, link) != nv.NVML_FEATURE_ENABLED:
                    continue
                remote = ask(nv.nvmlDeviceGetNvLinkRemotePciInfo, handle, link)
                links.append(
                    NvLinkReading(
                        remote_bus_id=None if remote is None else as_text(remote.busId),
                        remote_type=ask(nv.nvmlDeviceGetNvLinkRemoteDeviceType, handle, link),
                    )
                )
            handles.append(handle)
            readings.append(
                GpuTopologyReading(
                    index=index,
                    uuid=None if uuid is None else as_text(uuid),
                    pci_bus_id=None if pci is None else as_text(pci.busId),
                    numa=None if nodes is None else single_node(nodes),
                    cpu_affinity=None if cpus is None else cpu_list(cpus),
                    links=tuple(links),
                )
            )
        ancestors: dict[Pair, int | None] = {}
        for n, (first, handle_a) in enumerate(zip(readings, handles, strict=True)):
            for second, handle_b in zip(readings[n + 1 :], handles[n + 1 :], strict=True):
                level = ask(nv.nvmlDeviceGetTopologyCommonAncestor, handle_a, handle_b)
                ancestors[(first.index, second.index)] = None if level is None else int(level)
    return topology_from_readings(readings, ancestors)
