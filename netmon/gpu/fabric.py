"""The NVLink fabric of NVSwitch systems, as NVML reports it per GPU: pure translation of
pynvml's answer, and the decision whether NVLS (NVLink SHARP multicast) can be tried.

NVSwitch systems join each GPU to an NVLink fabric (the fabric manager registers it); NVLS
multicast lives there. NVML documents the reading for Hopper and newer GPUs and answers
NotSupported for a GPU in no fabric (docs/FACTS.md, "NVLink fabric"). The reading itself is
netmon.gpu.nvml_links.read_fabric.
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


# NCCL turns NVLS off unless the communicator has at least 3 GPUs on the node (the GPUs of its
# topology, one per rank there), from 2.18.1 through 2.28.3; since 2.28.7, at least 2
# (src/transport/nvls.cc; docs/FACTS.md, "Algorithms").
NVLS_ON_TWO_GPUS_SINCE = (2, 28, 7)


def nvls_min_gpus(nccl: tuple[int, int, int] | None) -> int:
    """How many GPUs of one node NCCL needs in a communicator to turn NVLS on (pure).

    An unknown version gets the older, stricter count: a variant skipped once costs little, while
    an NVLS that NCCL turned off under a forced algorithm fails with "no algorithm/protocol
    available" (NCCL 2.24 and later).
    """
    return 2 if nccl is not None and nccl >= NVLS_ON_TWO_GPUS_SINCE else 3


def nvls_supported(
    readings: Sequence[FabricReading],
    devices: Sequence[str] | None = None,
    nccl: tuple[int, int, int] | None = None,
) -> tuple[bool, str]:
    """Whether NVML shows the NVSwitch fabric NVLS needs on these GPUs, and why (pure).

    `devices` (NVML indexes or UUIDs) narrows the readings to a probe's GPUs; `nccl` is the
    version its ranks run, when known. A yes is necessary, not sufficient: NCCL itself still asks
    CUDA for multicast support, and a fabric can be registered while multicast fails
    (docs/FACTS.md, "NVLink fabric").
    """
    chosen = list(readings)
    if devices is not None:
        by_name = {**{str(r.index): r for r in readings}, **{r.uuid: r for r in readings if r.uuid}}
        missing = [d for d in devices if d not in by_name]
        if missing:
            return False, f"no NVML fabric reading for GPU {', '.join(missing)}"
        # Two names of one GPU are one GPU: NCCL counts the GPUs, not the ranks.
        chosen = list({by_name[d].index: by_name[d] for d in devices}.values())
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
    too_few = _too_few(len(chosen), nccl)
    if too_few is not None:
        return False, too_few
    return True, "every GPU joined an NVLink fabric; NCCL still checks multicast support itself"


def _too_few(count: int, nccl: tuple[int, int, int] | None) -> str | None:
    need = nvls_min_gpus(nccl)
    if count >= need:
        return None
    if need == 2:
        return f"NCCL turns NVLS on only with 2 or more GPUs of one node; {count} here"
    if nccl is None:
        return (
            f"NCCL before 2.28.7 turns NVLS on only with {need} or more GPUs of one node, and "
            f"the ranks' NCCL version is not known yet; {count} here"
        )
    return (
        f"NCCL {'.'.join(map(str, nccl))} turns NVLS on only with {need} or more GPUs of one "
        f"node (2 since NCCL 2.28.7); {count} here"
    )


def in_nvlink_domain(readings: Sequence[FabricReading]) -> bool | None:
    """Whether the node's GPUs belong to a multi-node NVLink domain (pure); None when unknown.

    A nonzero cluster UUID names such a domain; NCCL may then join nodes by NVLink (MNNVL)
    rather than through the network (docs/FACTS.md, "NVLink fabric").
    """
    if any(r.cluster_uuid for r in readings):
        return True
    if not readings or any(r.state == "unknown" for r in readings):
        return None
    return False
