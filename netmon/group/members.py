"""Node groups, the pure part: who the members are, who leads, how a round's world is laid out,
and which network its rounds must show between nodes (the reads it needs are passed in).

The lowest-named reachable member leads. A round's world puts each member's local ranks after the
previous member's, in member order, so every daemon computes the same global ranks from the plan.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import re
import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from netmon.bandwidth import parse_duration
from netmon.gpu.fabric import FabricReading, in_nvlink_domain
from netmon.gpu.idle import IdleSourceError
from netmon.schema import ANY_TEXT, DURATION_TEXT, also
from netmon.topology.model import Topology

_MEMBER = re.compile(r"^(?P<host>\[[0-9a-fA-F:]+\]|[A-Za-z0-9_.-]+):(?P<port>\d{1,5})$")
_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")

# The network NCCL must carry a group's rounds on between nodes, as its NCCL_DEBUG=INFO log shows
# it (docs/GROUPS.md, "The transport"): ib, NCCL's InfiniBand verbs transport (RoCE too); socket,
# its TCP sockets; net, any network transport but sockets (IB verbs or a net plugin such as EFA's);
# any, not judged. Left unset, the node decides (`round_transport`).
Transport = Literal["ib", "socket", "net", "any"]
TRANSPORTS: tuple[Transport, ...] = get_args(Transport)
# One entry per RDMA device the kernel has (mlx5_0 for InfiniBand or RoCE, EFA's devices too),
# whether or not this container may open it: RDMA that NCCL cannot use is what the check is for.
RDMA_ROOT = Path("/sys/class/infiniband")


class GroupConfig(BaseModel):
    """`group:` in the daemon's configuration."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    name: str
    members: tuple[str, ...] = Field(json_schema_extra=also(ANY_TEXT))
    # This node's entry in `members`; default: the member whose host is this host's name or
    # address. NETMON_GROUP__SELF sets it from the environment (a DaemonSet's node name).
    self_: str | None = Field(None, alias="self")
    interface: str | None = None  # NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME for probe traffic
    # The group's shared secret (at least 16 bytes): every message between members carries an
    # HMAC with it (netmon.group.auth). Read at start, never logged or exported.
    secret_file: Path | None = None
    # Per-member Ed25519 keys (netmon.group.signing): this member's private key signs the pair
    # results it reports, and the leader takes a pair's result only when it verifies under a
    # public key listed for the member that measured it (more than one while a key is rotated).
    # Set both or neither; with them, no member can forge another's results.
    signing_key_file: Path | None = None
    verify_keys: dict[str, tuple[Path, ...]] = Field(default_factory=dict)
    # The address this member's store listens on; default: this member's host, resolved.
    bind: str | None = None
    heartbeat: float = Field(
        1.0,
        gt=0,
        json_schema_extra=also(DURATION_TEXT),
        description="seconds between member checks",
    )
    ready_timeout: float = Field(
        5.0,
        gt=0,
        json_schema_extra=also(DURATION_TEXT),
        description="seconds a round waits for members",
    )
    # A round whose NCCL log shows another network between nodes fails as transport_mismatch.
    # "any" when unset, for the schema; the rounds then go by `round_transport`.
    transport: Transport = "any"

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _NAME.fullmatch(value):
            raise ValueError("use 1-32 characters: lowercase letters, digits, - or _")
        return value

    @field_validator("members", mode="before")
    @classmethod
    def _members(cls, value: object) -> object:
        if isinstance(value, str):
            value = [part.strip() for part in value.split(",") if part.strip()]
        if isinstance(value, (list, tuple)):
            members = tuple(str(v) for v in value)
            for member in members:
                match = _MEMBER.fullmatch(member)
                if not match or not 0 < int(match.group("port")) < 65536:
                    raise ValueError(f"{member!r} is not HOST:PORT (10.0.0.1:29400)")
            if len(set(members)) != len(members):
                raise ValueError("members must be unique")
            if not members:
                raise ValueError("a group needs members")
            return members
        return value

    @field_validator("verify_keys", mode="before")
    @classmethod
    def _verify_keys(cls, value: object) -> object:
        # One file or a list of them per member.
        if isinstance(value, dict):
            return {m: [p] if isinstance(p, (str, Path)) else p for m, p in value.items()}
        return value

    @field_validator("transport", mode="before")
    @classmethod
    def _transport(cls, value: object) -> object:
        if value not in TRANSPORTS:
            raise ValueError(
                "use ib (NCCL's InfiniBand verbs, RoCE too), socket (TCP sockets), net (any "
                "network transport but sockets) or any (not checked)"
            )
        return value

    @field_validator("heartbeat", "ready_timeout", mode="before")
    @classmethod
    def _durations(cls, value: object) -> object:
        return parse_duration(value) if isinstance(value, (str, int, float)) else value

    @model_validator(mode="after")
    def _self_is_member(self) -> GroupConfig:
        if self.self_ is not None and self.self_ not in self.members:
            raise ValueError(f"self {self.self_!r} is not one of the members")
        if self.secret_file is None:
            raise ValueError(
                "secret_file is required: a file with the group's shared secret, the same on "
                "every member (openssl rand -hex 32 > /etc/netmon/group.secret)"
            )
        strangers = sorted(set(self.verify_keys) - set(self.members))
        if strangers:
            raise ValueError(f"verify_keys: {', '.join(strangers)} are not members")
        if self.verify_keys or self.signing_key_file is not None:
            unkeyed = [m for m in self.members if not self.verify_keys.get(m)]
            if unkeyed or self.signing_key_file is None:
                raise ValueError(
                    "per-member keys need both signing_key_file (this member's Ed25519 key) and "
                    "verify_keys with a public key for every member"
                    + (f" (none for {', '.join(unkeyed)})" if unkeyed else "")
                )
        return self


def round_transport(
    group: GroupConfig,
    backend: str | None,
    rdma_devices: Sequence[str],
    nvlink_domain: bool | None,
) -> tuple[Transport, str]:
    """The network a member's rounds must show between nodes, and why (pure).

    A configured `transport` is kept. Unset, this member's node decides: NCCL ranks on a node with
    RDMA devices (InfiniBand, RoCE, EFA) get `net`, so a round NCCL carried on TCP sockets, its
    quiet fallback when RDMA does not start, fails as transport_mismatch, while IB and net
    plugins pass. Everything else gets `any`: a node without RDMA may well be on sockets; in a
    multi-node NVLink domain (`nvlink_domain`; None when NVML did not say) NCCL may join the
    nodes by NVLink with no network at all; gloo ranks write no NCCL log to judge.
    """
    if "transport" in group.model_fields_set:
        return group.transport, "configured"
    if (backend or "gloo") != "nccl":
        return "any", "gloo ranks: no NCCL log to judge"
    if not rdma_devices:
        return "any", "no RDMA device on this node: TCP sockets may be its network"
    if nvlink_domain is None:
        return "any", "NVML did not say whether the node is in a multi-node NVLink domain"
    if nvlink_domain:
        return "any", "a multi-node NVLink domain: NCCL may join its nodes without the network"
    return "net", f"RDMA devices on this node ({', '.join(rdma_devices)}): sockets are a fallback"


def node_transport(
    group: GroupConfig,
    backend: str | None,
    topology: Topology | None,
    fabric: Callable[[], Sequence[FabricReading]],
    rdma_root: Path = RDMA_ROOT,
) -> tuple[Transport, str]:
    """`round_transport` on this node, read now, and only where the answer depends on it: the
    kernel's RDMA devices and a `topo -m` topology's NICs (nvidia-smi lists RDMA devices there),
    then NVML's fabric reading (`fabric`, netmon.gpu.nvml_links.read_fabric)."""
    if "transport" in group.model_fields_set or (backend or "gloo") != "nccl":
        return round_transport(group, backend, (), None)
    found: set[str] = {nic.device or nic.name for nic in (topology.nics if topology else ())}
    with contextlib.suppress(OSError):
        found.update(entry.name for entry in rdma_root.iterdir())
    domain = None
    with contextlib.suppress(IdleSourceError):
        domain = in_nvlink_domain(fabric()) if found else None
    return round_transport(group, backend, sorted(found), domain)


# Where the NVIDIA driver puts IMEX channels (NVIDIA's IMEX guide, "IMEX channels"): a process
# exports or imports memory across the nodes of an NVLink domain only through one of them.
IMEX_CHANNELS = Path("/dev/nvidia-caps-imex-channels")


def mnnvl_env(
    transport: Transport, nvlink_domain: bool | None, imex_channel: bool
) -> tuple[dict[str, str], str]:
    """The NCCL setting of a cross-node round for multi-node NVLink (MNNVL), and why (pure).

    For ranks on two or more nodes whose GPUs share an NVLink domain, NCCL (2.20 and later, by
    default) tries to join the nodes by NVLink and fails the communicator when the process has
    no IMEX channel ("MNNVL ... is available but not working", src/mnnvl.cc). A round meant to
    show the network (`transport` net, net_ib, net_socket) asks NCCL for the network; one that
    may take any path keeps NCCL's choice where a channel is there and the network where not.
    """
    if transport in ("net", "net_ib", "net_socket"):
        return {"NCCL_MNNVL_ENABLE": "0"}, f"transport {transport}: the network is measured"
    if nvlink_domain and not imex_channel:
        return {"NCCL_MNNVL_ENABLE": "0"}, (
            f"a multi-node NVLink domain without an IMEX channel ({IMEX_CHANNELS} is empty): "
            "NCCL would fail every round; the network is measured instead (docs/GROUPS.md)"
        )
    return {}, "NCCL's own choice"


def node_mnnvl_env(
    backend: str | None, transport: Transport, fabric: Callable[[], Sequence[FabricReading]]
) -> tuple[dict[str, str], str]:
    """`mnnvl_env` on this node, read now: NVML's fabric and the IMEX channels."""
    if (backend or "gloo") != "nccl":
        return {}, "gloo ranks: no NCCL"
    domain = None
    with contextlib.suppress(IdleSourceError):
        domain = in_nvlink_domain(fabric())
    return mnnvl_env(transport, domain, imex_channel_present())


def round_env(interface: str | None, mnnvl: Mapping[str, str]) -> dict[str, str]:
    """The settings of this member's round ranks: the group's interface for gloo's and NCCL's
    sockets, and the MNNVL choice (`mnnvl_env`)."""
    env = dict(mnnvl)
    if interface:
        env["GLOO_SOCKET_IFNAME"] = env["NCCL_SOCKET_IFNAME"] = interface
    return env


def imex_channel_present(root: Path = IMEX_CHANNELS) -> bool:
    with contextlib.suppress(OSError):
        return any(entry.name.startswith("channel") for entry in root.iterdir())
    return False


def member_host(member: str) -> str:
    return member.rpartition(":")[0].strip("[]")


def member_port(member: str) -> int:
    return int(member.rpartition(":")[2])


def identify_self(group: GroupConfig, names: Sequence[str] | None = None) -> str:
    """This node's member: configured, else the one whose host is one of this host's names."""
    if group.self_ is not None:
        return group.self_
    if names is None:
        hostname = socket.gethostname()
        names = [hostname, socket.getfqdn()]
        with contextlib.suppress(OSError):
            names += socket.gethostbyname_ex(hostname)[2]
    matches = [m for m in group.members if member_host(m) in set(names)]
    if len(matches) != 1:
        raise ValueError(
            f"group.self: cannot tell which member this node is ({len(matches)} members match "
            f"{', '.join(sorted(set(names)))}); set group.self or NETMON_GROUP__SELF"
        )
    return matches[0]


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def bind_address(group: GroupConfig, me: str) -> str:
    """The address this member's store listens on: `bind`, else this member's host, resolved."""
    host = group.bind or member_host(me)
    try:
        address = str(socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)[0][4][0])
    except (socket.gaierror, UnicodeError) as exc:
        raise ValueError(
            f"group.bind: cannot resolve {host!r} ({exc}); set group.bind to this node's "
            "address on the group network"
        ) from None
    remote = [m for m in group.members if not _loopback(member_host(m))]
    if _loopback(address) and remote:
        raise ValueError(
            f"group.bind: {host!r} resolves to {address}, a loopback address, so other members "
            "could not reach this one; set group.bind to this node's address on the group network"
        )
    return address


def leader_of(reachable: Sequence[str]) -> str | None:
    """The lowest-named reachable member."""
    return min(reachable) if reachable else None


@dataclass(frozen=True)
class World:
    """One round's ranks: each member's global ranks, in member order."""

    members: tuple[str, ...]
    ranks_of: Mapping[str, tuple[int, ...]]
    host: str  # rank 0's member host: where the round's rendezvous store listens

    @property
    def size(self) -> int:
        return sum(len(ranks) for ranks in self.ranks_of.values())

    @property
    def reporters(self) -> tuple[int, ...]:
        # One rank per member reports results, so every member holds its view of the round.
        return tuple(ranks[0] for ranks in self.ranks_of.values())

    def to_json(self) -> str:
        return json.dumps(
            {
                "members": list(self.members),
                "host": self.host,
                "ranks": {m: list(r) for m, r in self.ranks_of.items()},
            }
        )

    @classmethod
    def from_json(cls, text: str) -> World:
        data: dict[str, Any] = json.loads(text)
        ranks = {m: tuple(int(r) for r in rs) for m, rs in data["ranks"].items()}
        return cls(tuple(data["members"]), ranks, str(data["host"]))


def lay_out(
    members: Sequence[str],
    local_ranks: Mapping[str, int],
    addresses: Mapping[str, str] | None = None,
) -> World:
    """The world of a round; rank 0's store listens on its member's `addresses` entry (the
    address that member's store is bound to), else on its member host."""
    ordered = sorted(members)
    ranks_of: dict[str, tuple[int, ...]] = {}
    next_rank = 0
    for member in ordered:
        count = local_ranks[member]
        ranks_of[member] = tuple(range(next_rank, next_rank + count))
        next_rank += count
    first = ordered[0]
    return World(tuple(ordered), ranks_of, (addresses or {}).get(first) or member_host(first))
