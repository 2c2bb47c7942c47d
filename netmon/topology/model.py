"""The GPU topology of one node and the plan of which GPU pairs to probe together.

Pure: path classes between GPUs (and NICs) as `nvidia-smi topo -m` names them, parsed from its
text or built from NVML readings (read by netmon.gpu.nvml), and the rounds of a pairwise link sweep.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

Pair = tuple[int, int]
AvoidTogether = Callable[[Pair, Pair], bool]

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


# --- Parsing `nvidia-smi topo -m` -------------------------------------------------------------

_ANSI_RE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_GPU_RE = re.compile(r"^GPU(\d+)$")
_NIC_RE = re.compile(r"^NIC\d+$")
# Drivers before the NIC Legend headed NIC columns with the device itself ("mlx5_0").
_DEVICE_RE = re.compile(r"^[a-z][a-z0-9_.-]*$")
_LEGEND_RE = re.compile(r"^\s*(NIC\d+)\s*:\s*(\S+)\s*$")
# Headings of the columns after the matrix, each written as several words.
_INFO_HEADINGS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("CPU", "Affinity"), "cpu"),
    (("NUMA", "Affinity"), "numa"),
    (("GPU", "NUMA", "ID"), "gpu_numa"),
)


@dataclass(frozen=True)
class _Header:
    columns: tuple[str, ...]  # matrix columns: GPU0.., then NICs
    info: tuple[str, ...]  # the known columns after the matrix, in order
    open_ended: bool  # more (unknown) headings follow `info`


@dataclass(frozen=True)
class _Row:
    lineno: int
    cells: tuple[str, ...]
    info: tuple[str, ...]


def _clean_lines(text: str) -> list[str]:
    # A terminal gets the header underlined; a copy of it keeps the escapes.
    return [_ANSI_RE.sub("", line).rstrip() for line in text.splitlines()]


def _first_content(lines: Sequence[str], what: str) -> int:
    for n, line in enumerate(lines):
        if line.strip():
            return n
    raise ValueError(f"not {what}: the text is empty")


def _read_header(line: str, lineno: int, what: str) -> _Header:
    words = line.split()
    if not words or not _GPU_RE.match(words[0]):
        raise ValueError(
            f"line {lineno}: not {what}: expected a header starting with GPU0, got {line.strip()!r}"
        )
    columns: list[str] = []
    info: list[str] = []
    i = 0
    while i < len(words):
        heading = next(
            (
                (parts, name)
                for parts, name in _INFO_HEADINGS
                if tuple(words[i : i + len(parts)]) == parts
            ),
            None,
        )
        if heading is not None:
            info.append(heading[1])
            i += len(heading[0])
            continue
        if info:
            # A column a newer nvidia-smi added: the known ones before it still line up.
            return _Header(tuple(columns), tuple(info), open_ended=True)
        word = words[i]
        if word in columns:
            raise ValueError(f"line {lineno}: column {word} appears twice in the header")
        if _GPU_RE.match(word) and any(not _GPU_RE.match(c) for c in columns):
            raise ValueError(f"line {lineno}: {word} after the NIC columns")
        if not (_GPU_RE.match(word) or _NIC_RE.match(word) or _DEVICE_RE.match(word)):
            raise ValueError(f"line {lineno}: unexpected column heading {word!r} in the header")
        columns.append(word)
        i += 1
    return _Header(tuple(columns), tuple(info), open_ended=False)


def _read_rows(
    lines: Sequence[str], start: int, header: _Header, what: str
) -> tuple[dict[str, _Row], int]:
    """The matrix rows after the header, up to the first blank line or the Legend; and the
    index of the line after them."""
    rows: dict[str, _Row] = {}
    width = len(header.columns)
    n = start
    while n < len(lines):
        line = lines[n]
        lineno = n + 1
        words = line.split()
        if not words or any(word.startswith("Legend") for word in words[:2]):
            break  # "Legend:", "NIC Legend:"
        label = words[0]
        if label not in header.columns:
            raise ValueError(
                f"line {lineno}: not {what}: expected a row for one of "
                f"{', '.join(header.columns)}, got {line.strip()!r}"
            )
        if label in rows:
            raise ValueError(f"line {lineno}: a second row for {label}")
        cells = tuple(words[1 : 1 + width])
        if len(cells) < width:
            raise ValueError(
                f"line {lineno}: the {label} row has {len(cells)} cells for {width} columns "
                "(a cut line?)"
            )
        for column, cell in zip(header.columns, cells, strict=True):
            # Whitespace splitting would shift a row with an empty cell; X off the diagonal
            # (or none on it) is how that shows.
            if (cell == "X") != (column == label):
                raise ValueError(
                    f"line {lineno}: cell {label}/{column} is {cell!r}: X belongs exactly on "
                    "the diagonal, so the columns do not line up"
                )
        info = tuple(words[1 + width :])
        if label.startswith("GPU") and len(info) > len(header.info) and not header.open_ended:
            raise ValueError(
                f"line {lineno}: {len(info)} values after the matrix but the header names "
                f"{len(header.info)} columns"
            )
        rows[label] = _Row(lineno, cells, info)
        n += 1
    return rows, n


def _optional_int(value: str | None) -> int | None:
    return int(value) if value is not None and value.isdigit() else None


def parse_topo_matrix(text: str) -> Topology:
    """The topology in `nvidia-smi topo -m` output: tab- or space-separated, with or without
    NIC columns, the info columns and the Legends.

    A cut-off text parses as far as it goes: a GPU row missing is filled from the other GPUs'
    rows (the matrix is symmetric), a missing NIC row or NIC Legend costs nothing. Raises
    ValueError naming the line when the text is no such matrix or a row does not fit its header.
    """
    what = "an `nvidia-smi topo -m` matrix"
    lines = _clean_lines(text)
    head = _first_content(lines, what)
    header = _read_header(lines[head], head + 1, what)
    rows, end = _read_rows(lines, head + 1, header, what)

    def cell(row: str, column: str) -> PathClass | None:
        found = rows.get(row)
        if found is None:
            return None
        raw = found.cells[header.columns.index(column)]
        try:
            return PathClass.parse(raw)
        except ValueError as exc:
            raise ValueError(f"line {found.lineno}: {exc}") from None

    gpu_columns = [c for c in header.columns if _GPU_RE.match(c)]
    nic_columns = [c for c in header.columns if not _GPU_RE.match(c)]
    # Parse every cell, NIC-to-NIC too, so a bad cell anywhere is reported.
    for row in rows:
        for column in header.columns:
            cell(row, column)

    path: dict[Pair, PathClass] = {}
    for a in gpu_columns:
        for b in gpu_columns:
            if a == b:
                continue
            found = cell(a, b) or cell(b, a)
            if found is None:
                raise ValueError(f"no row for {a} or {b}: their path is unknown (cut-off text?)")
            path[(_gpu_index(a), _gpu_index(b))] = found

    nic_path: dict[tuple[int, str], PathClass] = {}
    for gpu in gpu_columns:
        for nic in nic_columns:
            found = cell(gpu, nic) or cell(nic, gpu)
            if found is not None:
                nic_path[(_gpu_index(gpu), nic)] = found

    legend: dict[str, str] = {}
    for line in lines[end:]:
        match = _LEGEND_RE.match(line)
        if match:
            legend[match.group(1)] = match.group(2)

    gpus = []
    for column in gpu_columns:
        found_row = rows.get(column)
        info = dict(zip(header.info, found_row.info, strict=False)) if found_row else {}
        cpu = info.get("cpu")
        gpus.append(
            Gpu(
                index=_gpu_index(column),
                numa=_optional_int(info.get("numa")),
                cpu_affinity=None if cpu in (None, "N/A") else cpu,
            )
        )
    nics = tuple(
        Nic(name, legend.get(name, None if _NIC_RE.match(name) else name)) for name in nic_columns
    )
    return Topology(
        gpus=tuple(sorted(gpus, key=lambda g: g.index)),
        nics=nics,
        path=path,
        nic_path=nic_path,
    )


def _gpu_index(label: str) -> int:
    match = _GPU_RE.match(label)
    assert match is not None  # only called on labels _GPU_RE accepted
    return int(match.group(1))


# --- Parsing `nvidia-smi topo -p2p <r|w|n|a|p>` -----------------------------------------------


@dataclass(frozen=True)
class P2PMatrix:
    """Whether CUDA peer access works between GPUs, per `nvidia-smi topo -p2p` (one capability,
    the one it was asked about, which the text does not say)."""

    gpus: tuple[int, ...]
    status: Mapping[Pair, str]  # ordered pairs; codes as written: "OK", "GNS", ... (P2P_STATUSES)

    def supported(self, a: int, b: int) -> bool:
        return self.status.get((a, b)) == "OK" and self.status.get((b, a)) == "OK"


def parse_p2p_matrix(text: str) -> P2PMatrix:
    """The status matrix of `nvidia-smi topo -p2p rw` (or r, w, n, a, p). ValueError naming the
    line when the text is not one (a `topo -m` matrix is refused with a pointer to
    parse_topo_matrix)."""
    what = "an `nvidia-smi topo -p2p` matrix"
    lines = _clean_lines(text)
    head = _first_content(lines, what)
    header = _read_header(lines[head], head + 1, what)
    if header.info or any(not _GPU_RE.match(c) for c in header.columns):
        raise ValueError(
            f"line {head + 1}: not {what}: the header has NIC or affinity columns, as "
            "`nvidia-smi topo -m` writes; read it with parse_topo_matrix"
        )
    rows, _ = _read_rows(lines, head + 1, header, what)
    status: dict[Pair, str] = {}
    for label, row in rows.items():
        for column, code in zip(header.columns, row.cells, strict=True):
            if label == column:
                continue
            if code not in P2P_STATUSES:
                hint = (
                    " (a path class: this looks like `nvidia-smi topo -m`; use parse_topo_matrix)"
                    if _NV_RE.match(code) or code in _DISTANCE
                    else ""
                )
                raise ValueError(f"line {row.lineno}: cell {code!r} is not a P2P status{hint}")
            status[(_gpu_index(label), _gpu_index(column))] = code
    return P2PMatrix(gpus=tuple(sorted(_gpu_index(c) for c in header.columns)), status=status)


# --- From NVML readings -------------------------------------------------------------------------
# netmon.gpu.nvml reads these; the translation lives here so tests can drive it with literal values.

# nvmlGpuTopologyLevel_t. INTERNAL means two GPUs on one board (Tesla K80): `nvidia-smi topo -h`
# describes that level as "a single PCIe switch on a dual GPU board", so it is PIX, never X.
NVML_TOPOLOGY_INTERNAL = 0
NVML_TOPOLOGY_SINGLE = 10
NVML_TOPOLOGY_MULTIPLE = 20
NVML_TOPOLOGY_HOSTBRIDGE = 30
NVML_TOPOLOGY_NODE = 40
NVML_TOPOLOGY_SYSTEM = 50
_ANCESTOR_CLASS: dict[int, PathClass] = {
    NVML_TOPOLOGY_INTERNAL: PIX,
    NVML_TOPOLOGY_SINGLE: PIX,
    NVML_TOPOLOGY_MULTIPLE: PXB,
    NVML_TOPOLOGY_HOSTBRIDGE: PHB,
    NVML_TOPOLOGY_NODE: NODE,
    NVML_TOPOLOGY_SYSTEM: SYS,
}
# nvmlIntNvLinkDeviceType_t
NVML_NVLINK_DEVICE_TYPE_GPU = 0
NVML_NVLINK_DEVICE_TYPE_IBMNPU = 1
NVML_NVLINK_DEVICE_TYPE_SWITCH = 2
NVML_NVLINK_DEVICE_TYPE_UNKNOWN = 0xFF


@dataclass(frozen=True)
class NvLinkReading:
    """One active NVLink of a GPU."""

    remote_bus_id: str | None  # PCI bus id of the far end; None when NVML could not say
    remote_type: int | None = None  # nvmlIntNvLinkDeviceType_t; None on drivers without it


@dataclass(frozen=True)
class GpuTopologyReading:
    index: int
    uuid: str | None
    pci_bus_id: str | None
    numa: int | None
    cpu_affinity: str | None
    links: tuple[NvLinkReading, ...] = ()  # active links only


def _bus_key(bus_id: str | None) -> tuple[int, ...] | str | None:
    """A bus id comparable across NVML's spellings ("00000000:18:00.0", legacy "0000:18:00.0")."""
    if bus_id is None:
        return None
    match = re.match(
        r"^\s*(?:([0-9a-fA-F]+):)?([0-9a-fA-F]+):([0-9a-fA-F]+)\.([0-9a-fA-F]+)\s*$", bus_id
    )
    if not match:
        return bus_id.strip().lower()
    domain, bus, device, function = match.groups()
    return (int(domain or "0", 16), int(bus, 16), int(device, 16), int(function, 16))


def _nvlinks(
    a: GpuTopologyReading,
    b: GpuTopologyReading,
    gpu_buses: set[tuple[int, ...] | str] | None,
) -> int:
    """Bonded NVLinks between two GPUs: links from one to the other, or, on an NVSwitch board,
    the links both have into the switches (nvidia-smi shows NV18 for every HGX H100 pair)."""

    def direct(src: GpuTopologyReading, dst: GpuTopologyReading) -> int:
        target = _bus_key(dst.pci_bus_id)
        if target is None:
            return 0
        return sum(1 for link in src.links if _bus_key(link.remote_bus_id) == target)

    def to_switch(gpu: GpuTopologyReading) -> int:
        count = 0
        for link in gpu.links:
            if link.remote_type == NVML_NVLINK_DEVICE_TYPE_SWITCH:
                count += 1
            elif link.remote_type in (None, NVML_NVLINK_DEVICE_TYPE_UNKNOWN):
                # No type from the driver: a far end that is no GPU of ours is a switch, if every
                # GPU's address is known. (An IBM NPU, the POWER CPU's end, is typed on every
                # driver that has such links.)
                key = _bus_key(link.remote_bus_id)
                count += gpu_buses is not None and key is not None and key not in gpu_buses
        return count

    ab, ba = direct(a, b), direct(b, a)
    if ab or ba:
        # Both ends see the same links; if one end's remote info failed, trust the other.
        return min(ab, ba) if ab and ba else max(ab, ba)
    return min(to_switch(a), to_switch(b))


def topology_from_readings(
    gpus: Sequence[GpuTopologyReading],
    common_ancestor: Mapping[Pair, int | None],
) -> Topology:
    """The topology NVML describes: `common_ancestor[(a, b)]` is nvmlDeviceGetTopologyCommonAncestor
    for GPUs a and b (either order; None or absent when NVML could not say, which gives N/A).
    NVLink, where present, wins over the PCIe class, as in `nvidia-smi topo -m`. NVML sees no
    NICs, so the result has none.
    """
    ordered = sorted(gpus, key=lambda g: g.index)
    keys = [_bus_key(g.pci_bus_id) for g in ordered]
    buses = {key for key in keys if key is not None} if None not in keys else None
    path: dict[Pair, PathClass] = {}
    for n, a in enumerate(ordered):
        for b in ordered[n + 1 :]:
            links = _nvlinks(a, b, buses)
            if links:
                found = PathClass.nvlink(links)
            else:
                level = common_ancestor.get((a.index, b.index))
                if level is None:
                    level = common_ancestor.get((b.index, a.index))
                found = (
                    NOT_AVAILABLE if level is None else _ANCESTOR_CLASS.get(level, NOT_AVAILABLE)
                )
            path[(a.index, b.index)] = path[(b.index, a.index)] = found
    return Topology(
        gpus=tuple(Gpu(g.index, g.uuid, g.pci_bus_id, g.numa, g.cpu_affinity) for g in ordered),
        path=path,
    )


def cpu_list(mask: Iterable[int], bits_per_word: int = 64) -> str | None:
    """A CPU (or NUMA node) bitmask, as NVML returns it in words, written as nvidia-smi writes
    it: "0-51,104-155". None for an empty mask."""
    members = [
        word_index * bits_per_word + bit
        for word_index, word in enumerate(mask)
        for bit in range(bits_per_word)
        if int(word) >> bit & 1
    ]
    if not members:
        return None
    spans: list[str] = []
    first = last = members[0]
    for member in [*members[1:], None]:
        if member is not None and member == last + 1:
            last = member
            continue
        spans.append(str(first) if first == last else f"{first}-{last}")
        if member is not None:
            first = last = member
    return ",".join(spans)


def single_node(mask: Iterable[int], bits_per_word: int = 64) -> int | None:
    """The NUMA node of a node mask with exactly one node set; None otherwise."""
    listed = cpu_list(mask, bits_per_word)
    return int(listed) if listed is not None and listed.isdigit() else None


# --- Pair rounds --------------------------------------------------------------------------------


def _circle_rounds(n: int) -> list[list[Pair]]:
    """The circle method: fix one seat, rotate the rest. With n odd a phantom seat gives a bye."""
    if n < 2:
        return []
    seats = n + n % 2
    ring = list(range(seats))
    rounds = []
    for _ in range(seats - 1):
        pairs = [
            (min(ring[i], ring[-1 - i]), max(ring[i], ring[-1 - i]))
            for i in range(seats // 2)
            if ring[i] < n and ring[-1 - i] < n
        ]
        rounds.append(sorted(pairs))
        ring = [ring[0], ring[-1], *ring[1:-1]]
    return rounds


def plan_pair_rounds(n_gpus: int, avoid_together: AvoidTogether | None = None) -> list[list[Pair]]:
    """Every unordered pair of GPUs 0..n_gpus-1 exactly once, in rounds of disjoint pairs.

    Without a constraint this is the circle method and minimal: n-1 rounds of n/2 pairs for n
    even, n rounds of (n-1)/2 for n odd (one GPU sits out each round). `avoid_together(p, q)`
    says two pairs must not run in one round (asked both ways round). Such pairs are repaired
    by moving: each circle round keeps the pairs that fit, and every pair moved out goes into
    the first round where it fits, or a new round at the end. That is a greedy colouring, not a
    minimal one, but the unconstrained plan comes out unchanged.
    """
    if n_gpus < 0:
        raise ValueError(f"n_gpus must be >= 0, got {n_gpus}")
    rounds = _circle_rounds(n_gpus)
    if avoid_together is None:
        return rounds

    def fits(pair: Pair, members: list[Pair]) -> bool:
        return all(
            not set(pair) & set(other)
            and not avoid_together(pair, other)
            and not avoid_together(other, pair)
            for other in members
        )

    planned: list[list[Pair]] = []
    moved: list[Pair] = []
    for pairs in rounds:
        kept: list[Pair] = []
        for pair in pairs:
            (kept if fits(pair, kept) else moved).append(pair)
        planned.append(kept)
    for pair in moved:
        for members in planned:
            if fits(pair, members):
                members.append(pair)
                break
        else:
            planned.append([pair])
    return [sorted(members) for members in planned]


class _Groups:
    """Union-find over GPUs and NICs."""

    def __init__(self) -> None:
        self._parent: dict[object, object] = {}

    def find(self, item: object) -> object:
        parent = self._parent.setdefault(item, item)
        if parent != item:
            parent = self._parent[item] = self.find(parent)
        return parent

    def union(self, a: object, b: object) -> None:
        self._parent[self.find(a)] = self.find(b)


def shares_uplink(topology: Topology, *, through_host: bool = False) -> AvoidTogether:
    """A predicate for plan_pair_rounds: True when two pairs would share a PCIe uplink.

    The heuristic, from the path classes alone. In a PCIe tree, devices that are PIX to each
    other sit under one switch (the "leaf"); devices that are PIX or PXB to each other sit under
    one root port, below the host bridge (the "tree"); both relations are transitive, and NICs
    link GPUs into the same groups (two GPUs PIX to one NIC share its switch). A pair's traffic
    climbs out of whatever it must leave:

    - NV# or PIX: nothing (NVLink, or peer-to-peer inside one switch);
    - PXB: the leaf-switch uplink of each GPU;
    - PHB, NODE, SYS (and SOC, N/A, unknown: assumed far): leaf and tree uplinks of each GPU.

    Two pairs conflict when they climb through a common uplink. With `through_host` every pair
    goes through host memory and so climbs both uplinks of both GPUs: that is the PCIe-path
    probe (NCCL_P2P_DISABLE=1, SHM), and any pair whose GPUs cannot do P2P (`topo -p2p` GNS).
    Limit: `topo -m` shows NV# instead of the PCIe class of NVLink pairs, so GPUs sharing a
    switch only behind NVLink are not seen as sharing it.
    """
    leaf, tree = _Groups(), _Groups()
    edges: list[tuple[object, object, PathClass]] = [
        (("gpu", a), ("gpu", b), path) for (a, b), path in topology.pairs().items()
    ]
    edges += [(("gpu", g), ("nic", nic), path) for (g, nic), path in topology.nic_path.items()]
    for a, b, path in edges:
        if path == PIX:
            leaf.union(a, b)
        if path in (PIX, PXB):
            tree.union(a, b)

    def climbs(pair: Pair, path: PathClass) -> frozenset[object]:
        leaves = {("leaf", leaf.find(("gpu", gpu))) for gpu in pair}
        trees = {("tree", tree.find(("gpu", gpu))) for gpu in pair}
        if through_host:
            return frozenset(leaves | trees)
        if path.is_nvlink or path in (PIX, SELF):
            return frozenset()
        if path == PXB:
            return frozenset(leaves)
        return frozenset(leaves | trees)

    uplinks = {pair: climbs(pair, path) for pair, path in topology.pairs().items()}
    nothing: frozenset[object] = frozenset()

    def avoid(p: Pair, q: Pair) -> bool:
        first = uplinks.get((min(p), max(p)), nothing)
        second = uplinks.get((min(q), max(q)), nothing)
        return bool(first & second)

    return avoid


def plan_rounds(topology: Topology, *, through_host: bool = False) -> list[list[Pair]]:
    """plan_pair_rounds over the topology's GPUs (by their indices) with shares_uplink."""
    indices = topology.indices
    avoid = shares_uplink(topology, through_host=through_host)

    def by_index(p: Pair) -> Pair:
        return (indices[p[0]], indices[p[1]])

    rounds = plan_pair_rounds(len(indices), lambda p, q: avoid(by_index(p), by_index(q)))
    return [[by_index(pair) for pair in members] for members in rounds]


# --- Output -------------------------------------------------------------------------------------


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def render_text(topology: Topology, rounds: Sequence[Sequence[Pair]]) -> str:
    """The matrix, the path classes with their counts, and the pair plan, for a terminal."""
    columns = [f"GPU{i}" for i in topology.indices] + [nic.name for nic in topology.nics]
    table: list[list[str]] = [["", *columns, "CPU Affinity", "NUMA Affinity"]]
    for gpu in topology.gpus:
        cells = [str(topology.path_between(gpu.index, other)) for other in topology.indices]
        cells += [str(topology.nic_path.get((gpu.index, nic.name), "?")) for nic in topology.nics]
        table.append(
            [
                f"GPU{gpu.index}",
                *cells,
                gpu.cpu_affinity or "N/A",
                "N/A" if gpu.numa is None else str(gpu.numa),
            ]
        )
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in table
    ]

    devices = [f"{nic.name}: {nic.device}" for nic in topology.nics if nic.device]
    if devices:
        lines += ["", "NICs: " + ", ".join(devices)]
    ids = [g for g in topology.gpus if g.uuid or g.pci_bus_id]
    if ids:
        lines += [""] + [f"GPU{g.index}: {g.uuid or '?'} at {g.pci_bus_id or '?'}" for g in ids]
    asymmetric = topology.asymmetric_pairs()
    if asymmetric:
        lines += [
            "",
            "Asymmetric cells (the farther class is used): "
            + ", ".join(f"GPU{a}-GPU{b}" for a, b in asymmetric),
        ]

    classes = topology.classes()
    lines += ["", "Path classes (GPU pairs):"]
    lines += [f"  {path}: {count}" for path, count in classes.items()] or ["  none"]
    planned = sum(len(members) for members in rounds)
    lines += [
        "",
        f"Pair plan: {_count(planned, 'pair')} in {_count(len(rounds), 'round')}",
    ]
    for n, members in enumerate(rounds, start=1):
        listed = "  ".join(f"{a}-{b} ({topology.path_between(a, b)})" for a, b in members)
        lines.append(f"  round {n}: {listed}")
    return "\n".join(lines) + "\n"


def to_json(topology: Topology, rounds: Sequence[Sequence[Pair]]) -> dict[str, Any]:
    """The topology and plan as JSON-ready data. A contract: keys are only ever added.

    gpus: [{index, uuid?, pci_bus_id?, numa?, cpu_affinity?}] (keys present when known);
    nics: [{name, device?, paths: [{gpu, path}]}];
    pairs: [{gpu, peer_gpu, path}] for gpu < peer_gpu; classes: {path: count};
    rounds: [[[gpu, peer_gpu], ...], ...].
    """
    gpus: list[dict[str, Any]] = []
    for gpu in topology.gpus:
        entry: dict[str, Any] = {"index": gpu.index}
        for key in ("uuid", "pci_bus_id", "numa", "cpu_affinity"):
            value = getattr(gpu, key)
            if value is not None:
                entry[key] = value
        gpus.append(entry)
    nics: list[dict[str, Any]] = []
    for nic in topology.nics:
        item: dict[str, Any] = {"name": nic.name}
        if nic.device is not None:
            item["device"] = nic.device
        item["paths"] = [
            {"gpu": g, "path": str(topology.nic_path[(g, nic.name)])}
            for g in topology.indices
            if (g, nic.name) in topology.nic_path
        ]
        nics.append(item)
    return {
        "gpus": gpus,
        "nics": nics,
        "pairs": [
            {"gpu": a, "peer_gpu": b, "path": str(path)}
            for (a, b), path in topology.pairs().items()
        ],
        "classes": {str(path): count for path, count in topology.classes().items()},
        "rounds": [[[a, b] for a, b in members] for members in rounds],
    }


def uniform(members: int, code: str = "SYS") -> Topology:
    """`members` ranks all joined by one path class: CPU ranks on a node without GPUs."""
    if members < 2:
        raise ValueError("pair probes need at least 2 members")
    path = PathClass.parse(code)
    gpus = tuple(Gpu(index) for index in range(members))
    links = {(a, b): path for a in range(members) for b in range(members) if a != b}
    return Topology(gpus, path=links)
