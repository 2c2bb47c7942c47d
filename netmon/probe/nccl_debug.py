"""Pure parsing of NCCL_DEBUG=INFO output into the transports NCCL actually chose.

A probe states an intent (NVLink, the PCIe/host-memory path, or anything); what the log says
against it is judged in netmon.probe.transport_faults (within a node) and netmon.probe.crossnode
(between nodes).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Literal

TransportClass = Literal["p2p", "shm", "net_ib", "net_socket", "net_other", "nvls"]
TRANSPORT_CLASSES: tuple[TransportClass, ...] = (
    "p2p",
    "shm",
    "net_ib",
    "net_socket",
    "net_other",
    "nvls",
)
Locality = Literal["intra_node", "inter_node", "unknown"]
# Across nodes, a node group's `transport` (netmon.probe.crossnode): net_ib, net_socket, net.
Intent = Literal["nvlink", "pcie", "any", "net_ib", "net_socket", "net"]
Direction = Literal["send", "receive"]

# NCCL_RUNTIME_CONNECT (default on since 2.22) defers connection setup, and so the "Channel ...
# via ..." lines, to the first collective that needs them.
_LAZY_SINCE = (2, 22)

# mpirun --tag-output prefixes; they may also appear in the middle of a line when ranks interleave.
_MPI_TAG_RE = re.compile(r"\[\d+,\d+\]<(?:stdout|stderr)>:")
# NCCL's own prefix is "[timestamp] host:pid:tid [cudaDev] " plus "file:line (func) " for WARN.
# Searching (not matching) from the left lets any launcher prefix (torchrun, srun -l) precede it.
_LINE_RE = re.compile(
    r"(?:(?P<host>[^\s:\[\]]+):(?P<pid>\d+):(?P<tid>\d+)\s+)?"
    r"(?:\[\d+\]\s+)?"
    r"(?:\S+:\d+(?:\s+\([^)]*\))?\s+)?"
    r"NCCL (?P<level>INFO|WARN) (?P<msg>.*)$"
)
# Since 2.26 the version banner has its own log level, printed without the host prefix.
_VERSION_RE = re.compile(r"\bNCCL version (?P<version>\d+\.\d+\.\d+\S*)")
# From NCCL's history: "Ring" before 2.7; no "/connIndex" before 2.14 nor on SHM lines; the
# bracket holds the nvmlDev index since 2.18.3 and the PCI busId in hex before ("3[4a000]").
_CHANNEL_RE = re.compile(
    r"^(?:Channel|Ring) (?P<channel>\d+)(?:/(?P<conn>\d+))? : "
    r"(?P<src>\d+)\[(?P<src_dev>[0-9a-fA-Fx]+)\] -> (?P<dst>\d+)\[(?P<dst_dev>[0-9a-fA-Fx]+)\]"
    r"(?: \[(?P<dir>send|receive)\])? via (?P<via>.+?)\s*$"
)
# The network name may contain spaces ("AWS Libfabric"); the device index always follows it,
# then an optional "(proxyRank)" when PXN routes through another GPU's NIC.
_NET_RE = re.compile(r"^NET/(?P<name>.+?)/(?P<dev>\d+)(?:\((?P<proxy>\d+)\))?(?P<rest>.*)$")
_COMM_RE = re.compile(
    r"\bcomm (?P<comm>\S+) rank (?P<rank>\d+) nRanks (?P<nranks>\d+) nNodes (?P<nnodes>\d+) "
    r"localRanks (?P<lranks>\d+) localRank (?P<lrank>\d+)(?: MNNVL (?P<mnnvl>\d+))?"
)
# ncclCommInitRank / Destroy lines: only used to place ranks on hosts.
_RANK_LINE_RE = re.compile(r"\brank (?P<rank>\d+) nranks (?P<nranks>\d+) cudaDev \d+")
# nccl-tests' device listing, often in the same combined log: it places ranks on hosts too.
_TESTS_RANK_RE = re.compile(
    r"^#?\s*Rank\s+(?P<rank>\d+)\s+(?:Group\s+\d+\s+)?Pid\s+\d+\s+on\s+(?P<host>\S+)\s"
)
_ENV_RE = re.compile(r"^(?P<name>NCCL_\w+) set (?:by environment )?to (?P<value>.*?)\s*$")
_NVLS_SUPPORT_RE = re.compile(r"^NVLS multicast support is (?P<not>not )?available")
# Either line means NVLS buffers were built or its tree connected, not just that it could be.
_NVLS_USED_RE = re.compile(r"^(?:NVLS comm \S+ headRank|Connected NVLS tree)")
_P2P_NVLINK_DISABLED_RE = re.compile(
    r"P2P is disabled between NVLINK connected GPUs (?P<a>\d+) and (?P<b>\d+)"
)


@dataclass(frozen=True)
class Endpoint:
    rank: int
    device: str  # nvmlDev index ("3"); the busId in hex before NCCL 2.18.3 ("4a000")


@dataclass(frozen=True)
class Connection:
    """One "Channel ... -> ... via ..." line: one direction of one channel between two ranks."""

    channel: int
    conn_index: int | None  # absent on SHM lines and before NCCL 2.14
    src: Endpoint
    dst: Endpoint
    direction: Direction | None  # only NET lines say; both ends log them
    via: str  # verbatim: "P2P/IPC/read", "SHM/direct/direct", "NET/IB/0/GDRDMA"
    transport: TransportClass
    host: str | None  # the host that logged the line
    locality: Locality

    @property
    def gdr(self) -> bool:
        """GPUDirect RDMA: the NIC reads/writes GPU memory without a host bounce."""
        return self.via.startswith("NET/") and "/GDRDMA" in self.via

    @property
    def p2p_read(self) -> bool:
        return self.transport == "p2p" and "/read" in self.via


@dataclass(frozen=True)
class CommInfo:
    """The "comm 0x.. rank R nRanks N nNodes M localRanks L localRank l MNNVL x" line."""

    comm: str
    rank: int
    n_ranks: int
    n_nodes: int
    local_ranks: int
    local_rank: int
    mnnvl: bool | None  # None if the field is missing (the line has carried it since 2.20)
    host: str | None


@dataclass(frozen=True)
class EnvOverride:
    name: str
    value: str


@dataclass(frozen=True)
class TransportReport:
    nccl_version: str | None  # the first banner seen, e.g. "2.22.3+cuda12.2"
    connections: tuple[Connection, ...]
    comms: tuple[CommInfo, ...]
    nvls_available: bool | None  # None: no "NVLS multicast support" line at all
    nvls_used: bool
    env: tuple[EnvOverride, ...]  # distinct (name, value) pairs in order of first appearance
    warnings: tuple[str, ...]  # distinct NCCL WARN messages
    p2p_disabled_on_nvlink: tuple[tuple[int, int], ...]  # GPU pairs named by that warning
    unrecognized: tuple[str, ...]  # "via" texts this parser does not know, kept for diagnosis

    @property
    def observed(self) -> bool:
        """Whether any connection was logged; with lazy connect, none exist before a collective."""
        return bool(self.connections)

    @property
    def version_tuple(self) -> tuple[int, int, int] | None:
        return version_tuple(self.nccl_version) if self.nccl_version else None

    @property
    def connects_lazily(self) -> bool | None:
        version = self.version_tuple
        return None if version is None else version[:2] >= _LAZY_SINCE

    @property
    def n_ranks(self) -> int | None:
        return max((c.n_ranks for c in self.comms), default=None)

    @property
    def n_nodes(self) -> int | None:
        return max((c.n_nodes for c in self.comms), default=None)

    @property
    def mnnvl(self) -> bool:
        return any(c.mnnvl for c in self.comms)

    @property
    def transports(self) -> frozenset[TransportClass]:
        found: set[TransportClass] = {c.transport for c in self.connections}
        if self.nvls_used:
            found.add("nvls")
        return frozenset(found)

    @property
    def intra_node_transports(self) -> frozenset[TransportClass]:
        found: set[TransportClass] = {
            c.transport for c in self.connections if c.locality == "intra_node"
        }
        # NVLS multicast lives on one node's NVSwitch unless the NVLink domain spans nodes.
        if self.nvls_used and not self.mnnvl:
            found.add("nvls")
        return frozenset(found)

    @property
    def inter_node_transports(self) -> frozenset[TransportClass]:
        return frozenset(c.transport for c in self.connections if c.locality == "inter_node")

    def env_value(self, name: str) -> str | None:
        """The last value logged for an NCCL_* variable that the environment set."""
        values = [e.value for e in self.env if e.name == name]
        return values[-1] if values else None


def version_tuple(version: str) -> tuple[int, int, int] | None:
    match = re.match(r"^(\d+)\.(\d+)\.(\d+)", version)
    if not match:
        return None
    return int(match.group(1)), int(match.group(2)), int(match.group(3))


def classify_via(via: str) -> TransportClass | None:
    """The transport class of a "via" text, or None if it is not one NCCL is known to print."""
    if via.startswith("P2P/"):
        # IPC, CUMEM, MNNVL, direct pointer, indirect, common device (2.5), each optionally
        # /read and /CE: all GPU-to-GPU peer access, which by itself says nothing about NVLink.
        return "p2p"
    # "direct shared memory" is SHM's name before NCCL 2.13; SHM/CE/... uses the copy engine.
    if via.startswith("SHM/") or via == "direct shared memory":
        return "shm"
    net = _NET_RE.match(via)
    if net:
        name = net.group("name")
        # IBext is the nccl-rdma-sharp plugin's name for the same verbs path over the same HCAs.
        if name == "IB" or name.startswith("IBext"):
            return "net_ib"
        if name == "Socket":
            return "net_socket"
        return "net_other"  # AWS Libfabric (EFA), other plugins
    return None


@dataclass(frozen=True)
class _Line:
    host: str | None
    level: str
    msg: str


def _lines(text: str) -> Iterator[_Line | str]:
    """NCCL log records, and the remaining lines (tag-stripped) as plain strings."""
    for raw in text.splitlines():
        line = _MPI_TAG_RE.sub("", raw)
        match = _LINE_RE.search(line)
        if match:
            yield _Line(match.group("host"), match.group("level"), match.group("msg").strip())
        else:
            yield line


@dataclass(frozen=True)
class _RawConnection:
    channel: int
    conn_index: int | None
    src: Endpoint
    dst: Endpoint
    direction: Direction | None
    via: str
    transport: TransportClass
    host: str | None


def _place(places: dict[int, set[str]], rank: int, host: str | None) -> None:
    if host is not None:
        places.setdefault(rank, set()).add(host)


def _rank_hosts(
    raw: Iterable[_RawConnection], known: dict[int, set[str]], mnnvl: bool
) -> dict[int, str]:
    places = {rank: set(hosts) for rank, hosts in known.items()}
    for conn in raw:
        # The receive side logs NET receive lines; the sender logs everything else.
        logger, peer = (conn.dst, conn.src) if conn.direction == "receive" else (conn.src, conn.dst)
        _place(places, logger.rank, conn.host)
        # SHM, and P2P without a multi-node NVLink domain, only ever join ranks on one host.
        if conn.transport == "shm" or (conn.transport == "p2p" and not mnnvl):
            _place(places, peer.rank, conn.host)
    # A rank seen on two hosts comes from two communicators (rank numbers are per communicator):
    # its place is unknown rather than guessed.
    return {rank: next(iter(hosts)) for rank, hosts in places.items() if len(hosts) == 1}


def _locality(
    conn: _RawConnection, hosts: dict[int, str], single_node: bool, mnnvl: bool
) -> Locality:
    src, dst = hosts.get(conn.src.rank), hosts.get(conn.dst.rank)
    if src is not None and dst is not None:
        return "intra_node" if src == dst else "inter_node"
    if single_node or conn.transport == "shm" or (conn.transport == "p2p" and not mnnvl):
        return "intra_node"
    return "unknown"


def parse(text: str) -> TransportReport:
    """Parse NCCL_DEBUG=INFO text: one rank's NCCL_DEBUG_FILE or a launcher's combined output."""
    version: str | None = None
    raw: list[_RawConnection] = []
    comms: list[CommInfo] = []
    nvls_support: list[bool] = []
    nvls_used = False
    env: dict[tuple[str, str], None] = {}
    warnings: dict[str, None] = {}
    disabled_pairs: dict[tuple[int, int], None] = {}
    unrecognized: dict[str, None] = {}
    known_hosts: dict[int, set[str]] = {}

    for item in _lines(text):
        if isinstance(item, str):
            version_match = _VERSION_RE.search(item)
            if version_match and version is None:
                version = version_match.group("version")
            rank_line = _TESTS_RANK_RE.match(item.strip())
            if rank_line:
                _place(known_hosts, int(rank_line.group("rank")), rank_line.group("host"))
            continue
        msg = item.msg
        if item.level == "WARN":
            warnings[msg] = None
            pair = _P2P_NVLINK_DISABLED_RE.search(msg)
            if pair:
                disabled_pairs[(int(pair.group("a")), int(pair.group("b")))] = None
            continue
        channel = _CHANNEL_RE.match(msg)
        if channel:
            via = channel.group("via")
            transport = classify_via(via)
            if transport is None:
                unrecognized[via] = None
                continue
            conn = channel.group("conn")
            direction = channel.group("dir")
            raw.append(
                _RawConnection(
                    channel=int(channel.group("channel")),
                    conn_index=int(conn) if conn is not None else None,
                    src=Endpoint(int(channel.group("src")), channel.group("src_dev")),
                    dst=Endpoint(int(channel.group("dst")), channel.group("dst_dev")),
                    direction="send" if direction == "send" else "receive" if direction else None,
                    via=via,
                    transport=transport,
                    host=item.host,
                )
            )
            continue
        version_match = _VERSION_RE.search(msg)
        if version_match:
            version = version or version_match.group("version")
            continue
        comm = _COMM_RE.search(msg)
        if comm:
            mnnvl = comm.group("mnnvl")
            comms.append(
                CommInfo(
                    comm=comm.group("comm"),
                    rank=int(comm.group("rank")),
                    n_ranks=int(comm.group("nranks")),
                    n_nodes=int(comm.group("nnodes")),
                    local_ranks=int(comm.group("lranks")),
                    local_rank=int(comm.group("lrank")),
                    mnnvl=None if mnnvl is None else mnnvl != "0",
                    host=item.host,
                )
            )
            _place(known_hosts, int(comm.group("rank")), item.host)
            continue
        rank_line = _RANK_LINE_RE.search(msg)
        if rank_line:
            _place(known_hosts, int(rank_line.group("rank")), item.host)
            continue
        env_match = _ENV_RE.match(msg)
        if env_match:
            # param.cc ends the value with a full stop ("set by environment to 8388608."),
            # other call sites do not.
            value = env_match.group("value").removesuffix(".")
            env[(env_match.group("name"), value)] = None
            continue
        support = _NVLS_SUPPORT_RE.match(msg)
        if support:
            nvls_support.append(support.group("not") is None)
            continue
        if _NVLS_USED_RE.match(msg):
            nvls_used = True

    mnnvl_domain = any(c.mnnvl for c in comms)
    # Every communicator on one node: even a NET connection (P2P and SHM both off) stays inside it.
    single_node = bool(comms) and all(c.n_nodes == 1 for c in comms)
    hosts = _rank_hosts(raw, known_hosts, mnnvl_domain)
    connections = tuple(
        Connection(
            channel=r.channel,
            conn_index=r.conn_index,
            src=r.src,
            dst=r.dst,
            direction=r.direction,
            via=r.via,
            transport=r.transport,
            host=r.host,
            locality=_locality(r, hosts, single_node, mnnvl_domain),
        )
        for r in raw
    )
    return TransportReport(
        nccl_version=version,
        connections=connections,
        comms=tuple(comms),
        nvls_available=all(nvls_support) if nvls_support else None,
        nvls_used=nvls_used,
        env=tuple(EnvOverride(name, value) for name, value in env),
        warnings=tuple(warnings),
        p2p_disabled_on_nvlink=tuple(disabled_pairs),
        unrecognized=tuple(unrecognized),
    )
