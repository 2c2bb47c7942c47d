"""What `/metrics` shows, as one frozen, typed value: the daemon publishes a new Snapshot after
every change and the collectors render the current one, so a scrape never sees half an update.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, TypeAlias

from netmon.gpu.linkhealth import LinkHealth

if TYPE_CHECKING:
    from netmon.baseline import Verdict
    from netmon.probe.spec import ProbeOutcome, SizeResult
    from netmon.probe.streaks import Streak
    from netmon.sweep.delivery.node_report import NodeReport

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
    # The long-term reference, why the series is degraded, whether its low line sits at the
    # floor, and when it last had a conclusive result (None: not since the daemon started).
    reference: float | None = None
    reason: str | None = None
    at_floor: bool = False
    judged_at: float | None = None
    # (mode, share) of the ranks' CPUs taken by irq, softirq and steal meanwhile: shown only.
    cpu_modes: tuple[tuple[str, float], ...] = ()
    sm_clock_hz: float | None = None  # the ranks' GPUs' lowest SM clock right after measuring
    # The long level and the line it is judged by against the reference, whether the reference
    # is learned over a day yet, low or noisy results among the last flap_window, since when the
    # series is degraded and how often it turned since the daemon started (netmon.baseline).
    long_level: float | None = None
    reference_line: float | None = None
    reference_mature: bool = False
    flaps: int = 0
    degraded_since: float | None = None
    episodes: int = 0
    # The series runs steadily above its reference (an upgrade): `netmon rebaseline` would
    # take the reference up to it (netmon.baseline.Verdict.reference_stale).
    reference_stale: bool = False

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
    reference: float | None = None
    reason: str | None = None
    judged: bool = True
    # The state file keeps the long level's results, the reference's hours and since when the
    # series is degraded; the episodes are counted from the start (netmon.baseline.Verdict).
    long_level: float | None = None
    reference_mature: bool = False
    degraded_since: float | None = None
    episodes: int = 0
    reference_stale: bool = False

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
    suspect_sweeps: int = 0  # sweeps in a row, of those that measured the pair, that named it


@dataclass(frozen=True)
class PeerPoint:
    """A node pair of a group's node_pairs probe, seen from the member that hosted rank 0."""

    probe: str
    size_bytes: int
    peer: str
    busbw: float


@dataclass(frozen=True)
class PeerVerdict:
    """The leader's latest verdict on its group's node pairs, with each member's and each node
    pair's streak (netmon.probe.streaks) over the sweeps this leader judged since it started."""

    members: tuple[str, ...]
    suspects: tuple[str, ...]
    pair_suspects: tuple[tuple[str, str], ...]
    streaks: Mapping[str, Streak] = field(default_factory=dict)
    pair_streaks: Mapping[tuple[str, str], Streak] = field(default_factory=dict)


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
    # CPU seconds of its ranks by phase of a run (netmon.probe.rankcpu.CPU_PHASES), summed.
    rank_cpu_seconds: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class GroupView:
    """What this member knows of its node group right now."""

    name: str
    members: tuple[str, ...]
    seen: tuple[str, ...]
    leader: str | None
    me: str


@dataclass(frozen=True)
class SweepView:
    """What cluster sweeps delivered to this node (POST /sweep): the last report accepted, the
    sweeps in a row that named this node, how often the recent sweeps started naming it again,
    and deliveries by outcome."""

    report: NodeReport | None = None
    suspect_sweeps: int = 0
    suspect_onsets: int = 0
    reports: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class JobsView:
    """What the daemon read of the jobs' own collectives (NCCL Inspector, `inspector:`)."""

    collectives: Mapping[str, int] = field(default_factory=dict)  # by path
    overflow: int = 0
    shapes: int = 0
    covered: float | None = None
    rejected: Mapping[str, int] = field(default_factory=dict)
    removed: int = 0
    directories: Mapping[str, int] = field(default_factory=dict)  # by state, the last read
    unconfirmed: int = 0  # degraded windows of a node shape that no second witness confirmed
    read_at: float | None = None
    window_s: float = 0.0  # a shape's sample spans this long: its "probe interval"
    # (op, size_bytes, ranks) -> the node shape's busbw over the idle probe's reference
    probe_ratios: Mapping[tuple[str, int, int], float] = field(default_factory=dict)


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
    # Per pairs probe, each GPU's streak: sweeps in a row that named it, when one last measured it.
    gpu_streaks: Mapping[str, Mapping[int, Streak]] = field(default_factory=dict)
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
    # The shortest interval of the probes whose pcie-path traffic is read under (0: none).
    link_load_interval_s: float = 0.0
    link_read_errors: int = 0
    nvlink_per_link: bool = False
    group: GroupView | None = None
    peers: tuple[PeerPoint, ...] = ()
    peer_verdicts: Mapping[str, PeerVerdict] = field(default_factory=dict)
    # Group messages that failed authentication, by the member they claimed to come from.
    group_rejected: Mapping[str, int] = field(default_factory=dict)
    # What this member's store refused, by reason; results refused by (member, reason).
    group_store_refused: Mapping[str, int] = field(default_factory=dict)
    group_results_refused: Mapping[tuple[str, str], int] = field(default_factory=dict)
    # (last reload successful, failed reloads, when the configuration was last loaded)
    config_reload: tuple[bool, int, float] = (True, 0, 0.0)
    # Ranks started by method (fork, spawn), fork fallbacks by reason, starts of the zygote.
    rank_starts: Mapping[str, int] = field(default_factory=dict)
    fork_fallbacks: Mapping[str, int] = field(default_factory=dict)
    zygote_starts: int = 0
    clock_steps: int = 0  # steps of the wall clock the schedule followed (netmon.serve.steady)
    # Results neither judged nor learned, by (probe, reason) (netmon.baseline.INCONCLUSIVE_REASONS).
    inconclusive: Mapping[tuple[str, str], int] = field(default_factory=dict)
    # Results of judged series by probe, conclusive or not (the disturbed share's denominator).
    series_results: Mapping[str, int] = field(default_factory=dict)
    # The baseline state: restored at start, failed saves, series forgotten by (probe, reason).
    baseline_restored: bool = False
    # A state file found at start but unusable, by reason (netmon.baseline.state.PROBLEM_REASONS).
    state_errors: Mapping[str, int] = field(default_factory=dict)
    state_write_errors: int = 0
    reference_resets: Mapping[tuple[str, str], int] = field(default_factory=dict)
    sweep: SweepView | None = None  # None: no sweep.secret_file, POST /sweep is 404
    jobs: JobsView | None = None  # None: no `inspector:` section
    # The model of the node's probed GPUs as NVML names it, "cpu" on CPU ranks (gloo); None
    # where no daemon knows it (netmon probe --textfile).
    gpu_model: str | None = None


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
                min_busbw=min_busbw,
                **verdict_fields(verdict),
                foreign_cpu=result.foreign_cpu_share,
                cpu_modes=tuple(result.cpu_modes.items()),
                sm_clock_hz=result.sm_clock_hz,
            )
        )
    return tuple(points)


def verdict_fields(verdict: Verdict | None) -> dict[str, Any]:
    """A SeriesPoint's fields that come from its verdict (none without a baseline book)."""
    if verdict is None:
        return {}
    return {
        "baseline": verdict.baseline,
        "ratio": verdict.ratio,
        "degraded": verdict.degraded,
        "spread": verdict.spread,
        "low_bound": verdict.low_bound,
        "judged": verdict.judged,
        "low_recent": verdict.low_recent,
        "reference": verdict.reference,
        "reason": verdict.reason,
        "at_floor": verdict.at_floor,
        "judged_at": verdict.judged_at,
        "long_level": verdict.long_level,
        "reference_line": verdict.reference_line,
        "reference_mature": verdict.reference_mature,
        "flaps": verdict.flaps,
        "degraded_since": verdict.degraded_since,
        "episodes": verdict.episodes,
        "reference_stale": verdict.reference_stale,
    }


def verdict_point(key: SeriesKey, verdict: Verdict) -> VerdictPoint:
    """A verdict restored from the state file, for a series not measured since the start."""
    probe, op, size_bytes, path, ranks = key
    return VerdictPoint(
        probe=probe,
        op=op,
        size_bytes=size_bytes,
        path=path,
        ranks=ranks,
        baseline=verdict.baseline,
        degraded=verdict.degraded,
        reference=verdict.reference,
        reason=verdict.reason,
        judged=verdict.judged,
        long_level=verdict.long_level,
        reference_mature=verdict.reference_mature,
        degraded_since=verdict.degraded_since,
        episodes=verdict.episodes,
        reference_stale=verdict.reference_stale,
    )


def forget_verdict(point: SeriesPoint) -> SeriesPoint:
    """The point of a series whose baseline an operator (or new hardware) made it forget: its
    measurement stays, its verdict is gone until the next result."""
    return replace(
        point,
        baseline=None,
        ratio=None,
        degraded=False,
        spread=None,
        low_bound=None,
        low_recent=0,
        reference=None,
        reason=None,
        at_floor=False,
        long_level=None,
        reference_line=None,
        reference_mature=False,
        flaps=0,
        degraded_since=None,
        reference_stale=False,
    )
