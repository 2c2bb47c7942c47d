"""One scheduled probe run: pause and idle checks, device locks, the probe, and its bookkeeping.

Data flows one way: config -> (pause, idle) -> launcher -> outcome -> baseline -> snapshot. The
runner never raises into the scheduler: every way a run can end is a counted skip or failure.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from importlib import metadata
from pathlib import Path
from typing import Any

import netmon
from netmon import baseline, idle
from netmon.config import NetmonConfig, ProbeConfig
from netmon.exporter import ProbeStats, SeriesPoint, Snapshot, VerdictPoint
from netmon.logs import event
from netmon.probe.launcher import Launcher
from netmon.probe.spec import ProbeOutcome, ProbeSpec

log = logging.getLogger(__name__)

STATE_FILE = "baselines.json"


def spec_for(probe: ProbeConfig, config: NetmonConfig) -> ProbeSpec:
    """The ProbeSpec a configured probe runs on this node."""
    backend = config.backend or "gloo"
    devices: tuple[str, ...] = ()
    if backend == "nccl":
        devices = tuple(probe.devices or config.devices or ())
        ranks = len(devices)
    else:
        ranks = probe.ranks or config.ranks or 2
    spec = ProbeSpec(
        op=probe.op,
        sizes=probe.sizes,
        dtype=probe.dtype,
        warmup=probe.warmup,
        iters=probe.iters,
        batch=probe.batch,
        timing=probe.timing,
        chunks=probe.chunks,
        backend=backend,
        ranks=ranks,
        devices=devices,
        env=probe.env,
        check=probe.check,
        timeout=probe.timeout,
    )
    return spec.model_copy(update={"deadlines": spec.deadlines.capped(probe.timeout)})


def device_keys(spec: ProbeSpec) -> frozenset[str]:
    """What two probes must not share at once: GPUs, or for CPU ranks the host's CPUs."""
    return frozenset(spec.devices) if spec.backend == "nccl" else frozenset({"cpu"})


class DeviceLocks:
    """Exclusive use of device sets, first come first served.

    A probe waits until none of its devices is held and no earlier waiter wants one of them, so a
    frequent probe cannot starve a rare one that shares its devices.
    """

    def __init__(self) -> None:
        self._held: set[str] = set()
        self._queue: list[tuple[int, frozenset[str]]] = []
        self._tickets = 0
        self._changed = threading.Condition()

    def _may_take(self, ticket: int, keys: frozenset[str]) -> bool:
        if self._held & keys:
            return False
        earlier = (k for t, k in self._queue if t < ticket)
        return not any(other & keys for other in earlier)

    @contextmanager
    def hold(self, keys: frozenset[str], timeout: float) -> Iterator[bool]:
        with self._changed:
            self._tickets += 1
            ticket = (self._tickets, keys)
            self._queue.append(ticket)
            got = self._changed.wait_for(lambda: self._may_take(*ticket), timeout=timeout)
            self._queue.remove(ticket)
            if got:
                self._held |= keys
            self._changed.notify_all()
        try:
            yield got
        finally:
            if got:
                with self._changed:
                    self._held -= keys
                    self._changed.notify_all()


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


class Results:
    """The daemon's mutable record, guarded by a lock, published as immutable Snapshots."""

    def __init__(
        self, config: NetmonConfig, book: baseline.BaselineBook, state_path: Path | None
    ) -> None:
        self._config = config
        self._book = book
        self._state_path = state_path
        self._lock = threading.Lock()
        self._tallies = {p.name: _Tally() for p in config.probes or ()}
        self._points: dict[tuple[str, str, int, str], SeriesPoint] = {}
        self._build = {"version": netmon.__version__, "torch": _torch_version(), "nccl": ""}
        self._started_at = time.time()
        self._snapshot = self._build_snapshot()
        self.state_write_errors = 0

    def snapshot(self) -> Snapshot:
        pause = self._config.pause_file
        snapshot = self._snapshot
        paused = bool(pause and pause.exists())
        return snapshot if snapshot.paused == paused else replace(snapshot, paused=paused)

    def skip(self, probe: str, reason: str) -> None:
        with self._lock:
            tally = self._tallies[probe]
            tally.skips[reason] = tally.skips.get(reason, 0) + 1
            self._snapshot = self._build_snapshot()

    def failed_internally(self, probe: str) -> None:
        """A bug in netmon, not in a probe: counted, so that it pages like any failure."""
        with self._lock:
            tally = self._tallies[probe]
            tally.failures["internal"] = tally.failures.get("internal", 0) + 1
            tally.last_run = time.time()
            self._snapshot = self._build_snapshot()

    def started(self, probe: str) -> None:
        with self._lock:
            self._tallies[probe].runs += 1
            self._snapshot = self._build_snapshot()

    def finished(self, probe: ProbeConfig, outcome: ProbeOutcome) -> list[baseline.Verdict]:
        verdicts = []
        with self._lock:
            tally = self._tallies[probe.name]
            now = time.time()
            tally.last_run = now
            tally.duration_s = outcome.wall_s
            tally.busy_seconds += outcome.wall_s * max(
                len(outcome.spec.devices), outcome.spec.ranks
            )
            if outcome.peak_device_memory_bytes is not None:
                tally.peak_device_memory = outcome.peak_device_memory_bytes
            if outcome.environment and outcome.environment.nccl:
                self._build["nccl"] = outcome.environment.nccl
            if outcome.failure is not None:
                reason = outcome.failure.reason
                tally.failures[reason] = tally.failures.get(reason, 0) + 1
            else:
                tally.last_success = now
                verdicts = self._learn(probe, outcome, now)
            self._snapshot = self._build_snapshot()
        self._save_state()
        return verdicts

    def _learn(
        self, probe: ProbeConfig, outcome: ProbeOutcome, now: float
    ) -> list[baseline.Verdict]:
        verdicts = []
        for result in outcome.results:
            key = (probe.name, result.op, result.size_bytes, probe.path)
            verdict = self._book.observe(key, result.busbw_bytes_per_second)
            verdicts.append(verdict)
            self._points[key] = SeriesPoint(
                probe=probe.name,
                op=result.op,
                size_bytes=result.size_bytes,
                path=probe.path,
                busbw=result.busbw_bytes_per_second,
                algbw=result.algbw_bytes_per_second,
                latency_s=result.time_s,
                cv=result.cv,
                measured_at=now,
                baseline=verdict.baseline,
                ratio=verdict.ratio,
                degraded=verdict.degraded,
                min_busbw=probe.min_busbw,
            )
        return verdicts

    def _save_state(self) -> None:
        if self._state_path is None:
            return
        try:
            baseline.save(self._state_path, self._book)
        except OSError as exc:
            self.state_write_errors += 1
            log.warning("cannot save baselines to %s: %s", self._state_path, exc)

    def _build_snapshot(self) -> Snapshot:
        probes = {}
        for probe in self._config.probes or ():
            tally = self._tallies[probe.name]
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
            )
        points = tuple(self._points[key] for key in sorted(self._points))
        restored = tuple(
            VerdictPoint(
                probe=key[0],
                op=key[1],
                size_bytes=key[2],
                path=key[3],
                baseline=verdict.baseline,
                degraded=verdict.degraded,
            )
            for key, verdict in sorted(self._book.verdicts().items())
            if key not in self._points
        )
        return Snapshot(
            series=points,
            restored=restored,
            probes=probes,
            build=dict(self._build),
            started_at=self._started_at,
        )


def _torch_version() -> str:
    # From the package metadata: the daemon never imports torch.
    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return ""


class ProbeRunner:
    """Runs a configured probe when the scheduler says so; never raises."""

    def __init__(
        self,
        config: NetmonConfig,
        results: Results,
        locks: DeviceLocks,
        idle_source: idle.IdleSource,
        stopping: threading.Event,
        launcher: Callable[..., Launcher] = Launcher,
    ) -> None:
        self.config = config
        self.results = results
        self.locks = locks
        self.idle_source = idle_source
        self.stopping = stopping
        self.launcher = launcher
        self._probes = {p.name: p for p in config.probes or ()}
        # How often a running probe re-reads NVML for foreign processes (the pause file is
        # checked at every launcher poll, as a stat is cheap).
        self.foreign_check_s = 1.0

    def paused(self) -> bool:
        pause = self.config.pause_file
        return bool(pause and pause.exists())

    def run(self, name: str) -> None:
        probe = self._probes[name]
        try:
            self._run(probe)
        except Exception:  # a bug here must not kill the scheduler thread or the daemon
            log.exception("probe %s: internal error", name)
            self.results.failed_internally(name)

    def _skip(self, probe: ProbeConfig, reason: str, detail: str) -> None:
        self.results.skip(probe.name, reason)
        event(
            log, "probe skipped", probe=probe.name, outcome="skipped", reason=reason, detail=detail
        )

    def _run(self, probe: ProbeConfig) -> None:
        if self.stopping.is_set():
            return self._skip(probe, "shutting_down", "the daemon is stopping")
        if self.paused():
            return self._skip(probe, "paused", f"pause file {self.config.pause_file} exists")
        spec = spec_for(probe, self.config)
        with self.locks.hold(device_keys(spec), timeout=min(probe.interval, 60.0)) as got:
            if not got:
                return self._skip(probe, "devices_busy", "another probe holds the devices")
            decision = idle.check(self.idle_source, spec.devices, {os.getpid()}, self.config.idle)
            if not decision.idle:
                return self._skip(probe, decision.reason or "gpu_unknown", decision.detail)
            self._probe(probe, spec)
        return None

    def _probe(self, probe: ProbeConfig, spec: ProbeSpec) -> None:
        self.results.started(probe.name)
        launcher = self.launcher(spec, abort=None, python=self.config.rank_python or _python())
        launcher.abort = self._abort_check(spec, launcher)
        outcome = launcher.run()
        self.results.finished(probe, outcome)
        self._log_outcome(probe, outcome)

    def _abort_check(self, spec: ProbeSpec, launcher: Launcher) -> Callable[[], str | None]:
        next_look = [time.monotonic() + self.foreign_check_s]

        def abort() -> str | None:
            if self.stopping.is_set():
                return "shutdown"
            if self.paused():
                return "paused"
            if spec.devices and time.monotonic() >= next_look[0]:
                next_look[0] = time.monotonic() + self.foreign_check_s
                try:
                    reading = self.idle_source.read()
                except Exception:  # NVML hiccup: keep probing; the next look may succeed
                    return None
                own = {os.getpid(), *launcher.pids}
                if idle.foreign_processes(reading, spec.devices, own):
                    return "preempted"
            return None

        return abort

    def _log_outcome(self, probe: ProbeConfig, outcome: ProbeOutcome) -> None:
        fields: dict[str, Any] = dict(
            probe=probe.name,
            op=outcome.spec.op,
            wall_s=round(outcome.wall_s, 3),
            collective_s=round(outcome.collective_s, 3),
        )
        if outcome.failure is not None:
            fields.update(
                outcome="failed", reason=outcome.failure.reason, detail=outcome.failure.describe()
            )
            event(log, "probe failed", level=logging.WARNING, **fields)
            return
        largest = max(outcome.results, key=lambda r: r.size_bytes, default=None)
        if largest is not None:
            fields.update(
                size_bytes=largest.size_bytes,
                busbw_gbps=round(largest.busbw_bytes_per_second / 1e9, 4),
                latency_us=round(outcome.results[0].time_s * 1e6, 1),
            )
        event(log, "probe ok", outcome="ok", **fields)


def _python() -> str:
    return sys.executable
