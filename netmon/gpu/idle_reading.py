"""One GPU's idle reading made from pynvml's answers (pure): utilization, memory, compute
processes, MIG and compute mode, each None where NVML could not answer.

The live reader is netmon.gpu.nvml.NvmlSource; the idle decision on the readings is
netmon.gpu.idle.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from netmon.gpu.idle import ComputeMode, GpuReading

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
        uuid=uuid.decode() if isinstance(uuid, bytes) else uuid,  # bytes from older pynvml
        utilization=None if utilization is None else float(utilization.gpu),
        memory_used=None if memory is None else int(memory.used),
        compute_pids=pids,
        mig_enabled=mig_mode is not None and mig_mode[0] == _MIG_ENABLE,
        compute_mode=mode,
        process_memory=process_memory,
        processes_known=processes is not None,
        minor=None if minor is None else int(minor),
    )
