"""What a probe is and what it yields: immutable, typed values that cross process boundaries."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from netmon.bandwidth import (
    DTypeName,
    OpName,
    RankStat,
    algbw,
    bus_factor,
    busbw,
    parse_duration,
    parse_size,
    rank_medians,
    spread,
)
from netmon.probe.cpushare import MODES, foreign_share, mode_shares

Backend = Literal["nccl", "gloo"]
# batched: `batch` back-to-back ops then one sync (nccl-tests' default);
# per_op: every op synchronised on its own (nccl-tests -z, a latency view).
Timing = Literal["batched", "per_op"]
Phase = Literal["spawn", "rendezvous", "init", "warmup", "measure", "check", "teardown"]
PHASES: tuple[Phase, ...] = (
    "spawn",
    "rendezvous",
    "init",
    "warmup",
    "measure",
    "check",
    "teardown",
)

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


# How far past the longest phase deadline the process group's own timeout lies: the launcher
# polls its deadlines every fraction of a second and kills within a few.
WATCHDOG_MARGIN_S = 30.0


class PhaseDeadlines(_Frozen):
    """Seconds each phase may take on the slowest rank; measure and warmup are per size."""

    spawn: float = Field(60.0, gt=0)  # interpreter start and `import torch`
    rendezvous: float = Field(30.0, gt=0)
    init: float = Field(60.0, gt=0)
    warmup: float = Field(60.0, gt=0)
    measure: float = Field(120.0, gt=0)
    check: float = Field(60.0, gt=0)
    teardown: float = Field(15.0, gt=0)
    # A rank that sends no heartbeat this long is frozen (stopped, or stuck holding the GIL).
    unresponsive: float = Field(15.0, gt=0)

    def for_phase(self, phase: Phase) -> float:
        return float(getattr(self, phase))

    def watchdog(self) -> float:
        """The process group's timeout, which c10d also hands NCCL's watchdog: past every phase
        deadline a collective runs under, so a hung collective ends as netmon's phase timeout
        (`timeout_measure`, the launcher's kill) and not as the watchdog's abort of the rank
        (`rank_signal`), and never within a slow but healthy phase."""
        return max(self.init, self.warmup, self.measure, self.check) + WATCHDOG_MARGIN_S

    def capped(self, seconds: float) -> PhaseDeadlines:
        """Every phase limited to at most `seconds` (a short probe timeout tightens them all)."""
        return PhaseDeadlines(**{k: min(v, seconds) for k, v in self.model_dump().items()})


class ProbeSpec(_Frozen):
    """One probe: an op swept over sizes in one set of rank processes."""

    op: OpName = "all_reduce"
    sizes: tuple[int, ...] = (8, 1 << 20)
    dtype: DTypeName = "float32"
    warmup: int = Field(5, ge=0)
    # On GPUs, the first size's warm-up goes on until this long has passed (an idle GPU's clock
    # rises only under load that lasts): seconds, 0 for none.
    warmup_s: float = Field(0.0, ge=0, le=60)
    iters: int = Field(20, ge=1, description="timed samples per size")
    batch: int = Field(5, ge=1, description="back-to-back ops per sample in batched timing")
    timing: Timing = "batched"
    # Latency-bound sizes on NCCL timed from a CUDA graph of each batch (netmon.probe.graphs).
    cuda_graph: Literal["auto", "off"] = "auto"
    # One sample's time from the ranks' times: the slowest rank (max), or nccl-tests' mean.
    rank_stat: RankStat = "max"
    chunks: int = Field(1, ge=1, description="split each op of S bytes into k ops of S/k")
    backend: Backend = "gloo"
    ranks: int = Field(2, ge=1, le=1024)
    devices: tuple[str, ...] = Field((), description="GPU index or UUID per rank (nccl)")
    # What each rank's CUDA_VISIBLE_DEVICES names: the GPU's UUID where NVML gave one (probe.build),
    # so that CUDA's own numbering can never put a rank on another GPU than the one found idle.
    cuda_devices: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    check: bool = False
    # Seconds between a reporter's progress events within a size (samples done, of how many),
    # for a person watching `netmon probe` on a terminal; 0: none (the daemon's probes).
    progress_s: float = Field(0.0, ge=0)
    timeout: float = Field(300.0, gt=0, description="seconds for the whole probe")
    deadlines: PhaseDeadlines = PhaseDeadlines()
    # The command prefix of each rank started here (numactl, ip netns exec), as (rank, argv):
    # resolved from the configured rank wrapper by probe.build. A rank not listed has none.
    wrappers: tuple[tuple[int, tuple[str, ...]], ...] = ()
    host: str = "127.0.0.1"
    # Ranks that report results (every rank holds the same reduced samples). Across nodes, one
    # rank per node reports, so every node has its own view of the round.
    reporters: tuple[int, ...] = (0,)
    # The path variant this spec runs (probe.paths): a label for results, env set by the caller.
    path: str = "default"
    # What the NCCL transport log must show (nvlink, pcie or any; across nodes net_ib, net_socket
    # or net, from a group's `transport`: netmon.probe.crossnode); only judged with nccl.
    intent: Literal["nvlink", "pcie", "any", "net_ib", "net_socket", "net"] = "any"

    @field_validator("sizes", mode="before")
    @classmethod
    def _parse_sizes(cls, value: object) -> object:
        if isinstance(value, str):
            value = [part for part in value.split(",") if part.strip()]
        if isinstance(value, (list, tuple)):
            return tuple(parse_size(v) for v in value)
        return value

    @field_validator("sizes")
    @classmethod
    def _sizes_nonempty(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        if not value:
            raise ValueError("at least one size is needed")
        if any(v <= 0 for v in value):
            raise ValueError("sizes must be > 0 bytes")
        return value

    @field_validator("timeout", mode="before")
    @classmethod
    def _parse_timeout(cls, value: object) -> object:
        return parse_duration(value) if isinstance(value, str) else value

    @field_validator("env", mode="before")
    @classmethod
    def _env_pairs(cls, value: object) -> object:
        if isinstance(value, dict):
            value = sorted(value.items())
        return value

    @field_validator("env")
    @classmethod
    def _env_names(cls, value: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
        for name, _ in value:
            if not _ENV_NAME.match(name):
                raise ValueError(f"{name!r} is not an environment variable name")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> ProbeSpec:
        if self.devices and len(self.devices) != self.ranks:
            raise ValueError(f"{len(self.devices)} devices given for {self.ranks} ranks")
        if self.cuda_devices and len(self.cuda_devices) != len(self.devices):
            raise ValueError("cuda_devices must name one GPU per device")
        if self.op == "sendrecv" and self.ranks < 2:
            raise ValueError("sendrecv needs at least 2 ranks")
        return self

    def env_dict(self) -> dict[str, str]:
        return dict(self.env)

    def wrapper_of(self, rank: int) -> tuple[str, ...]:
        return dict(self.wrappers).get(rank, ())


class SizeResult(_Frozen):
    """One size of a sweep. Times are per op, in seconds; per sample, the spec's rank_stat over
    the ranks (the slowest rank's by default)."""

    op: OpName
    size_bytes: int
    count: int
    dtype: DTypeName
    chunks: int
    time_s: float  # median
    min_s: float
    p10_s: float
    p90_s: float
    max_s: float
    cv: float
    samples: int
    algbw_bytes_per_second: float
    busbw_bytes_per_second: float
    bus_factor: float
    check_ok: bool | None = None
    path: str = "default"
    # Each rank's own median time, in rank order: one rank far above the rest is the slow one.
    rank_medians_s: tuple[float, ...] = ()
    # Other processes' CPU per second per CPU while this size was measured, on the worst
    # machine (netmon.probe.cpushare): 0 quiet, 1 every core taken. None where /proc cannot say.
    # Their user, nice and system time only: not netmon's own daemon and zygote, nor the modes
    # below, which are shown and never a reason to leave a result unjudged.
    foreign_cpu_share: float | None = None
    # The share of the same CPUs over the same interval spent in hardware interrupts, softirqs,
    # and stolen by the hypervisor, on the machine where each was highest. None where unknown.
    irq_cpu_share: float | None = None
    softirq_cpu_share: float | None = None
    steal_cpu_share: float | None = None
    # The bytes per op the ranks really moved, where fewer than size_bytes (a simulated rank
    # carries at most netmon.sim.rank.MAX_BYTES): algbw and busbw are of these, so no figure
    # is computed from bytes nobody moved. None: all of size_bytes.
    carried_bytes: int | None = None
    # How the batch was issued (netmon.probe.graphs): one CUDA graph replay, or eager calls; and
    # why eager where a graph was possible in principle (None when no reason to say).
    timing_path: Literal["graph", "eager"] = "eager"
    timing_why: str | None = None
    # The lowest SM clock of the ranks' GPUs right after the measured loop, in Hz (NVML's
    # current SM clock); None on CPU ranks or where NVML cannot say.
    sm_clock_hz: float | None = None

    @classmethod
    def of_samples(
        cls,
        spec: ProbeSpec,
        size_bytes: int,
        count: int,
        samples: Sequence[float],
        per_rank: Sequence[Sequence[float]],
        check_ok: bool | None,
        cpu: Sequence[Sequence[float]] = (),
    ) -> SizeResult:
        """One size's result from its samples (per op, already combined over the ranks by the
        spec's rank_stat) and every rank's own times; algbw and busbw as nccl-tests defines them."""
        stats = spread(samples)
        modes = mode_shares(cpu)
        return cls(
            op=spec.op,
            size_bytes=size_bytes,
            count=count,
            dtype=spec.dtype,
            chunks=spec.chunks,
            time_s=stats.median,
            min_s=stats.min,
            p10_s=stats.p10,
            p90_s=stats.p90,
            max_s=stats.max,
            cv=stats.cv,
            samples=stats.samples,
            algbw_bytes_per_second=algbw(size_bytes, stats.median),
            busbw_bytes_per_second=busbw(spec.op, spec.ranks, size_bytes, stats.median),
            bus_factor=bus_factor(spec.op, spec.ranks),
            check_ok=check_ok,
            path=spec.path,
            rank_medians_s=rank_medians(per_rank),
            foreign_cpu_share=foreign_share(cpu),
            irq_cpu_share=modes.get("irq"),
            softirq_cpu_share=modes.get("softirq"),
            steal_cpu_share=modes.get("steal"),
        )

    def carrying(self, carried: int | None) -> SizeResult:
        """This result where the ranks moved `carried` bytes per op, fewer than size_bytes (a
        simulated rank's cap): its algbw and busbw are of the bytes moved."""
        if carried is None or carried >= self.size_bytes:
            return self
        moved = algbw(carried, self.time_s)
        return self.model_copy(
            update={
                "carried_bytes": carried,
                "algbw_bytes_per_second": moved,
                "busbw_bytes_per_second": moved * self.bus_factor,
            }
        )

    def reported(self, event: Mapping[str, Any]) -> SizeResult:
        """This result with what its ranks reported beside the times: how they timed it
        (timing_path, timing_why; a rank of an older netmon sends neither: eager) and their
        GPUs' SM clocks (MHz per rank, -1 unknown; the slowest bounds the collective)."""
        clocks = [float(c) for c in event.get("sm_clock_mhz") or () if float(c) > 0]
        return self.model_copy(
            update={
                "timing_path": event.get("timing_path") or "eager",
                "timing_why": event.get("timing_why"),
                "sm_clock_hz": min(clocks) * 1e6 if clocks else None,
            }
        )

    @property
    def cpu_modes(self) -> dict[str, float]:
        """The known mode shares by mode (netmon.probe.cpushare.MODES)."""
        shares = (self.irq_cpu_share, self.softirq_cpu_share, self.steal_cpu_share)
        return {m: v for m, v in zip(MODES, shares, strict=True) if v is not None}


class ProbeEnvironment(_Frozen):
    netmon: str
    torch: str | None = None
    backend: Backend
    nccl: str | None = None
    ranks: int
    host: str
    python: str | None = None
    devices: tuple[str, ...] = ()
    # The GPU each rank's CUDA opened ("GPU-<uuid>"), by global rank; "" where a rank did not say
    # (CPU ranks, ranks on another node).
    cuda_uuids: tuple[str, ...] = ()


FailureCause = Literal[
    "timeout",
    "exit",
    "signal",
    "exception",
    "spawn",
    "cancelled",
    "check",
    "internal",
    # NCCL carried a group round between nodes on another network than the group declares.
    "transport_mismatch",
    # The rank zygote, the parent of the probe's forked ranks, died under it.
    "zygote",
]


class ProbeFailure(_Frozen):
    """Why a probe ended early: the phase, the rank to blame and what happened to it."""

    phase: Phase
    rank: int | None
    cause: FailureCause
    detail: str
    # For cancellations: who asked (paused, preempted, shutdown).
    cancel_reason: str | None = None

    @property
    def reason(self) -> str:
        """A bounded label value for metrics: the cause, qualified by the phase for timeouts."""
        if self.cause == "cancelled" and self.cancel_reason:
            return self.cancel_reason
        if self.cause == "timeout":
            return f"timeout_{self.phase}"
        if self.phase == "rendezvous" and self.cause not in ("check", "zygote"):
            return "rendezvous"
        return {
            "exit": "rank_exit",
            "signal": "rank_signal",
            "exception": "rank_error",
            "zygote": "zygote_lost",
        }.get(self.cause, self.cause)

    def describe(self) -> str:
        who = f"rank {self.rank}" if self.rank is not None else "the probe"
        return f"{self.cause} in phase {self.phase} ({who}): {self.detail}"


class ProbeOutcome(_Frozen):
    """Everything one run of a probe produced: results for the sizes done, and a failure or none."""

    spec: ProbeSpec
    results: tuple[SizeResult, ...] = ()
    environment: ProbeEnvironment | None = None
    failure: ProbeFailure | None = None
    started_at: float  # unix time
    wall_s: float  # whole run, process start to last reap
    collective_s: float = 0.0  # time inside timed collectives, summed over sizes
    peak_device_memory_bytes: int | None = None
    # The largest peak resident host memory of a rank (its ru_maxrss), torch's footprint included.
    peak_host_memory_bytes: int | None = None
    # Transport classes the ranks used (from NCCL_DEBUG=INFO; "gloo" for CPU ranks), and the
    # ways they contradict the spec's intent (netmon.probe.transport_faults.REASONS).
    transports: tuple[str, ...] = ()
    transport_faults: tuple[str, ...] = ()
    # How its ranks started: forked by the rank zygote or spawned as new interpreters, and why
    # they were spawned where a zygote was configured (netmon.probe.forking.FALLBACK_REASONS).
    ranks_forked: int = 0
    ranks_spawned: int = 0
    fork_fallback: str | None = None
    # The slowest rank's start-up (launch to rendezvous: interpreter and torch, or the fork) and
    # init phase (process group: on GPUs the CUDA context and NCCL communicator), in seconds.
    startup_s: float | None = None
    init_s: float | None = None
    # CPU seconds its ranks spent in each phase, summed over ranks (netmon.probe.rankcpu).
    rank_cpu_s: dict[str, float] = Field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.failure is None
