"""What `/metrics` shows, as one frozen, typed value: the daemon publishes a new Snapshot after
every change and the collectors render the current one, so a scrape never sees half an update.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeAlias

from netmon.gpu.linkhealth import LinkHealth

if TYPE_CHECKING:
    from netmon.baseline import Verdict
    from netmon.probe.spec import ProbeOutcome, SizeResult

SeriesKey: TypeAlias = tuple[str, str, int, str, int]  # (probe, op, size_bytes, path, ranks)


@dataclass(frozen=True)
class SeriesPoint:
    """The latest measurement of one (probe, op, size, path), with its baseline verdict."""

    probe: str
    op: str
    size_bytes: int
    path: str
    busbw: float
    algbw: float
    latency_s: float
    cv: float
    measured_at: float
    ranks: int = 0  # world size: a probe on the idle set has one series per rank count
    baseline: float | None = None
    ratio: float | None = None
    degraded: bool = False
    min_busbw: float | None = None
    # How the verdict was reached (netmon.baseline.Verdict): the baseline window's robust
    # spread, the busbw under which a result is low, whether the size is judged at all, low
    # results among the last N, and other processes' CPU share while it was measured.
    spread: float | None = None
    low_bound: float | None = None
    judged: bool | None = None  # None: no baseline book (netmon probe --textfile)
    low_recent: int = 0
    foreign_cpu: float | None = None

    @property
    def key(self) -> SeriesKey:
        return (self.probe, self.op, self.size_bytes, self.path, self.ranks)

    def labels(self) -> list[str]:
        return [self.probe, self.op, str(self.size_bytes), self.path, str(self.ranks)]


@dataclass(frozen=True)
class VerdictPoint:
    """A baseline restored from the state file whose series has not been measured again yet."""

    probe: str
    op: str
    size_bytes: int
    path: str
    ranks: int
    baseline: float | None
    degraded: bool

    def labels(self) -> list[str]:
        return [self.probe, self.op, str(self.size_bytes), self.path, str(self.ranks)]


@dataclass(frozen=True)
class LinkPoint:
    """One GPU pair (or CPU rank pair) of a pairs probe, at one size, with its verdict."""

    probe: str
    size_bytes: int
    gpu: int
    peer_gpu: int
    path: str  # the path class, as nvidia-smi topo -m writes it: NV18, PIX, SYS...
    busbw: float
    ratio: float | None  # to the median of its path class (judged at the largest size)
    low: bool
    suspect: bool
    measured_at: float = 0.0  # when this pair was last measured (pairs run when both are idle)


@dataclass(frozen=True)
class PeerPoint:
    """A node pair of a group's node_pairs probe, seen from the member that hosted rank 0."""

    probe: str
    size_bytes: int
    peer: str
    busbw: float


@dataclass(frozen=True)
class PeerVerdict:
    members: tuple[str, ...]
    suspects: tuple[str, ...]
    pair_suspects: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class ProbeStats:
    runs: int = 0
    failures: Mapping[str, int] = field(default_factory=dict)
    skips: Mapping[str, int] = field(default_factory=dict)
    last_success: float | None = None
    last_run: float | None = None
    duration_s: float | None = None
    busy_seconds: float = 0.0
    peak_device_memory: int | None = None
    interval_s: float = 0.0


@dataclass(frozen=True)
class GroupView:
    """What this member knows of its node group right now."""

    name: str
    members: tuple[str, ...]
    seen: tuple[str, ...]
    leader: str | None
    me: str


@dataclass(frozen=True)
class Snapshot:
    series: tuple[SeriesPoint, ...] = ()
    restored: tuple[VerdictPoint, ...] = ()
    probes: Mapping[str, ProbeStats] = field(default_factory=dict)
    paused: bool = False
    simulated: bool = False  # on a simulated GPU node (--simulate): no figure measures a GPU
    build: Mapping[str, str] = field(default_factory=dict)
    started_at: float = 0.0
    links: tuple[LinkPoint, ...] = ()
    suspect_gpus: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    pair_members: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    topology: tuple[tuple[int, int, str], ...] = ()  # (gpu, peer_gpu, path class)
    transports: tuple[tuple[str, str, str], ...] = ()  # (probe, path, transport)
    transport_faults: Mapping[tuple[str, str, str], int] = field(default_factory=dict)
    # Pairs of a pairs probe not measured (a GPU busy, paused...), by (probe, reason).
    pair_skips: Mapping[tuple[str, str], int] = field(default_factory=dict)
    link_health: LinkHealth | None = None  # the latest NVML reading, idle or under load
    # The latest reading taken under pcie-path traffic: the PCIe generation is judged on it.
    link_load: LinkHealth | None = None
    # Link telemetry: seconds between reads (0: off), reads that failed, per-link series too.
    link_interval_s: float = 0.0
    link_read_errors: int = 0
    nvlink_per_link: bool = False
    group: GroupView | None = None
    peers: tuple[PeerPoint, ...] = ()
    peer_verdicts: Mapping[str, PeerVerdict] = field(default_factory=dict)
    # Group messages that failed authentication, by the member they claimed to come from.
    group_rejected: Mapping[str, int] = field(default_factory=dict)
    # (last reload successful, failed reloads, when the configuration was last loaded)
    config_reload: tuple[bool, int, float] = (True, 0, 0.0)
    # Ranks started by method (fork, spawn), fork fallbacks by reason, starts of the zygote.
    rank_starts: Mapping[str, int] = field(default_factory=dict)
    fork_fallbacks: Mapping[str, int] = field(default_factory=dict)
    zygote_starts: int = 0
    # Results neither judged nor learned, by (probe, reason) (netmon.baseline.INCONCLUSIVE_REASONS).
    inconclusive: Mapping[tuple[str, str], int] = field(default_factory=dict)


def series_points(
    outcome: ProbeOutcome,
    probe: str,
    measured_at: float,
    *,
    path: str | None = None,
    min_busbw: float | None = None,
    judge: Callable[[SeriesKey, SizeResult], Verdict] | None = None,
) -> tuple[SeriesPoint, ...]:
    """The exported series of one probe outcome, one point per size it measured.

    Both the daemon and `netmon probe --textfile` export through here. The `path` label is the one
    the outcome ran on unless given (a group round is exported as path "group"); `judge`, the
    daemon's baseline book, gives each point its verdict.
    """
    where = outcome.spec.path if path is None else path
    points = []
    for result in outcome.results:
        key = (probe, result.op, result.size_bytes, where, outcome.spec.ranks)
        verdict = judge(key, result) if judge is not None else None
        points.append(
            SeriesPoint(
                probe=probe,
                op=result.op,
                size_bytes=result.size_bytes,
                path=where,
                busbw=result.busbw_bytes_per_second,
                algbw=result.algbw_bytes_per_second,
                latency_s=result.time_s,
                cv=result.cv,
                measured_at=measured_at,
                ranks=outcome.spec.ranks,
                baseline=verdict.baseline if verdict is not None else None,
                ratio=verdict.ratio if verdict is not None else None,
                degraded=verdict.degraded if verdict is not None else False,
                min_busbw=min_busbw,
                spread=verdict.spread if verdict is not None else None,
                low_bound=verdict.low_bound if verdict is not None else None,
                judged=verdict.judged if verdict is not None else None,
                low_recent=verdict.low_recent if verdict is not None else 0,
                foreign_cpu=result.foreign_cpu_share,
            )
        )
    return tuple(points)
