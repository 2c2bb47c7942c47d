"""NVML's peer-to-peer status codes between each two GPUs as a P2P matrix (pure); they are read
with the topology (netmon.gpu.nvml.read_p2p)."""

from __future__ import annotations

from collections.abc import Mapping

from netmon.topology.model import P2PMatrix, Pair

# nvmlGpuP2PStatus_t (nvml.h), as `nvidia-smi topo -p2p` prints each (netmon.topology.model).
_P2P_CODES = {0: "OK", 1: "CNS", 2: "GNS", 3: "TNS", 4: "DR", 5: "NS", 6: "U"}


def p2p_from_codes(gpus: tuple[int, ...], codes: Mapping[Pair, int | None]) -> P2PMatrix:
    """The matrix of these GPUs from nvmlDeviceGetP2PStatus's code for each ordered pair; a pair
    NVML could not answer (None) is left out ("U" is never guessed), an unknown code is "U"."""
    status = {
        pair: _P2P_CODES.get(int(code), "U") for pair, code in codes.items() if code is not None
    }
    return P2PMatrix(gpus=gpus, status=status)
