"""The daemon's record of what probes did: counters, latest results, baselines and verdicts.

Each part of the record is a class of its own, called under this lock: how the runs went
(netmon.serve.run_record), the series and their verdicts (netmon.serve.series_record), GPU pairs,
node pairs and the jobs' traffic (pair_record, peer_record, jobs_record).
Mutable state lives here behind one lock; the exporter only ever sees the immutable Snapshot that
every change publishes, so a scrape never observes half an update.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from importlib import metadata

import netmon
from netmon import baseline, sim
from netmon.config import NetmonConfig, ProbeConfig
from netmon.exposition.snapshot import GroupView, PeerPoint, Snapshot, SweepView
from netmon.gpu.linkhealth import LinkHealth
from netmon.gpu.models import CPU_MODEL
from netmon.inspector.files import Reading
from netmon.inspector.shapes import Round
from netmon.probe.pairs import PairOutcome, PairSkip
from netmon.probe.spec import ProbeOutcome
from netmon.probe.verdict import LinkVerdict
from netmon.serve.current import CurrentConfig
from netmon.serve.jobs_record import JobsRecord
from netmon.serve.keeper import BaselineKeeper
from netmon.serve.known import all_ranks, load_interval
from netmon.serve.pair_record import PairRecord
from netmon.serve.pausing import after_pause
from netmon.serve.peer_record import PeerRecord
from netmon.serve.run_record import RunRecord
from netmon.serve.series_record import SeriesRecord

log = logging.getLogger(__name__)


class Results:
    """The daemon's mutable record, guarded by a lock, published as immutable Snapshots."""

    def __init__(
        self, current: CurrentConfig, keeper: BaselineKeeper, gpu_model: str = CPU_MODEL
    ) -> None:
        # The configuration is read from `current` whenever it is needed, and each one published
        # there prunes what belonged to removed probes (reconfigure).
        self._current = current
        config = current.get()
        self._keeper = keeper
        self._book = keeper.book
        self._lock = threading.Lock()
        self._runs = RunRecord(config)
        self._series = SeriesRecord(config, self._book)
        self._build = {"version": netmon.__version__, "torch": _torch_version()}
        self._simulated = sim.active() is not None
        self._gpu_model = gpu_model  # read once at start (netmon.gpu.models)
        self._started_at = time.time()
        # When each probe's last run ended, on the monotonic clock: "how long since" must not
        # jump with the wall clock (a step forward is no pause; netmon.serve.steady).
        self._ended: dict[str, float] = {}
        self._pairs = PairRecord(config)
        self._topology: tuple[tuple[int, int, str], ...] = ()
        self._link_health: LinkHealth | None = None
        self._link_load: LinkHealth | None = None
        self._link_read_errors = 0
        self._group: GroupView | None = None
        self._reload_ok = True
        self._reload_failures = 0
        self._reloaded_at = time.time()
        self._zygote_starts = 0
        self._clock_steps = 0
        self._peers: dict[tuple[str, str], tuple[PeerPoint, ...]] = {}
        self._peer_verdicts = PeerRecord()
        self._group_rejected: dict[str, int] = {}
        self._store_refused: dict[str, int] = {}
        self._results_refused: dict[tuple[str, str], int] = {}
        self._sweep: SweepView | None = None  # set by the sweep inbox, where there is one
        self._jobs = JobsRecord(config.inspector, self._book) if config.inspector else None
        if self._jobs is not None:
            self._jobs.adopt(self._book.series())
        self._book.adopt_ranks(lambda name: all_ranks(config, name))
        self._snapshot = self._build_snapshot()
        current.on_change(self.reconfigure)

    def snapshot(self) -> Snapshot:
        pause = self._current.get().pause_file
        snapshot = self._snapshot
        paused = bool(pause and pause.exists())
        if snapshot.paused == paused:
            return snapshot
        with self._lock:
            # Published like any change, so every scrape until the next one sees one object
            # (the exporter renders once per snapshot).
            if self._snapshot is snapshot:
                self._snapshot = replace(snapshot, paused=paused)
            return self._snapshot

    def skip(self, probe: str, reason: str) -> None:
        with self._lock:
            self._runs.skipped(probe, reason)
            self._snapshot = self._build_snapshot()

    def failed_internally(self, probe: str) -> None:
        """A bug in netmon, not in a probe: counted, so that it pages like any failure."""
        with self._lock:
            self._runs.failed_internally(probe, time.time())
            self._ended[probe] = time.monotonic()
            self._snapshot = self._build_snapshot()

    def started(self, probe: str) -> None:
        with self._lock:
            self._runs.started(probe)
            self._snapshot = self._build_snapshot()

    def set_topology(self, pairs: Sequence[tuple[int, int, str]]) -> None:
        with self._lock:
            self._topology = tuple(pairs)
            self._snapshot = self._build_snapshot()

    def reconfigure(self, config: NetmonConfig) -> None:
        """A reloaded configuration: new probes start counting, removed ones disappear."""
        with self._lock:
            names = {p.name for p in config.probes or ()}
            self._runs.reconfigure(names)
            self._series.reconfigure(config, names)
            self._pairs.reconfigure(config)
            self._peer_verdicts.reconfigure(names)
            self._snapshot = self._build_snapshot()

    def reloaded(self, ok: bool) -> None:
        with self._lock:
            self._reload_ok = ok
            if ok:
                self._reloaded_at = time.time()
            else:
                self._reload_failures += 1
            self._snapshot = self._build_snapshot()

    def set_group(self, view: GroupView) -> None:
        with self._lock:
            if view == self._group:
                return
            self._group = view
            self._snapshot = self._build_snapshot()

    def group_message_rejected(self, member: str) -> None:
        with self._lock:
            self._group_rejected[member] = self._group_rejected.get(member, 0) + 1
            self._snapshot = self._build_snapshot()

    def group_store_refused(self, reason: str, count: int = 1) -> None:
        """Connections or writes this member's store refused (netmon.group.store.REASONS)."""
        with self._lock:
            self._store_refused[reason] = self._store_refused.get(reason, 0) + count
            self._snapshot = self._build_snapshot()

    def group_result_refused(self, member: str, reason: str) -> None:
        """A pair result not signed by the member it is from (netmon.group.signing)."""
        with self._lock:
            key = (member, reason)
            self._results_refused[key] = self._results_refused.get(key, 0) + 1
            self._snapshot = self._build_snapshot()

    def peer_measured(self, probe: str, peer: str, outcome: ProbeOutcome) -> None:
        """A node pair this member hosted rank 0 of: exported here, with the other as `peer`."""
        if not outcome.ok:
            return
        with self._lock:
            self._peers[(probe, peer)] = tuple(
                PeerPoint(probe, r.size_bytes, peer, r.busbw_bytes_per_second)
                for r in outcome.results
            )
            self._snapshot = self._build_snapshot()

    def set_peer_verdict(
        self,
        probe: str,
        members: tuple[str, ...],
        suspects: tuple[str, ...],
        pair_suspects: tuple[tuple[str, str], ...],
        measured: Sequence[tuple[str, str]],
    ) -> None:
        """A node-pair sweep judged as leader; `measured`: the pairs it has a busbw for."""
        with self._lock:
            now = time.time()
            self._peer_verdicts.judged(probe, members, suspects, pair_suspects, measured, now)
            self._snapshot = self._build_snapshot()

    def peer_round_followed(self, probe: str) -> None:
        """A node-pair round another leads: this member's next verdict counts from 0."""
        with self._lock:
            self._peer_verdicts.followed(probe)

    def set_link_health(self, health: LinkHealth | None) -> None:
        """A reading of link health: the latest is exported; one taken under pcie-path traffic
        is kept apart as well, as the PCIe generation is judged on it alone."""
        with self._lock:
            self._link_health = health
            if health is not None and health.under_load:
                self._link_load = health
            self._snapshot = self._build_snapshot()

    def set_sweep(self, view: SweepView) -> None:
        with self._lock:
            self._sweep = view
            self._snapshot = self._build_snapshot()

    def jobs_read(self, round_: Round, reading: Reading, now: float) -> None:
        """One read of the jobs' Inspector files (netmon.serve.jobs_traffic)."""
        if self._jobs is None:
            return
        with self._lock:
            for key, verdict in self._jobs.took(round_, reading, now, self._series.points):
                if verdict.changed:
                    _log_change(key, verdict)
            self._snapshot = self._build_snapshot()
        self._keep_state()

    def zygote_started(self) -> None:
        # New ranks' process: its first results pay for what a first start pays for.
        self._book.resettle()
        with self._lock:
            self._zygote_starts += 1
            self._snapshot = self._build_snapshot()

    def clock_stepped(self, _step: float) -> None:
        with self._lock:
            self._clock_steps += 1
            self._snapshot = self._build_snapshot()

    def link_read_failed(self) -> None:
        with self._lock:
            self._link_read_errors += 1
            self._snapshot = self._build_snapshot()

    def finished(
        self,
        probe: ProbeConfig,
        outcome: ProbeOutcome,
        path: str | None = None,
        export: bool = True,
    ) -> list[baseline.Verdict]:
        """Account a launched probe; `export` False for a group round another member exports.

        `path` labels its results and transports: the path the outcome ran on unless given.
        """
        path = outcome.spec.path if path is None else path
        verdicts: list[baseline.Verdict] = []
        with self._lock:
            now = time.time()
            # The probe did not run for over two intervals (paused, its GPUs held by jobs):
            # its ranks and devices are cold again, as after a start.
            ended = time.monotonic()
            previous = self._ended.get(probe.name)
            paused = previous is not None and after_pause(
                previous, ended - outcome.wall_s, probe.interval, probe.effective_jitter
            )
            self._ended[probe.name] = ended
            self._runs.launched(probe.name, path, outcome, now)
            self._runs.finished(probe.name, outcome.wall_s, now, outcome.failure is None)
            if outcome.failure is None and export:
                for key, verdict in self._series.learn(probe, outcome, now, path, paused):
                    if verdict.changed:
                        _log_change(key, verdict)
                    verdicts.append(verdict)
            self._snapshot = self._build_snapshot()
        self._keep_state()
        return verdicts

    def pairs_skipped(self, probe: str, skipped: Sequence[PairSkip]) -> None:
        """Pairs a sweep did not measure, counted by reason."""
        with self._lock:
            self._pairs.skipped(probe, skipped)
            self._snapshot = self._build_snapshot()

    def finished_pairs(
        self, probe: ProbeConfig, results: Sequence[PairOutcome], duration_s: float
    ) -> LinkVerdict:
        """One sweep of pair probes: each launched pair is accounted, and the pairs are judged
        on each one's latest measurement (netmon.serve.pair_record)."""
        with self._lock:
            now = time.time()
            for item in results:
                self._runs.launched(probe.name, item.path, item.outcome, now)
            succeeded = bool(results) and all(item.outcome.ok for item in results)
            self._runs.finished(probe.name, duration_s, now, succeeded)
            self._ended[probe.name] = time.monotonic()
            verdict = self._pairs.sweep(probe, results, now)
            self._snapshot = self._build_snapshot()
        return verdict

    def _keep_state(self) -> None:
        """Take the operator's rebaseline requests, then save the book."""
        forgotten = self._keeper.take_requests()
        if forgotten:
            with self._lock:
                # Their points show no verdict until their next result.
                self._series.forget(forgotten, self._jobs.points if self._jobs is not None else {})
                self._snapshot = self._build_snapshot()
        self._keeper.save()

    @property
    def book(self) -> baseline.BaselineBook:
        """The book every result is judged in (read-only use: observe through this class)."""
        return self._keeper.book

    @property
    def state_write_errors(self) -> int:
        return self._keeper.write_errors

    def _build_snapshot(self) -> Snapshot:
        config = self._current.get()
        probes = self._runs.probe_stats(config)
        jobs = self._jobs.points if self._jobs is not None else {}
        return Snapshot(
            series=self._series.exported(jobs),
            restored=self._series.restored(probes),
            probes=probes,
            build=dict(self._build, nccl=self._runs.nccl),
            simulated=self._simulated,
            started_at=self._started_at,
            links=self._pairs.links,
            suspect_gpus=dict(self._pairs.suspect_gpus),
            pair_members=dict(self._pairs.members),
            gpu_streaks={name: dict(s) for name, s in self._pairs.gpu_streaks.items()},
            topology=self._topology,
            transports=self._runs.transports(),
            transport_faults=self._runs.transport_faults(),
            pair_skips=dict(self._pairs.skips),
            link_health=self._link_health,
            link_load=self._link_load,
            link_interval_s=config.link_telemetry.interval if config.backend == "nccl" else 0.0,
            link_load_interval_s=load_interval(config),
            link_read_errors=self._link_read_errors,
            nvlink_per_link=config.link_telemetry.nvlink_detail == "link",
            group=self._group,
            peers=tuple(p for key in sorted(self._peers) for p in self._peers[key]),
            peer_verdicts=dict(self._peer_verdicts.verdicts),
            group_rejected=dict(self._group_rejected),
            group_store_refused=dict(self._store_refused),
            group_results_refused=dict(self._results_refused),
            config_reload=(self._reload_ok, self._reload_failures, self._reloaded_at),
            rank_starts=self._runs.rank_starts(),
            fork_fallbacks=self._runs.fork_fallbacks(),
            zygote_starts=self._zygote_starts,
            clock_steps=self._clock_steps,
            inconclusive=dict(self._series.inconclusive),
            series_results=dict(self._series.series_results),
            baseline_restored=self._keeper.restored,
            state_errors=self._keeper.state_errors(),
            state_write_errors=self._keeper.write_errors,
            reference_resets=self._keeper.resets(self._series.series_results),
            sweep=self._sweep,
            jobs=self._jobs.view() if self._jobs is not None else None,
            gpu_model=self._gpu_model,
        )


def _log_change(key: baseline.BaselineKey, verdict: baseline.Verdict) -> None:
    probe, op, size, path, ranks = key
    series = f"{probe} {op} {size} B path {path} ranks {ranks}"
    if verdict.degraded:
        log.warning("degraded: %s: %s", series, verdict.explain())
    else:
        log.info("cleared: %s: %s", series, verdict.explain())


def _torch_version() -> str:
    # From the package metadata: the daemon never imports torch.
    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return ""
