"""NVML's peer-to-peer status between each two GPUs, read with the topology (netmon.gpu.nvml)."""

from __future__ import annotations

from typing import Any

from netmon.gpu.nvml import NvmlUnavailable, _asker, _handles, _session
from netmon.topology.model import P2PMatrix, Pair

# nvmlGpuP2PStatus_t (nvml.h), as `nvidia-smi topo -p2p` prints each (netmon.topology.model).
_P2P_CODES = {0: "OK", 1: "CNS", 2: "GNS", 3: "TNS", 4: "DR", 5: "NS", 6: "U"}


def read_p2p_status(nvml: Any = None) -> P2PMatrix | None:
    """Whether CUDA peer-to-peer reads work between each two GPUs, as NVML says: what NCCL asks
    NVML for a peer its rank cannot see (each rank sees one GPU; NCCL's p2p.cc and paths.cc),
    so a set without it runs with P2P disabled (netmon.probe.build). None where NVML cannot
    say; a pair it cannot answer is left out ("U" is never guessed)."""
    try:
        with _session(nvml) as nv:
            ask = _asker(nv)
            handles = list(_handles(nv, "left out of the P2P matrix"))
            status: dict[Pair, str] = {}
            for a, handle_a in handles:
                for b, handle_b in handles:
                    if a == b:
                        continue
                    found = ask(
                        nv.nvmlDeviceGetP2PStatus, handle_a, handle_b, nv.NVML_P2P_CAPS_INDEX_READ
                    )
                    if found is not None:
                        status[(a, b)] = _P2P_CODES.get(int(found), "U")
    except NvmlUnavailable:
        return None
    return P2PMatrix(gpus=tuple(i for i, _ in handles), status=status)
