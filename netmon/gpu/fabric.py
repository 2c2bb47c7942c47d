"""The NVLink fabric of NVSwitch systems, as NVML reports it per GPU: pure translation of
pynvml's answer, and the decision whether NVLS (NVLink SHARP multicast) can be tried.

NVSwitch systems join each GPU to an NVLink fabric (the fabric manager registers it); NVLS
multicast lives there. NVML documents the reading for Hopper and newer GPUs and answers
NotSupported for a GPU in no fabric (docs/FACTS.md, "NVLink fabric"). The reading itself is
netmon.gpu.nvml.read_fabric.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

FabricState = Literal["not_supported", "not_started", "in_progress", "completed", "unknown"]
_FABRIC_STATES: tuple[FabricState, ...] = (  # nvmlGpuFabricState_t, 0 to 3
    "not_supported",
    "not_started",
    "in_progress",
    "completed",
)
_NOT_SUPPORTED = 3  # NVML_ERROR_NOT_SUPPORTED


class RawFabricInfo(Protocol):
    """pynvml's c_nvmlGpuFabricInfoV_t (or the older c_nvmlGpuFabricInfo_t): the fields used."""

    @property
    def clusterUuid(self) -> Sequence[int]: ...

    @property
    def status(self) -> int: ...  # nvmlReturn_t; meaningful only once the state is completed

    @property
    def cliqueId(self) -> int: ...

    @property
    def state(self) -> int: ...


@dataclass(frozen=True)
class FabricReading:
    """One GPU's place in an NVLink fabric, as NVML reports it."""

    index: int
    uuid: str | None
    state: FabricState  # "unknown": NVML gave no answer
    status: int | None  # 0 (NVML_SUCCESS) once registered; None unless the state is completed
    clique_id: int | None
    cluster_uuid: str | None  # hex; None when all zero (no multi-node NVLink domain)


def fabric_from_raw(
    index: int, uuid: str | None, info: RawFabricInfo | None, error: int | None = None
) -> FabricReading:
    """A FabricReading from pynvml's struct, or from the NVML error that came instead of it."""
    if info is None:
        state: FabricState = "not_supported" if error == _NOT_SUPPORTED else "unknown"
        return FabricReading(index, uuid, state, None, None, None)
    raw = int(info.state)
    state = _FABRIC_STATES[raw] if 0 <= raw < len(_FABRIC_STATES) else "unknown"
    cluster = bytes(info.clusterUuid)
    return FabricReading(
        index=index,
        uuid=uuid,
        state=state,
        status=int(info.status) if state == "completed" else None,
        clique_id=int(info.cliqueId) if state == "completed" else None,
        cluster_uuid=cluster.hex() if any(cluster) else None,
    )


def nvls_supported(
    readings: Sequence[FabricReading], devices: Sequence[str] | None = None
) -> tuple[bool, str]:
    """Whether NVML shows the NVSwitch fabric NVLS needs on these GPUs, and why (pure).

    `devices` (NVML indexes or UUIDs) narrows the readings to a probe's GPUs. A yes is necessary,
    not sufficient: NCCL itself still asks CUDA for multicast support, and a fabric can be
    registered while multicast fails (docs/FACTS.md, "NVLink fabric").
    """
    chosen = list(readings)
    if devices is not None:
        by_name = {**{str(r.index): r for r in readings}, **{r.uuid: r for r in readings if r.uuid}}
        missing = [d for d in devices if d not in by_name]
        if missing:
            return False, f"no NVML fabric reading for GPU {', '.join(missing)}"
        chosen = [by_name[d] for d in devices]
    if len(chosen) < 2:  # NCCL enables NVLS only with two or more GPUs on the node
        return False, f"NVLS needs 2 or more GPUs of one node, {len(chosen)} read"
    for r in chosen:
        if r.state == "unknown":
            return False, f"NVML could not read the NVLink fabric state of GPU {r.index}"
        if r.state == "not_supported":
            return False, f"GPU {r.index} is in no NVLink fabric (no NVSwitch, or before Hopper)"
        if r.state != "completed":
            return False, (
                f"GPU {r.index} has not finished joining the NVLink fabric ({r.state}); "
                "is the fabric manager running?"
            )
        if r.status != 0:
            return False, f"GPU {r.index} failed to join the NVLink fabric (NVML status {r.status})"
    return True, "every GPU joined an NVLink fabric; NCCL still checks multicast support itself"
