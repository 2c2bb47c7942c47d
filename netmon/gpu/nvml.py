"""Thin NVML access (nvidia-ml-py): GPU count and models, idle readings, topology, link health
and the NVLink fabric.

Every reader opens NVML through `_session` and hands the answers to a pure translation (here
reading_from_raw, netmon.topology.readings, netmon.gpu.linkhealth, netmon.gpu.fabric). Never
initialises CUDA.
"""

from __future__ import annotations

import ctypes
import dataclasses
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any, Protocol

from netmon.gpu import linkhealth
from netmon.gpu.fabric import FabricReading, fabric_from_raw
from netmon.gpu.idle import ComputeMode, GpuReading, IdleSourceError
from netmon.gpu.models import GpuName
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
def _session(nvml: Any = None) -> Iterator[Any]:
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


def _asker(nv: Any) -> Callable[..., Any]:
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


def _handles(nv: Any, left_out: str) -> Iterator[tuple[int, Any]]:
    """(index, handle) of every GPU NVML can open. One it cannot is logged and left out: a lost
    GPU must not stop the healthy ones from being read."""
    for index in range(int(nv.nvmlDeviceGetCount())):
        try:
            handle = nv.nvmlDeviceGetHandleByIndex(index)
        except nv.NVMLError as exc:
            log.warning("NVML: GPU %d unreadable, %s: %s", index, left_out, exc)
            continue
        yield index, handle


def _text(value: str | bytes) -> str:
    # Older pynvml versions return bytes where newer ones return str.
    return value.decode() if isinstance(value, bytes) else value


def gpu_count() -> int:
    """GPUs visible to NVML; 0 on a machine without the driver, never an exception."""
    try:
        with _session() as nv:
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
        with _session(nvml) as nv:
            ask = _asker(nv)
            found = []
            for index, handle in _handles(nv, "its MIG mode not read"):
                mode = ask(nv.nvmlDeviceGetMigMode, handle)
                if mode is not None and int(mode[0]) == 1:
                    found.append(index)
            return tuple(found)
    except NvmlUnavailable:
        return ()


def read_gpu_names(nvml: Any = None) -> tuple[GpuName, ...]:
    """Every GPU's index, UUID and model name (netmon.gpu.models picks the node's). Raises
    NvmlUnavailable where NVML cannot be used; a name NVML cannot give is None."""
    with _session(nvml) as nv:
        ask = _asker(nv)
        named = []
        for index, handle in _handles(nv, "its model not read"):
            uuid, name = ask(nv.nvmlDeviceGetUUID, handle), ask(nv.nvmlDeviceGetName, handle)
            text = [None if value is None else _text(value) for value in (uuid, name)]
            named.append(GpuName(index, text[0], text[1]))
    return tuple(named)


# --- Idle readings ------------------------------------------------------------------------------
# The raw shapes pynvml returns (ctypes structs, or its "friendly" objects for processes); only
# the fields used are named, so tests can pass SimpleNamespace objects of the same shape.


class RawUtilization(Protocol):
    @property
    def gpu(self) -> int: ...  # percent of the last sample period a kernel ran


class RawMemory(Protocol):
    @property
    def used(self) -> int: ...  # bytes


class RawProcess(Protocol):
    @property
    def pid(self) -> int: ...

    @property
    def usedGpuMemory(self) -> int | None: ...  # bytes; pynvml's spelling


# nvmlComputeMode_t; EXCLUSIVE_THREAD (1) is deprecated but still a value the driver may return.
_COMPUTE_MODES: dict[int, ComputeMode] = {
    0: "default",
    1: "exclusive_thread",
    2: "prohibited",
    3: "exclusive_process",
}
_MIG_ENABLE = 1  # NVML_DEVICE_MIG_ENABLE
# NVML_VALUE_NOT_AVAILABLE as an unsigned long long; pynvml maps it to None, older versions did not.
_NOT_AVAILABLE = (1 << 64) - 1


def reading_from_raw(
    index: int,
    uuid: str | bytes,
    *,
    utilization: RawUtilization | None,
    memory: RawMemory | None,
    processes: Sequence[RawProcess] | None,
    mig_mode: Sequence[int] | None,
    compute_mode: int | None,
    minor: int | None = None,
) -> GpuReading:
    """A GpuReading from pynvml's return values; None for each call NVML could not answer.

    Unanswered MIG mode means a GPU without MIG; unanswered compute mode means default (every
    NVML GPU answers it). Unanswered utilization, memory or processes stay unknown: the idle
    policy decides what unknown means.
    """
    pids: tuple[int, ...] = ()
    process_memory: tuple[int | None, ...] = ()
    if processes is not None:
        pids = tuple(int(p.pid) for p in processes)
        process_memory = tuple(
            None if p.usedGpuMemory in (None, _NOT_AVAILABLE) else int(p.usedGpuMemory)
            for p in processes
        )
    mode = "default" if compute_mode is None else _COMPUTE_MODES.get(compute_mode, "unknown")
    return GpuReading(
        index=index,
        uuid=_text(uuid),
        utilization=None if utilization is None else float(utilization.gpu),
        memory_used=None if memory is None else int(memory.used),
        compute_pids=pids,
        mig_enabled=mig_mode is not None and mig_mode[0] == _MIG_ENABLE,
        compute_mode=mode,
        process_memory=process_memory,
        processes_known=processes is not None,
        minor=None if minor is None else int(minor),
    )


class NvmlSource:
    """Reads every GPU through NVML for the idle check. Initialises NVML once; call close().

    Raises NvmlUnavailable when constructed on a machine without a working NVML.
    """

    def __init__(self, nvml: Any = None) -> None:
        self._held = ExitStack()
        self._nv: Any = self._held.enter_context(_session(nvml))
        self._ask = _asker(self._nv)
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
            for index, handle in _handles(nv, "skipped"):
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
    from netmon.gpu.p2p import read_p2p_status

    return read_p2p_status(nvml)


def _read_topology(nvml: Any) -> Topology:
    # CPU ids can exceed the online count (offline or isolated CPUs): one spare word.
    cpu_words = ((os.cpu_count() or 1) + 63) // 64 + 1
    with _session(nvml) as nv:
        ask = _asker(nv)
        node_scope = getattr(nv, "NVML_AFFINITY_SCOPE_NODE", 0)
        handles: list[object] = []
        readings: list[GpuTopologyReading] = []
        for index, handle in _handles(nv, "left out of the topology"):
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
                        remote_bus_id=None if remote is None else _text(remote.busId),
                        remote_type=ask(nv.nvmlDeviceGetNvLinkRemoteDeviceType, handle, link),
                    )
                )
            handles.append(handle)
            readings.append(
                GpuTopologyReading(
                    index=index,
                    uuid=None if uuid is None else _text(uuid),
                    pci_bus_id=None if pci is None else _text(pci.busId),
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


# --- Link health --------------------------------------------------------------------------------

# nvmlFieldValue_t.scopeId asking for a per-link field summed over all of the GPU's links (nvml.h:
# "A scopeId of UINT_MAX returns aggregate value summed up across all links").
_ALL_LINKS = 0xFFFFFFFF


def read_link_health(under_load: bool, nvml: Any = None) -> linkhealth.LinkHealth:
    """PCIe and NVLink state and error counters of every GPU, read now.

    `under_load` is the caller's word that probe traffic flows during this call; only then does a
    lower PCIe generation count as downtrained. The maximum generation read is
    nvmlDeviceGetMaxPcieLinkGeneration, what GPU and host allow together;
    nvmlDeviceGetGpuMaxPcieLinkGeneration (the GPU alone) is not read, as a GPU in a slower slot
    runs as fast as it can. The translation is in netmon.gpu.linkhealth (*_from_raw).

    Raises NvmlUnavailable where NVML cannot be used. A GPU NVML cannot open is left out with a
    warning; a value NVML cannot give (NotSupported, NoPermission, ...) is None.
    """
    with _session(nvml) as nv:
        ask = _asker(nv)
        counters: dict[linkhealth.NvLinkError, int] = {
            "replay": nv.NVML_NVLINK_ERROR_DL_REPLAY,
            "recovery": nv.NVML_NVLINK_ERROR_DL_RECOVERY,
            "crc_flit": nv.NVML_NVLINK_ERROR_DL_CRC_FLIT,
            "crc_data": nv.NVML_NVLINK_ERROR_DL_CRC_DATA,
        }
        # NotSupported at link 0: a GPU without NVLink. InvalidArgument: past the GPU's last link.
        no_more_links = (nv.NVML_ERROR_NOT_SUPPORTED, nv.NVML_ERROR_INVALID_ARGUMENT)
        throughput_fields = [
            (nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, _ALL_LINKS),
            (nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, _ALL_LINKS),
        ]
        read_at = time.time()
        pcie: list[linkhealth.PcieReading] = []
        nvlinks: list[linkhealth.NvLinkReading] = []
        throughput: list[linkhealth.NvLinkThroughput] = []
        for index, handle in _handles(nv, "no link health for it"):
            pcie.append(
                linkhealth.pcie_from_raw(
                    index,
                    gen=ask(nv.nvmlDeviceGetCurrPcieLinkGeneration, handle),
                    gen_max=ask(nv.nvmlDeviceGetMaxPcieLinkGeneration, handle),
                    width=ask(nv.nvmlDeviceGetCurrPcieLinkWidth, handle),
                    width_max=ask(nv.nvmlDeviceGetMaxPcieLinkWidth, handle),
                    replay_counter=ask(nv.nvmlDeviceGetPcieReplayCounter, handle),
                )
            )
            links = []
            for link in range(int(nv.NVML_NVLINK_MAX_LINKS)):
                try:
                    state = nv.nvmlDeviceGetNvLinkState(handle, link)
                except nv.NVMLError as exc:
                    if getattr(exc, "value", None) in no_more_links:
                        break
                    log.debug("NVML: GPU %d NVLink %d state unanswered: %s", index, link, exc)
                    continue
                errors = {
                    name: ask(nv.nvmlDeviceGetNvLinkErrorCounter, handle, link, counter)
                    for name, counter in counters.items()
                }
                links.append(linkhealth.nvlink_from_raw(index, link, state=state, errors=errors))
            nvlinks.extend(links)
            if links:  # a GPU without NVLink has no throughput to count
                fields = ask(nv.nvmlDeviceGetFieldValues, handle, throughput_fields)
                tx, rx = (None, None) if fields is None else (fields[0], fields[1])
                sent = linkhealth.throughput_from_fields(index, tx, rx)
                if sent is not None:
                    throughput.append(sent)
    return linkhealth.LinkHealth(
        pcie=tuple(pcie),
        nvlinks=tuple(nvlinks),
        throughput=tuple(throughput),
        under_load=under_load,
        read_at=read_at,
    )


# --- NVLink fabric ------------------------------------------------------------------------------


def read_fabric(nvml: Any = None) -> tuple[FabricReading, ...]:
    """Every GPU's NVLink fabric state, read now (nvmlDeviceGetGpuFabricInfoV).

    Raises NvmlUnavailable where NVML cannot be used. A GPU NVML cannot open is left out with a
    warning; one whose fabric NVML cannot read is "unknown", never a guess.
    """
    with _session(nvml) as nv:
        ask = _asker(nv)
        readings = []
        for index, handle in _handles(nv, "no fabric reading for it"):
            uuid = ask(nv.nvmlDeviceGetUUID, handle)
            info, error = _fabric_info(nv, handle)
            text = None if uuid is None else _text(uuid)
            readings.append(fabric_from_raw(index, text, info, error))
    return tuple(readings)


def _fabric_info(nv: Any, handle: object) -> tuple[Any, int | None]:
    """(struct, None), or (None, the NVML error code) where NVML answered with an error."""
    error: int | None = None
    # The versioned call first; a driver from before it has only the first form, and an old
    # pynvml neither (its missing names are skipped like the driver's).
    for call, struct in (
        ("nvmlDeviceGetGpuFabricInfoV", "c_nvmlGpuFabricInfoV_t"),
        ("nvmlDeviceGetGpuFabricInfo", "c_nvmlGpuFabricInfo_t"),
    ):
        ask, shape = getattr(nv, call, None), getattr(nv, struct, None)
        if ask is None or shape is None:
            continue
        info = shape()  # the V struct sets its own version field
        try:
            ask(handle, ctypes.pointer(info))  # NVML fills the struct the pointer names
        except nv.NVMLError as exc:
            error = getattr(exc, "value", None)
            log.debug("NVML: %s unanswered: %s", call, exc)
            if error == nv.NVML_ERROR_FUNCTION_NOT_FOUND:
                continue
            return None, error
        return info, None
    return None, error
