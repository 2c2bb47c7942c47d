"""Node groups, the pure part: who the members are, who leads, and how a round's world is laid out.

The lowest-named reachable member leads. A round's world puts each member's local ranks after the
previous member's, in member order, so every daemon computes the same global ranks from the plan.
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from netmon.bandwidth import parse_duration

_MEMBER = re.compile(r"^(?P<host>\[[0-9a-fA-F:]+\]|[A-Za-z0-9_.-]+):(?P<port>\d{1,5})$")
_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")


class GroupConfig(BaseModel):
    """`group:` in the daemon's configuration."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    name: str
    members: tuple[str, ...]
    # This node's entry in `members`; default: the member whose host is this host's name or
    # address. NETMON_GROUP__SELF sets it from the environment (a DaemonSet's node name).
    self_: str | None = Field(None, alias="self")
    interface: str | None = None  # NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME for probe traffic
    heartbeat: float = Field(1.0, gt=0, description="seconds between member checks")
    ready_timeout: float = Field(5.0, gt=0, description="seconds a round waits for members")

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

    @field_validator("heartbeat", "ready_timeout", mode="before")
    @classmethod
    def _durations(cls, value: object) -> object:
        return parse_duration(value) if isinstance(value, (str, int, float)) else value

    @model_validator(mode="after")
    def _self_is_member(self) -> GroupConfig:
        if self.self_ is not None and self.self_ not in self.members:
            raise ValueError(f"self {self.self_!r} is not one of the members")
        return self


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


def lay_out(members: Sequence[str], local_ranks: Mapping[str, int]) -> World:
    ordered = sorted(members)
    ranks_of: dict[str, tuple[int, ...]] = {}
    next_rank = 0
    for member in ordered:
        count = local_ranks[member]
        ranks_of[member] = tuple(range(next_rank, next_rank + count))
        next_rank += count
    return World(tuple(ordered), ranks_of, member_host(ordered[0]))
