"""Stand-ins for the pynvml module, as NvmlSource, read_topology, read_link_health and read_fabric
use it.

No GPU exists where the tests run, so each reader is given a fake machine instead of pynvml. Every
call is bound against the installed pynvml function's real signature, so a misspelt name or a
wrong argument fails here as it would on a GPU node; constants, structs and exception classes are
pynvml's own. The values are SYNTHETIC (no GPU recorded them), modelled on the fixtures' machines
where a class docstring names one.
"""

from __future__ import annotations

import ctypes
import inspect
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any, ClassVar, NamedTuple

import pynvml

_MiB = 1 << 20


def nvml_error(code: int) -> Exception:
    error: Exception = pynvml.NVMLError(code)  # pynvml picks the subclass, e.g. NotSupported
    return error


def cpu_mask(listed: str | None, words: int = 4) -> list[int]:
    """ "0-51,104-155" as NVML's bitmask words (64 bits each)."""
    mask = [0] * words
    for span in (listed or "").split(",") if listed else []:
        first, _, last = span.partition("-")
        for cpu in range(int(first), int(last or first) + 1):
            mask[cpu // 64] |= 1 << (cpu % 64)
    return mask


def bus_id(index: int) -> str:
    return f"00000000:{0x18 + 0x10 * index:02X}:00.0"  # SYNTHETIC addresses


class Call(NamedTuple):
    name: str
    args: tuple[Any, ...]


class FakeNvml:
    """The machinery every stand-in shares: `healthy_gpus` GPUs that answer, then one that is lost.

    A subclass answers pynvml's `nvmlX` with a method `_nvmlX`; asking for a function it does not
    answer is an AttributeError, as asking the real module for a name it lacks.
    """

    healthy_gpus: ClassVar[int]

    def __init__(self, init_error: Exception | None = None) -> None:
        self.init_error = init_error
        self.calls: list[Call] = []
        self.shutdowns = 0

    def __getattr__(self, name: str) -> Any:
        real = getattr(pynvml, name)  # AttributeError for a name pynvml does not have
        # Struct versions such as nvmlMemory_v2 and struct types such as nvmlPciInfo_t share the
        # prefix, but are values the readers use as they are.
        if not (name.startswith("nvml") and inspect.isfunction(real)):
            return real
        if not hasattr(type(self), "_" + name):
            # Looked up on the instance, the missing answer would recurse into this method and be
            # reported as a name pynvml lacks.
            raise AttributeError(f"{type(self).__name__} does not answer {name}")
        answer = getattr(self, "_" + name)

        def call(*args: Any) -> Any:
            inspect.signature(real).bind(*args)
            self.calls.append(Call(name, args))
            return answer(*args)

        return call

    def times_called(self, name: str) -> int:
        return sum(1 for called in self.calls if called.name == name)

    def _nvmlInit(self) -> None:
        if self.init_error is not None:
            raise self.init_error

    def _nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def _nvmlDeviceGetCount(self) -> int:
        return self.healthy_gpus + 1

    def _nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        if index == self.healthy_gpus:
            raise nvml_error(pynvml.NVML_ERROR_GPU_IS_LOST)
        return index


class IdleNvml(FakeNvml):
    """pynvml as NvmlSource uses it, for a node of three GPUs with these `uuids` for GPUs 0 and 1.

    GPU 0 answers everything; GPU 1 answers only the basics (NotSupported elsewhere, no v2 memory,
    a driver too old for the process call); GPU 2 is lost.
    """

    healthy_gpus = 2

    def __init__(self, uuids: Sequence[str], init_error: Exception | None = None) -> None:
        super().__init__(init_error)
        self.uuids = tuple(uuids)

    def _nvmlDeviceGetUUID(self, handle: int) -> str:
        return self.uuids[handle]

    def _nvmlDeviceGetUtilizationRates(self, handle: int) -> object:
        if handle == 1:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return SimpleNamespace(gpu=3, memory=0)

    def _nvmlDeviceGetMemoryInfo(self, handle: int, version: int | None = None) -> object:
        if handle == 1 and version is not None:
            raise nvml_error(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        used = 5 * _MiB if version is not None else 600 * _MiB  # v1 counts the driver's reserve
        return SimpleNamespace(total=80 << 30, free=(80 << 30) - used, used=used)

    def _nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[object]:
        if handle == 1:
            raise pynvml.NVMLLibraryMismatchError("driver too old")
        return [SimpleNamespace(pid=321, usedGpuMemory=2 * _MiB)]

    def _nvmlDeviceGetMigMode(self, handle: int) -> list[int]:
        if handle == 1:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return [0, 0]

    def _nvmlDeviceGetComputeMode(self, handle: int) -> int:
        return 0 if handle == 0 else 3

    def _nvmlDeviceGetMinorNumber(self, handle: int) -> int:
        if handle == 1:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)  # as unanswered stays unknown
        return handle


class TopologyNvml(FakeNvml):
    """pynvml as read_topology uses it, for the machine of tests/fixtures/
    topo_3x_rtxa6000_nv4_bridge_pair.txt (SYNTHETIC bus ids and UUIDs): GPU0-GPU1 bridged by 4
    links, GPU2 with 4 inactive links, all NODE, and a fourth GPU that is lost.

    `typed=False` is a driver too old to tell what a link's far end is.
    """

    healthy_gpus = 3

    def __init__(self, init_error: Exception | None = None, typed: bool = True) -> None:
        super().__init__(init_error)
        self.typed = typed

    def _nvmlDeviceGetUUID(self, handle: int) -> str:
        return f"GPU-synthetic-{handle}"

    def _nvmlDeviceGetPciInfo(self, handle: int) -> Any:
        info = pynvml.nvmlPciInfo_t()
        info.busId = bus_id(handle).encode()
        return info

    def _nvmlDeviceGetCpuAffinity(self, handle: int, words: int) -> list[int]:
        return cpu_mask("0-31,64-95", words=max(words, 2))[:words]

    def _nvmlDeviceGetMemoryAffinity(self, handle: int, words: int, scope: int) -> list[int]:
        assert scope == pynvml.NVML_AFFINITY_SCOPE_NODE
        return [1] + [0] * (words - 1)

    def _nvmlDeviceGetNvLinkState(self, handle: int, link: int) -> int:
        if link >= 4:  # an RTX A6000 has 4 links; NVML refuses the others
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return 0 if handle == 2 else 1

    def _nvmlDeviceGetNvLinkRemotePciInfo(self, handle: int, link: int) -> Any:
        info = pynvml.nvmlPciInfo_t()
        info.busId = bus_id(1 - handle).encode()
        return info

    def _nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: int, link: int) -> int:
        if not self.typed:
            raise nvml_error(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        return int(pynvml.NVML_NVLINK_DEVICE_TYPE_GPU)

    def _nvmlDeviceGetTopologyCommonAncestor(self, first: int, second: int) -> int:
        return int(pynvml.NVML_TOPOLOGY_NODE)

    def _nvmlDeviceGetP2PStatus(self, first: int, second: int, index: int) -> int:
        # SYNTHETIC: the bridged pair does P2P; GPU2 answers NotSupported for the question, as
        # NVML does for a capability index a board does not report.
        assert index == pynvml.NVML_P2P_CAPS_INDEX_READ
        if 2 in (first, second):
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return int(pynvml.NVML_P2P_STATUS_OK)


_ERRORS_GPU0 = {
    pynvml.NVML_NVLINK_ERROR_DL_REPLAY: 11,
    pynvml.NVML_NVLINK_ERROR_DL_RECOVERY: 1,
    pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT: 40,
}


class LinkHealthNvml(FakeNvml):
    """pynvml as read_link_health uses it, for a node of three GPUs.

    GPU 0 (an RTX A6000 of the recorded bridged pair): Gen4 x16, links 0-3 active, 4-5 inactive,
    InvalidArgument from link 6 on; CRC data counter unsupported; throughput 5 / 7 KiB.
    GPU 1 (a PCIe-only card read while idle): parked at Gen1 of 4, x8 of x16, no replay counter,
    NotSupported at NVLink 0. GPU 2 is lost.
    """

    healthy_gpus = 2

    def _nvmlDeviceGetCurrPcieLinkGeneration(self, handle: int) -> int:
        return (4, 1)[handle]

    def _nvmlDeviceGetMaxPcieLinkGeneration(self, handle: int) -> int:
        return 4

    def _nvmlDeviceGetCurrPcieLinkWidth(self, handle: int) -> int:
        return (16, 8)[handle]

    def _nvmlDeviceGetMaxPcieLinkWidth(self, handle: int) -> int:
        return 16

    def _nvmlDeviceGetPcieReplayCounter(self, handle: int) -> int:
        if handle == 1:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return 2

    def _nvmlDeviceGetNvLinkState(self, handle: int, link: int) -> int:
        if handle == 1:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if link >= 6:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        enabled: int = pynvml.NVML_FEATURE_ENABLED
        return enabled if link < 4 else pynvml.NVML_FEATURE_DISABLED

    def _nvmlDeviceGetNvLinkErrorCounter(self, handle: int, link: int, counter: int) -> int:
        if counter not in _ERRORS_GPU0:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return _ERRORS_GPU0[counter] if link == 0 else 0

    def _nvmlDeviceGetFieldValues(self, handle: int, field_ids: list[tuple[int, int]]) -> Any:
        values = (pynvml.c_nvmlFieldValue_t * len(field_ids))()
        kib = {
            pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX: 5,
            pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX: 7,
        }
        for slot, (field_id, scope) in zip(values, field_ids, strict=True):
            assert scope == ctypes.c_uint32(-1).value  # summed over all links
            slot.fieldId, slot.scopeId = field_id, scope
            slot.valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
            slot.nvmlReturn = pynvml.NVML_SUCCESS
            slot.value.ullVal = kib[field_id]
        return values


class FabricNvml(FakeNvml):
    """pynvml as read_fabric uses it: two GPUs in the fabric `states` (nvmlGpuFabricState_t, one
    per GPU) with registration `status`, then a lost GPU.

    `error`: every fabric call raises this NVML error code instead. `versioned=False` is a driver
    from before nvmlDeviceGetGpuFabricInfoV, which has only the first form. The machines the tests
    use are SYNTHETIC, shaped after public records: an HGX H100 whose NCCL logs show every GPU at
    state 3 (completed) with a zero cluster UUID and clique 0, a PCIe node that answers
    NotSupported, and a node whose fabric manager is not running (GPUs left at not started).
    """

    healthy_gpus = 2

    def __init__(
        self,
        states: Sequence[int] = (3, 3),
        *,
        status: int = pynvml.NVML_SUCCESS,
        error: int | None = None,
        versioned: bool = True,
        cluster: bytes = bytes(16),
        init_error: Exception | None = None,
    ) -> None:
        super().__init__(init_error)
        self.states, self.status, self.error = tuple(states), status, error
        self.versioned, self.cluster = versioned, cluster

    def _nvmlDeviceGetUUID(self, handle: int) -> str:
        return f"GPU-synthetic-{handle}"

    def _fill(self, handle: int, info: Any) -> int:
        if self.error is not None:
            raise nvml_error(self.error)
        info.state = self.states[handle]
        info.status = self.status
        info.cliqueId = 0
        info.clusterUuid[:] = list(self.cluster)
        return int(pynvml.NVML_SUCCESS)

    def _nvmlDeviceGetGpuFabricInfoV(self, handle: int, pointer: Any) -> int:
        if not self.versioned:
            raise nvml_error(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        info = pointer.contents
        # The driver reads the version field to know the struct's layout.
        assert isinstance(info, pynvml.c_nvmlGpuFabricInfo_v2_t)
        assert info.version == pynvml.nvmlGpuFabricInfo_v2
        return self._fill(handle, info)

    def _nvmlDeviceGetGpuFabricInfo(self, handle: int, pointer: Any) -> int:
        info = pointer.contents
        assert isinstance(info, pynvml.c_nvmlGpuFabricInfo_t)
        return self._fill(handle, info)
