"""What `netmon sweep` delivers to each node's daemon after a sweep: the node's own pair results
and whether it was named. Sealed with the sweep secret (netmon.group.auth.Sealer), so only a
holder of the secret can write a node's sweep metrics, under this node's key only."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

# How one pair came out: judged (pass, fail) or skipped, never judged (the rest).
OUTCOMES = ("pass", "fail", "preempted", "busy", "error", "timeout", "transport_mismatch")
Outcome = Literal["pass", "fail", "preempted", "busy", "error", "timeout", "transport_mismatch"]
SEAL_GROUP = "netmon-sweep"
MAX_RESULTS = 256  # rails x rounds per node: a report larger than this is refused


def seal_key(node: str) -> str:
    return f"report/{node}"


class PeerResult(BaseModel):
    """One rail of one pair this node was in."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    peer: str = Field(min_length=1, max_length=255)
    rail: int = Field(ge=0, le=63)
    round: int = Field(ge=1, le=10)
    outcome: Outcome
    busbw: float | None = Field(None, ge=0)  # bytes/s; None when skipped
    expected: float | None = Field(None, gt=0)  # the pair's expected level it was judged by
    ratio: float | None = Field(None, ge=0)  # busbw / expected
    measured_at: float  # unix seconds


class NodeReport(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    sweep: str = Field(pattern=r"^[0-9]{13}-[0-9a-f]{6}$")  # start time in ms, then random
    node: str = Field(min_length=1, max_length=255)
    at: float  # when it was sealed (unix seconds): a stale report is refused
    finished_at: float
    results: tuple[PeerResult, ...] = Field(max_length=MAX_RESULTS)
    suspect: bool = False  # named by this sweep
    # Named as one end of a pair's path (both ends passed with other nodes): the other ends.
    suspect_peers: tuple[str, ...] = ()
