"""NVML on a simulated node: a stand-in for the pynvml module, answering from the node file.

netmon.gpu.nvml uses it exactly as it uses pynvml (it is handed over in `session`), so every
reader above the library is the code that runs on a GPU node. Each call is bound against the
installed pynvml function's real signature, and constants, structs and exception classes are
pynvml's own: a misspelt name or a wrong argument fails here as it would against libnvidia-ml.
A call netmon does not make is an AttributeError, never a silent default.
"""

from __future__ import annotations

import ctypes
import inspect
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pynvml

from netmon.sim.node import SimGpu, SimulatedNode

_COMPUTE_MODES = {"default": 0, "prohibited": 2, "exclusive_process": 3}
UNREPORTED = 8 << 30  # what a process whose memory NVML does not report holds on its GPU
_ERROR_COUNTERS = {0: "replay", 1: "recovery", 2: "crc_flit", 3: "crc_data"}  # nvml.h order
# nvmlGpuFabricState_t: NVML_GPU_FABRIC_STATE_NOT_STARTED, _IN_PROGRESS, _COMPLETED
_FABRIC_STATES = {"not_started": 1, "in_progress": 2, "completed": 3}


@dataclass(frozen=True)
class _Handle:
    index: int


def _error(code: int) -> Exception:
    error: Exception = pynvml.NVMLError(code)  # pynvml picks the subclass (NotSupported...)
    return error


class SimulatedNvml:
    """The pynvml module of one simulated node. `calls` counts the calls made, by name."""

    def __init__(self, node: SimulatedNode) -> None:
        self.node = node
        self.calls: dict[str, int] = {}

    def __getattr__(self, name: str) -> Any:
        real = getattr(pynvml, name)  # AttributeError for a name pynvml does not have
        if not (name.startswith("nvml") and inspect.isfunction(real)):
            return real  # constants, structs, exception classes: pynvml's own
        answer = getattr(type(self), "_" + name, None)
        if answer is None:
            raise AttributeError(f"the simulated NVML does not answer {name}")
        signature = inspect.signature(real)

        def call(*args: Any, **kwargs: Any) -> Any:
            signature.bind(*args, **kwargs)
            self.calls[name] = self.calls.get(name, 0) + 1
            failure = self._failure(name, args)
            if failure is not None:
                raise _error(getattr(pynvml, f"NVML_ERROR_{failure.upper()}"))
            return answer(self, *args, **kwargs)

        return call

    def _failure(self, name: str, args: tuple[Any, ...]) -> str | None:
        """The error the node file makes this call raise: a GPU's, for a call on its handle
        (or its index, opening one); the node's for any call."""
        node = self.node.current()
        first = args[0] if args else None
        index = first.index if isinstance(first, _Handle) else None
        if name == "nvmlDeviceGetHandleByIndex" and isinstance(first, int):
            index = first
        if index is not None and 0 <= index < len(node.gpus):
            failure = node.gpus[index].nvml_errors.get(name)
            if failure is not None:
                return failure
        return node.nvml_errors.get(name)

    def _gpu(self, handle: _Handle) -> SimGpu:
        gpus = self.node.current().gpus
        if not isinstance(handle, _Handle) or handle.index >= len(gpus):
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return gpus[handle.index]

    # ---- the library ----

    def _nvmlInit(self) -> None:
        self.node.current()

    def _nvmlShutdown(self) -> None:
        pass

    def _nvmlSystemGetCudaDriverVersion_v2(self) -> int:
        version = self.node.current().driver_cuda
        if version is None:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        major, minor = version.split(".")
        return 1000 * int(major) + 10 * int(minor)

    def _nvmlDeviceGetCount(self) -> int:
        return len(self.node.current().gpus)

    def _nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        if not 0 <= index < len(self.node.current().gpus):
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return _Handle(index)

    # ---- identity and load ----

    def _nvmlDeviceGetHandleByUUID(self, uuid: str | bytes) -> _Handle:
        wanted = uuid.decode() if isinstance(uuid, bytes) else uuid
        for index, gpu in enumerate(self.node.current().gpus):
            if gpu.uuid == wanted:
                return _Handle(index)
        raise _error(pynvml.NVML_ERROR_NOT_FOUND)

    def _nvmlDeviceGetClockInfo(self, handle: _Handle, type: int) -> int:
        """The SM clock (MHz): the boost clock while kernels run on the GPU, the idle one
        otherwise, as GPU Boost raises it under load and lets it fall when idle."""
        gpu = self._gpu(handle)
        if type != pynvml.NVML_CLOCK_SM:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        busy = self.node.utilization(gpu.uuid) > 0
        return gpu.sm_clock_mhz if busy else gpu.idle_sm_clock_mhz

    def _nvmlDeviceGetUUID(self, handle: _Handle) -> str:
        return self._gpu(handle).uuid

    def _nvmlDeviceGetName(self, handle: _Handle) -> str:
        return self._gpu(handle).name

    def _nvmlDeviceGetPciInfo(self, handle: _Handle) -> Any:
        return SimpleNamespace(busId=self._gpu(handle).pci_bus_id)

    def _nvmlDeviceGetComputeRunningProcesses(self, handle: _Handle) -> list[Any]:
        uuid = self._gpu(handle).uuid
        return [
            SimpleNamespace(pid=pid, usedGpuMemory=used, gpuInstanceId=None, computeInstanceId=None)
            for pid, used in self.node.processes(uuid)
        ]

    def _nvmlDeviceGetUtilizationRates(self, handle: _Handle) -> Any:
        percent = self.node.utilization(self._gpu(handle).uuid)
        return SimpleNamespace(gpu=percent, memory=percent // 2)

    def _nvmlDeviceGetMemoryInfo(self, handle: _Handle, version: Any = None) -> Any:
        gpu = self._gpu(handle)
        # v2 leaves out what the driver reserves for itself; v1 counts it as used.
        reserved = 0 if version is not None else 500 << 20
        # A process whose share NVML cannot say (None) still holds memory: the GPU counts it.
        held = sum(UNREPORTED if b is None else b for _, b in self.node.processes(gpu.uuid))
        used = reserved + (1 << 20) + held
        used = min(used, gpu.memory_total)
        return SimpleNamespace(total=gpu.memory_total, used=used, free=gpu.memory_total - used)

    def _nvmlDeviceGetMigMode(self, handle: _Handle) -> list[int]:
        mode = int(self._gpu(handle).mig)
        return [mode, mode]

    def _nvmlDeviceGetMinorNumber(self, handle: _Handle) -> int:
        gpu = self._gpu(handle)
        return handle.index if gpu.minor is None else gpu.minor

    def _nvmlDeviceGetComputeMode(self, handle: _Handle) -> int:
        return _COMPUTE_MODES[self._gpu(handle).compute_mode]

    def _nvmlDeviceGetP2PStatus(self, device1: _Handle, device2: _Handle, p2pIndex: int) -> int:
        first, second = self._gpu(device1), self._gpu(device2)
        if first.p2p and second.p2p:
            return int(pynvml.NVML_P2P_STATUS_OK)
        return int(pynvml.NVML_P2P_STATUS_GPU_NOT_SUPPORTED)

    # ---- PCIe ----

    def _nvmlDeviceGetCurrPcieLinkGeneration(self, handle: _Handle) -> int:
        gpu = self._gpu(handle)
        if self.node.processes(gpu.uuid):
            return gpu.pcie.generation
        return gpu.pcie.idle_generation or gpu.pcie.generation

    def _nvmlDeviceGetMaxPcieLinkGeneration(self, handle: _Handle) -> int:
        pcie = self._gpu(handle).pcie
        return pcie.max_generation or pcie.generation

    def _nvmlDeviceGetCurrPcieLinkWidth(self, handle: _Handle) -> int:
        return self._gpu(handle).pcie.width

    def _nvmlDeviceGetMaxPcieLinkWidth(self, handle: _Handle) -> int:
        pcie = self._gpu(handle).pcie
        return pcie.max_width or pcie.width

    def _nvmlDeviceGetPcieReplayCounter(self, handle: _Handle) -> int:
        return self._gpu(handle).pcie.replay_counter

    # ---- NVLink ----

    def _link(self, handle: _Handle, link: int) -> SimGpu:
        gpu = self._gpu(handle)
        if gpu.nvlinks == 0:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)  # a GPU without NVLink
        if not 0 <= link < gpu.nvlinks:
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)  # past the GPU's last link
        return gpu

    def _nvmlDeviceGetNvLinkState(self, handle: _Handle, link: int) -> int:
        gpu = self._link(handle, link)
        down = link in gpu.nvlinks_down
        return int(pynvml.NVML_FEATURE_DISABLED if down else pynvml.NVML_FEATURE_ENABLED)

    def _nvmlDeviceGetNvLinkErrorCounter(self, handle: _Handle, link: int, counter: int) -> int:
        gpu = self._link(handle, link)
        if link in gpu.nvlinks_down:
            return 0
        return next((n for k, n in gpu.nvlink_errors.items() if k == _ERROR_COUNTERS[counter]), 0)

    def _nvmlDeviceGetFieldValues(self, handle: _Handle, field_ids: list[Any]) -> Any:
        """NVLink data throughput (KiB, summed over links): the node file's `nvlink_kib` for
        both directions; any other field is answered NotSupported, field by field, as NVML
        answers a field the GPU lacks."""
        gpu = self._gpu(handle)
        wanted = (
            pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
            pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX,
        )
        values = (pynvml.c_nvmlFieldValue_t * len(field_ids))()
        for value, asked in zip(values, field_ids, strict=True):
            field_id, scope = asked if isinstance(asked, tuple) else (asked, 0)
            value.fieldId, value.scopeId = field_id, scope
            if field_id in wanted and gpu.nvlinks:
                value.nvmlReturn = pynvml.NVML_SUCCESS
                value.valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
                value.value.ullVal = gpu.nvlink_kib
            else:
                value.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
        return values

    def _nvmlDeviceGetNvLinkRemotePciInfo(self, handle: _Handle, link: int) -> Any:
        raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)  # topology comes from the topo text

    def _nvmlDeviceGetGpuFabricInfoV(self, handle: _Handle, info: Any) -> None:
        gpu = self._gpu(handle)
        if not self.node.current().nvswitch:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)  # a GPU in no NVLink fabric
        target = info.contents if isinstance(info, ctypes._Pointer) else info
        target.state = _FABRIC_STATES[gpu.fabric]
        target.status = gpu.fabric_status
        target.cliqueId = 0
        if gpu.cluster_uuid is not None:
            ctypes.memmove(target.clusterUuid, bytes.fromhex(gpu.cluster_uuid), 16)
