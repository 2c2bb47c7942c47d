"""How each probe's runs went: runs, failures and skips by reason, when it last ran and last
succeeded, its cost in GPU-seconds and memory, how its ranks started, and the transports NCCL
used with the faults they showed.

Not locked itself: netmon.serve.results holds one and calls it under its own lock.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from netmon.config import NetmonConfig
from netmon.exposition.catalogue import FORK_FALLBACK_REASONS, RANK_START_METHODS
from netmon.exposition.snapshot import ProbeStats
from netmon.probe.spec import ProbeOutcome
from netmon.serve.known import known_transport_faults


@dataclass
class _Tally:
    runs: int = 0
    failures: dict[str, int] = field(default_factory=dict)
    skips: dict[str, int] = field(default_factory=dict)
    last_success: float | None = None
    last_run: float | None = None
    duration_s: float | None = None
    busy_seconds: float = 0.0
    peak_device_memory: int | None = None
    rank_cpu: dict[str, float] = field(default_factory=dict)


class RunRecord:
    def __init__(self, config: NetmonConfig) -> None:
        self._tallies = {p.name: _Tally() for p in config.probes or ()}
        self._transports: dict[tuple[str, str], tuple[str, ...]] = {}
        # Known mismatch reasons start at 0 on GPU nodes, so increase() sees the first one.
        self._transport_faults: dict[tuple[str, str, str], int] = dict.fromkeys(
            known_transport_faults(config), 0
        )
        self._rank_starts = dict.fromkeys(RANK_START_METHODS, 0)
        self._fork_fallbacks = dict.fromkeys(FORK_FALLBACK_REASONS, 0)
        self.nccl = ""  # the NCCL version the ranks last reported

    def _tally(self, probe: str) -> _Tally:
        # A run of a probe that a reload removed may still end: count it, then let it go.
        return self._tallies.setdefault(probe, _Tally())

    def reconfigure(self, names: set[str]) -> None:
        """New probes start counting, removed ones disappear."""
        self._tallies = {n: self._tallies.get(n, _Tally()) for n in sorted(names)}

    def skipped(self, probe: str, reason: str) -> None:
        tally = self._tally(probe)
        tally.skips[reason] = tally.skips.get(reason, 0) + 1

    def failed_internally(self, probe: str, now: float) -> None:
        tally = self._tally(probe)
        tally.failures["internal"] = tally.failures.get("internal", 0) + 1
        tally.last_run = now

    def started(self, probe: str) -> None:
        self._tally(probe).runs += 1

    def last_run(self, probe: str) -> float | None:
        return self._tally(probe).last_run

    def launched(self, probe: str, path: str, outcome: ProbeOutcome, now: float) -> None:
        """Cost, memory, versions, transports and the failure reason of one launched probe."""
        tally = self._tally(probe)
        tally.last_run = now
        tally.busy_seconds += outcome.wall_s * max(len(outcome.spec.devices), outcome.spec.ranks)
        if outcome.peak_device_memory_bytes is not None:
            tally.peak_device_memory = outcome.peak_device_memory_bytes
        for phase, seconds in outcome.rank_cpu_s.items():
            tally.rank_cpu[phase] = tally.rank_cpu.get(phase, 0.0) + seconds
        if outcome.environment and outcome.environment.nccl:
            self.nccl = outcome.environment.nccl
        if outcome.failure is not None:
            reason = outcome.failure.reason
            tally.failures[reason] = tally.failures.get(reason, 0) + 1
        self._rank_starts["fork"] += outcome.ranks_forked
        self._rank_starts["spawn"] += outcome.ranks_spawned
        if outcome.fork_fallback is not None:
            why = outcome.fork_fallback
            self._fork_fallbacks[why] = self._fork_fallbacks.get(why, 0) + 1
        if outcome.transports:
            self._transports[(probe, path)] = outcome.transports
        for reason in outcome.transport_faults:
            key = (probe, path, reason)
            self._transport_faults[key] = self._transport_faults.get(key, 0) + 1

    def finished(self, probe: str, duration_s: float, now: float, succeeded: bool) -> None:
        """A run or a sweep of pairs ended: how long it took, and whether it succeeded now."""
        tally = self._tally(probe)
        tally.duration_s = duration_s
        if succeeded:
            tally.last_success = now

    def probe_stats(self, config: NetmonConfig) -> dict[str, ProbeStats]:
        """The tallies of the configured probes, as the snapshot carries them."""
        probes = {}
        for probe in config.probes or ():
            tally = self._tally(probe.name)
            probes[probe.name] = ProbeStats(
                runs=tally.runs,
                failures=dict(tally.failures),
                skips=dict(tally.skips),
                last_success=tally.last_success,
                last_run=tally.last_run,
                duration_s=tally.duration_s,
                busy_seconds=tally.busy_seconds,
                peak_device_memory=tally.peak_device_memory,
                interval_s=probe.interval,
                rank_cpu_seconds=dict(tally.rank_cpu),
            )
        return probes

    def transports(self) -> tuple[tuple[str, str, str], ...]:
        """(probe, path, transport) of every transport each probe path last used."""
        return tuple(
            (probe, path, transport)
            for (probe, path), found in sorted(self._transports.items())
            for transport in found
        )

    def transport_faults(self) -> dict[tuple[str, str, str], int]:
        return dict(self._transport_faults)

    def rank_starts(self) -> dict[str, int]:
        return dict(self._rank_starts)

    def fork_fallbacks(self) -> dict[str, int]:
        return dict(self._fork_fallbacks)
