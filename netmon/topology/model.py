"""The GPU topology of one node, as a value: path classes between GPUs (and NICs) as
`nvidia-smi topo -m` names them, and which pairs of GPUs can reach each other's memory directly.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

Pair = tuple[int, int]

# --- Path classes -------------------------------------------------------------------------------

_NV_RE = re.compile(r"^NV(\d+)$")
# Anything else shaped like a class is kept as written: drivers have renamed classes before
# (SOC became SYS when NODE appeared), and a topology with an unknown word in it is still usable.
_CODE_RE = re.compile(r"^(?:[A-Z][A-Z0-9_]*|N/A)$")
# Nearest first. SOC is the old drivers' SYS; unknown classes sort last (treated as far).
_DISTANCE = {"X": 0, "PIX": 2, "PXB": 3, "PHB": 4, "NODE": 5, "SYS": 6, "SOC": 6}
_UNKNOWN_DISTANCE = 7
# `nvidia-smi topo -p2p` cells. None is a `topo -m` class, so meeting one says which format it is.
P2P_STATUSES: dict[str, str] = {
    "OK": "Status Ok",
    "CNS": "Chipset not supported",
    "GNS": "GPU not supported",
    "TNS": "Topology not supported",
    "NS": "Not supported",
    "DR": "Disabled by regkey",
    "U": "Unknown",
}


@dataclass(frozen=True)
class PathClass:
    """One cell of `nvidia-smi topo -m`: "X", "NV<n>", "PIX", "PXB", "PHB", "NODE", "SYS", ..."""

    code: str

    def __post_init__(self) -> None:
        if not _CODE_RE.match(self.code) or self.code in P2P_STATUSES:
            raise ValueError(f"{self.code!r} is not a topology path class")

    @classmethod
    def parse(cls, token: str) -> PathClass:
        code = token.strip()
        if code in P2P_STATUSES:
            raise ValueError(
                f"cell {code!r} ({P2P_STATUSES[code]}) is a P2P status, not a path class: this "
                "looks like `nvidia-smi topo -p2p` output; read it with parse_p2p_matrix"
            )
        if not _CODE_RE.match(code):
            raise ValueError(
                f"cell {code!r} is not a path class (X, NV<n>, PIX, PXB, PHB, NODE, SYS)"
            )
        return cls(code)

    @classmethod
    def nvlink(cls, links: int) -> PathClass:
        if links < 1:
            raise ValueError(f"an NVLink path needs at least one link, not {links}")
        return cls(f"NV{links}")

    @property
    def nvlinks(self) -> int:
        """The number of bonded NVLinks; 0 for a path without NVLink."""
        match = _NV_RE.match(self.code)
        return int(match.group(1)) if match else 0

    @property
    def is_nvlink(self) -> bool:
        return self.nvlinks > 0

    @property
    def distance(self) -> tuple[int, int]:
        """A sort key, nearest first; more NVLinks are nearer than fewer."""
        if self.is_nvlink:
            return (1, -self.nvlinks)
        return (_DISTANCE.get(self.code, _UNKNOWN_DISTANCE), 0)

    def __str__(self) -> str:
        return self.code


SELF = PathClass("X")
PIX = PathClass("PIX")
PXB = PathClass("PXB")
PHB = PathClass("PHB")
NODE = PathClass("NODE")
SYS = PathClass("SYS")
NOT_AVAILABLE = PathClass("N/A")


def _farther(a: PathClass, b: PathClass) -> PathClass:
    return a if a.distance >= b.distance else b


def is_path_class_code(code: str) -> bool:
    """Whether `code` is a class `nvidia-smi topo -m` is known to write ("NV4", "PIX", "SOC"...)."""
    return bool(_NV_RE.match(code)) or code in _DISTANCE


# --- The model ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Gpu:
    index: int  # NVML's index, as in `nvidia-smi` (PCI bus order)
    uuid: str | None = None
    pci_bus_id: str | None = None
    numa: int | None = None  # the NUMA node nearest the GPU ("NUMA Affinity")
    cpu_affinity: str | None = None  # CPU list as nvidia-smi writes it: "0-51,104-155"


@dataclass(frozen=True)
class Nic:
    name: str  # the column heading: "NIC0" (older drivers wrote the device, "mlx5_0")
    device: str | None = None  # from the NIC Legend: "mlx5_0"


@dataclass(frozen=True)
class Topology:
    """GPUs, NICs and the path class between every ordered pair of GPUs and every GPU and NIC.

    `path` holds the matrix as read, both directions; `path_between` is what to use.
    """

    gpus: tuple[Gpu, ...]
    nics: tuple[Nic, ...] = ()
    path: Mapping[Pair, PathClass] = field(default_factory=dict)
    nic_path: Mapping[tuple[int, str], PathClass] = field(default_factory=dict)
    # Whether CUDA peer access works between each two GPUs (NVML's P2P status), where known.
    p2p: P2PMatrix | None = None

    def __post_init__(self) -> None:
        # Read-only copies: a frozen value must not change under a caller that kept the dicts.
        object.__setattr__(self, "path", MappingProxyType(dict(self.path)))
        object.__setattr__(self, "nic_path", MappingProxyType(dict(self.nic_path)))
        indices = self.indices
        if list(indices) != sorted(set(indices)):
            raise ValueError(f"GPU indices must be unique and ascending, got {list(indices)}")
        known = set(indices)
        missing = [(a, b) for a in indices for b in indices if a != b and (a, b) not in self.path]
        if missing:
            a, b = missing[0]
            raise ValueError(f"no path for GPU{a}-GPU{b} ({len(missing)} ordered pairs missing)")
        stray = [key for key in self.path if key[0] not in known or key[1] not in known]
        if stray or any(a == b for a, b in self.path):
            raise ValueError(f"path entries for unknown GPUs or a GPU to itself: {stray}")
        nic_names = {nic.name for nic in self.nics}
        if len(nic_names) != len(self.nics):
            raise ValueError("NIC names must be unique")
        for gpu, nic in self.nic_path:
            if gpu not in known or nic not in nic_names:
                raise ValueError(f"nic_path entry for unknown GPU{gpu} or NIC {nic!r}")

    @property
    def indices(self) -> tuple[int, ...]:
        return tuple(gpu.index for gpu in self.gpus)

    def gpu(self, index: int) -> Gpu:
        for gpu in self.gpus:
            if gpu.index == index:
                return gpu
        raise KeyError(f"no GPU{index} in this topology (GPUs {list(self.indices)})")

    def path_between(self, a: int, b: int) -> PathClass:
        """The class of the a-b path. If the two directions disagree (a matrix should never do
        that) the farther one, so that a link only one end reports is never trusted."""
        if a == b:
            self.gpu(a)
            return SELF
        try:
            forward, backward = self.path[(a, b)], self.path[(b, a)]
        except KeyError:
            raise KeyError(f"no path GPU{a}-GPU{b} (GPUs {list(self.indices)})") from None
        return _farther(forward, backward)

    def nvlink_count(self, a: int, b: int) -> int:
        return self.path_between(a, b).nvlinks

    def is_nvlink(self, a: int, b: int) -> bool:
        return self.path_between(a, b).is_nvlink

    def pairs(self) -> dict[Pair, PathClass]:
        """Every unordered pair (i < j) with its path, in index order."""
        indices = self.indices
        return {
            (a, b): self.path_between(a, b) for n, a in enumerate(indices) for b in indices[n + 1 :]
        }

    def classes(self) -> dict[PathClass, int]:
        """How many GPU pairs have each path class, nearest class first."""
        counts = Counter(self.pairs().values())
        return {path: counts[path] for path in sorted(counts, key=lambda p: (p.distance, p.code))}

    def asymmetric_pairs(self) -> list[Pair]:
        """Pairs whose two matrix cells disagree; empty for every real matrix seen so far."""
        return [(a, b) for a, b in self.pairs() if self.path[(a, b)] != self.path[(b, a)]]

    def restricted(self, devices: Iterable[int]) -> Topology:
        """The topology of only these GPUs (by index, as NVML numbers them), with their paths to
        each other and to every NIC; the NICs stay, as they are still the node's. KeyError for an
        index this topology does not have."""
        keep = set(devices)
        for index in sorted(keep):
            self.gpu(index)
        return Topology(
            gpus=tuple(gpu for gpu in self.gpus if gpu.index in keep),
            nics=self.nics,
            path={pair: path for pair, path in self.path.items() if keep.issuperset(pair)},
            nic_path={key: path for key, path in self.nic_path.items() if key[0] in keep},
        )


@dataclass(frozen=True)
class P2PMatrix:
    """Whether CUDA peer access works between GPUs, per `nvidia-smi topo -p2p` (one capability,
    the one it was asked about, which the text does not say)."""

    gpus: tuple[int, ...]
    status: Mapping[Pair, str]  # ordered pairs; codes as written: "OK", "GNS", ... (P2P_STATUSES)

    def supported(self, a: int, b: int) -> bool:
        return self.status.get((a, b)) == "OK" and self.status.get((b, a)) == "OK"

    def without(self, gpus: Sequence[int]) -> list[Pair]:
        """The pairs of `gpus` known not to support P2P (either way); a pair NVML did not answer
        is not listed."""
        return [
            (a, b)
            for n, a in enumerate(gpus)
            for b in gpus[n + 1 :]
            if (a, b) in self.status and (b, a) in self.status and not self.supported(a, b)
        ]
