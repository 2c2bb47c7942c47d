"""The collectors: metric families built from a Snapshot, one collector per concern, each isolated
from the others, with names, types and HELP text taken from the catalogue.

Probe data never lives in module-level gauges: every family is built from the snapshot current at
scrape time, so nothing stale survives and a scrape never triggers a measurement. A collector that
raises costs only its own families; netmon_scrape_collector_success says which one failed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TypeAlias

from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric

from netmon.exposition.catalogue import (
    FAILURE_REASONS,
    FORK_FALLBACK_REASONS,
    RANK_START_METHODS,
    SKIP_REASONS,
)
from netmon.exposition.families import add_known, family
from netmon.exposition.formats import TEXT, Format
from netmon.exposition.groups import group_families
from netmon.exposition.jobs import jobs_families
from netmon.exposition.snapshot import LinkPoint, Snapshot
from netmon.exposition.sweeps import sweep_families
from netmon.exposition.verdicts import result_families, state_families, verdict_families
from netmon.gpu.linkhealth import LinkHealth, downtrained, nvlink_sums
from netmon.probe.rankcpu import CPU_PHASES

log = logging.getLogger(__name__)

# A collector: the families of one concern, built from one snapshot.
Collector: TypeAlias = Callable[[Snapshot], Iterable[Metric]]


def series_families(snapshot: Snapshot) -> Iterator[Metric]:
    names = (
        "netmon_busbw_bytes_per_second",
        "netmon_algbw_bytes_per_second",
        "netmon_latency_seconds",
        "netmon_latency_variation_ratio",
        "netmon_measurement_timestamp_seconds",
        "netmon_busbw_baseline_bytes_per_second",
        "netmon_busbw_baseline_ratio",
        "netmon_degraded",
        "netmon_busbw_threshold_bytes_per_second",
        "netmon_sm_clock_hertz",
    )
    families = [family(name, snapshot) for name in names]
    busbw, algbw, latency, spread, measured, baseline, ratio, degraded, threshold, clock = families
    explained = list(verdict_families(snapshot))
    for point in snapshot.series:
        labels = point.labels()
        busbw.add_metric(labels, point.busbw)
        algbw.add_metric(labels, point.algbw)
        latency.add_metric(labels, point.latency_s)
        spread.add_metric(labels, point.cv)
        measured.add_metric(labels, point.measured_at)
        degraded.add_metric(labels, 1.0 if point.degraded else 0.0)
        add_known(
            labels,
            (
                (baseline, point.baseline),
                (ratio, point.ratio),
                (threshold, point.min_busbw),
                (clock, point.sm_clock_hz),
            ),
        )
    for restored in snapshot.restored:
        degraded.add_metric(restored.labels(), 1.0 if restored.degraded else 0.0)
        if restored.baseline is not None:
            baseline.add_metric(restored.labels(), restored.baseline)
    yield from families
    yield from explained
    yield _cpu_mode_family(snapshot)


def _cpu_mode_family(snapshot: Snapshot) -> Metric:
    """What interrupts and the hypervisor took from the ranks' CPUs: apart from the foreign
    share, so that an interrupt storm shows without leaving the fault it causes unjudged."""
    modes = family("netmon_probe_cpu_mode_ratio", snapshot)
    for point in snapshot.series:
        for mode, share in point.cpu_modes:
            modes.add_metric([*point.labels(), mode], share)
    return modes


def path_families(snapshot: Snapshot) -> Iterator[Metric]:
    ratio = family("netmon_nvlink_pcie_busbw_ratio", snapshot)
    by_key: dict[tuple[str, str, int, int], dict[str, float]] = {}
    for point in snapshot.series:
        key = (point.probe, point.op, point.size_bytes, point.ranks)
        by_key.setdefault(key, {})[point.path] = point.busbw
    for (probe, op, size, ranks), paths in sorted(by_key.items()):
        if paths.get("default") and paths.get("pcie"):
            ratio.add_metric([probe, op, str(size), str(ranks)], paths["default"] / paths["pcie"])
    yield ratio
    info = family("netmon_transport_info", snapshot)
    for probe, path, transport in snapshot.transports:
        info.add_metric([probe, path, transport], 1.0)
    yield info
    faults = family("netmon_transport_mismatch", snapshot)
    for (probe, path, reason), count in sorted(snapshot.transport_faults.items()):
        faults.add_metric([probe, path, reason], count)
    yield faults


def pair_families(snapshot: Snapshot) -> Iterator[Metric]:
    busbw = family("netmon_link_busbw_bytes_per_second", snapshot)
    ratio = family("netmon_link_busbw_ratio", snapshot)
    suspect = family("netmon_link_suspect", snapshot)
    in_a_row = family("netmon_link_suspect_sweeps", snapshot)
    largest: dict[tuple[str, int, int], LinkPoint] = {}
    for point in snapshot.links:
        size, gpu, peer = str(point.size_bytes), str(point.gpu), str(point.peer_gpu)
        busbw.add_metric([point.probe, size, gpu, peer, point.path], point.busbw)
        key = (point.probe, point.gpu, point.peer_gpu)
        if key not in largest or point.size_bytes > largest[key].size_bytes:
            largest[key] = point
    measured = family("netmon_link_measurement_timestamp_seconds", snapshot)
    for point in largest.values():
        names = [point.probe, str(point.gpu), str(point.peer_gpu), point.path]
        if point.ratio is not None:
            ratio.add_metric(names, point.ratio)
        suspect.add_metric(names, 1.0 if point.suspect else 0.0)
        in_a_row.add_metric(names, float(point.suspect_sweeps))
        measured.add_metric(names, point.measured_at)
    skips = family("netmon_pair_skips", snapshot)
    for (probe, reason), count in sorted(snapshot.pair_skips.items()):
        skips.add_metric([probe, reason], count)
    gpu_suspect = family("netmon_gpu_suspect", snapshot)
    gpu_in_a_row = family("netmon_gpu_suspect_sweeps", snapshot)
    gpu_measured = family("netmon_gpu_measurement_timestamp_seconds", snapshot)
    for probe, members in sorted(snapshot.pair_members.items()):
        suspects = set(snapshot.suspect_gpus.get(probe, ()))
        streaks = snapshot.gpu_streaks.get(probe, {})
        for member in members:
            labels = [probe, str(member)]
            gpu_suspect.add_metric(labels, 1.0 if member in suspects else 0.0)
            streak = streaks.get(member)
            gpu_in_a_row.add_metric(labels, float(streak.sweeps) if streak else 0.0)
            if streak is not None:
                gpu_measured.add_metric(labels, streak.measured_at)
    topology = family("netmon_topology_link_info", snapshot)
    for gpu_index, peer_index, path in snapshot.topology:
        topology.add_metric([str(gpu_index), str(peer_index), path], 1.0)
    yield from (busbw, ratio, suspect, in_a_row, measured, skips, gpu_suspect)
    yield from (gpu_in_a_row, gpu_measured, topology)


def probe_families(snapshot: Snapshot) -> Iterator[Metric]:
    names = (
        "netmon_probe_runs",
        "netmon_probe_failures",
        "netmon_probe_skips",
        "netmon_probe_busy_seconds",
        "netmon_probe_last_success_timestamp_seconds",
        "netmon_probe_last_run_timestamp_seconds",
        "netmon_probe_duration_seconds",
        "netmon_probe_peak_device_memory_bytes",
        "netmon_probe_interval_seconds",
        "netmon_probe_rank_cpu_seconds",
    )
    families = [family(name, snapshot) for name in names]
    runs, failures, skips, busy, last_success, last_run, duration, memory, interval, cpu = families
    for name, stats in snapshot.probes.items():
        runs.add_metric([name], stats.runs)
        for reason in sorted(set(FAILURE_REASONS) | set(stats.failures)):
            failures.add_metric([name, reason], stats.failures.get(reason, 0))
        for reason in sorted(set(SKIP_REASONS) | set(stats.skips)):
            skips.add_metric([name, reason], stats.skips.get(reason, 0))
        busy.add_metric([name], stats.busy_seconds)
        for phase in CPU_PHASES:
            cpu.add_metric([name, phase], stats.rank_cpu_seconds.get(phase, 0.0))
        interval.add_metric([name], stats.interval_s)
        add_known(
            [name],
            (
                (last_success, stats.last_success),
                (last_run, stats.last_run),
                (duration, stats.duration_s),
                (memory, stats.peak_device_memory),
            ),
        )
    if snapshot.jobs is not None:
        # The jobs' shapes are series of probe "jobs": their alerts count in sample windows.
        interval.add_metric(["jobs"], snapshot.jobs.window_s)
    yield from families
    # Only a daemon judges results (it pre-sets every probe's reasons to 0); a textfile has none.
    inconclusive = family("netmon_inconclusive_results", snapshot)
    for (probe, reason), count in sorted(snapshot.inconclusive.items()):
        inconclusive.add_metric([probe, reason], float(count))
    yield inconclusive
    yield from result_families(snapshot)


def link_health_families(snapshot: Snapshot) -> Iterator[Metric]:
    """PCIe and NVLink health from the latest NVML reading; nothing before the first one.

    Series whose value NVML could not give are left out, never exported as 0. The width verdict
    comes from the latest reading; the generation verdict only from the latest one taken under
    pcie-path traffic (an idle link is slow by design). NVLinks are summed per GPU, and listed
    one by one too with link_telemetry.nvlink_detail: link.
    """
    if snapshot.link_interval_s:
        interval = family("netmon_link_health_interval_seconds", snapshot)
        interval.add_metric([], snapshot.link_interval_s)
        errors = family("netmon_link_health_read_errors", snapshot)
        errors.add_metric([], snapshot.link_read_errors)
        yield from (interval, errors)
    if snapshot.link_load_interval_s:
        load_interval = family("netmon_pcie_link_load_interval_seconds", snapshot)
        load_interval.add_metric([], snapshot.link_load_interval_s)
        yield load_interval
    if snapshot.link_health is not None:
        yield from _pcie_families(snapshot.link_health, snapshot.link_load, snapshot)
        yield from _nvlink_families(snapshot.link_health, snapshot)
        yield from _reading_families(snapshot.link_health, snapshot.link_load, snapshot)


def _pcie_families(
    health: LinkHealth, load: LinkHealth | None, snapshot: Snapshot
) -> Iterator[Metric]:
    generation = family("netmon_pcie_link_generation", snapshot)
    generation_max = family("netmon_pcie_link_generation_max", snapshot)
    width = family("netmon_pcie_link_width", snapshot)
    width_max = family("netmon_pcie_link_width_max", snapshot)
    downtrain = family("netmon_pcie_link_downtrained", snapshot)
    replays = family("netmon_pcie_replay_errors", snapshot)
    # Only the GPUs that carried the pcie-path probe's traffic are judged on generation: the
    # others idled at a power-saving generation, and have no such series.
    under_load = {p.gpu: p for p in (load.pcie if load is not None else ()) if p.loaded}
    for pcie in health.pcie:
        gpu = str(pcie.gpu)
        for gauge, value in (
            (generation, pcie.gen),
            (generation_max, pcie.gen_max),
            (width, pcie.width),
            (width_max, pcie.width_max),
        ):
            if value is not None:
                gauge.add_metric([gpu], value)
        loaded = under_load.get(pcie.gpu)
        if loaded is not None and loaded.gen is not None and loaded.gen_max is not None:
            slow = "generation" in downtrained(loaded, under_load=True)
            downtrain.add_metric([gpu, "generation"], 1.0 if slow else 0.0)
        if pcie.width is not None and pcie.width_max is not None:
            narrow = "width" in downtrained(pcie, under_load=False)
            downtrain.add_metric([gpu, "width"], 1.0 if narrow else 0.0)
        if pcie.replay_counter is not None:
            replays.add_metric([gpu], pcie.replay_counter)
    yield from (generation, generation_max, width, width_max, downtrain, replays)


def _nvlink_families(health: LinkHealth, snapshot: Snapshot) -> Iterator[Metric]:
    links = family("netmon_nvlink_links", snapshot)
    active = family("netmon_nvlink_active_links", snapshot)
    summed = family("netmon_nvlink_gpu_errors", snapshot)
    for gpu, sums in sorted(nvlink_sums(health.nvlinks).items()):
        links.add_metric([str(gpu)], sums.links)
        active.add_metric([str(gpu)], sums.active)
        for error, errors_seen in sums.errors.items():
            summed.add_metric([str(gpu), error], errors_seen)
    throughput = family("netmon_nvlink_throughput_bytes", snapshot)
    for sent in health.throughput:
        for direction, total in (("tx", sent.tx_bytes), ("rx", sent.rx_bytes)):
            if total is not None:
                throughput.add_metric([str(sent.gpu), direction], total)
    yield from (links, active, summed, throughput)
    if not snapshot.nvlink_per_link:
        return
    up = family("netmon_nvlink_up", snapshot)
    errors = family("netmon_nvlink_errors", snapshot)
    for nvlink in health.nvlinks:
        labels = [str(nvlink.gpu), str(nvlink.link)]
        up.add_metric(labels, 1.0 if nvlink.active else 0.0)
        for error, count in nvlink.errors().items():
            if count is not None:
                errors.add_metric([*labels, error], count)
    yield from (up, errors)


def _reading_families(
    health: LinkHealth, load: LinkHealth | None, snapshot: Snapshot
) -> Iterator[Metric]:
    read_at = family("netmon_link_health_read_timestamp_seconds", snapshot)
    read_at.add_metric([], health.read_at)
    under_load = family("netmon_link_health_under_load", snapshot)
    under_load.add_metric([], 1.0 if health.under_load else 0.0)
    yield from (read_at, under_load)
    if load is not None:
        load_at = family("netmon_pcie_link_load_read_timestamp_seconds", snapshot)
        load_at.add_metric([], load.read_at)
        yield load_at


def daemon_families(snapshot: Snapshot) -> Iterator[Metric]:
    paused = family("netmon_paused", snapshot)
    paused.add_metric([], 1.0 if snapshot.paused else 0.0)
    simulated = family("netmon_simulated", snapshot)
    simulated.add_metric([], 1.0 if snapshot.simulated else 0.0)
    build = family("netmon_build_info", snapshot)
    build.add_metric([snapshot.build.get(k, "") for k in ("version", "torch", "nccl")], 1.0)
    node = family("netmon_node_info", snapshot)
    if snapshot.gpu_model is not None:  # a daemon's (a textfile's knows no model)
        node.add_metric([snapshot.gpu_model], 1.0)
    ok, failures, loaded_at = snapshot.config_reload
    reload_ok = family("netmon_config_last_reload_successful", snapshot)
    reload_ok.add_metric([], 1.0 if ok else 0.0)
    reload_failed = family("netmon_config_reload_failures", snapshot)
    reload_failed.add_metric([], float(failures))
    reload_at = family("netmon_config_last_reload_success_timestamp_seconds", snapshot)
    reload_at.add_metric([], loaded_at)
    started = family("netmon_start_time_seconds", snapshot)
    started.add_metric([], snapshot.started_at)
    steps = family("netmon_clock_steps", snapshot)
    steps.add_metric([], float(snapshot.clock_steps))
    yield from (paused, simulated, build, node, reload_ok, reload_failed, reload_at, started, steps)
    yield from state_families(snapshot)
    yield from _rank_start_families(snapshot)


def _rank_start_families(snapshot: Snapshot) -> Iterator[Metric]:
    starts = family("netmon_rank_starts", snapshot)
    for method in sorted(set(RANK_START_METHODS) | set(snapshot.rank_starts)):
        starts.add_metric([method], float(snapshot.rank_starts.get(method, 0)))
    fallbacks = family("netmon_rank_fork_fallbacks", snapshot)
    for reason in sorted(set(FORK_FALLBACK_REASONS) | set(snapshot.fork_fallbacks)):
        fallbacks.add_metric([reason], float(snapshot.fork_fallbacks.get(reason, 0)))
    zygote = family("netmon_zygote_starts", snapshot)
    zygote.add_metric([], float(snapshot.zygote_starts))
    yield from (starts, fallbacks, zygote)


# In exposition order; the name is the `collector` label of netmon_scrape_collector_success.
COLLECTORS: Mapping[str, Collector] = {
    "series": series_families,
    "paths": path_families,
    "pairs": pair_families,
    "probes": probe_families,
    "link_health": link_health_families,
    "group": group_families,
    "sweep": sweep_families,
    "jobs": jobs_families,
    "daemon": daemon_families,
}


class FailureLog:
    """Logs a failing collector's traceback at most once per `every` seconds per collector: a
    collector that fails on one snapshot fails on every scrape of it, and a log is not a counter."""

    def __init__(self, every: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._every = every
        self._clock = clock
        self._lock = threading.Lock()
        self._last: dict[str, float] = {}
        self._quiet: dict[str, int] = {}  # failures not logged since the last line

    def failed(self, collector: str) -> None:
        """Called from an `except` block: the exception being handled is logged."""
        now = self._clock()
        with self._lock:
            last = self._last.get(collector)
            if last is not None and now - last < self._every:
                self._quiet[collector] = self._quiet.get(collector, 0) + 1
                return
            self._last[collector] = now
            quiet = self._quiet.pop(collector, 0)
        again = f" ({quiet} more failures since the last report)" if quiet else ""
        log.error(
            "collector %s failed%s; its families are left out of /metrics",
            collector,
            again,
            exc_info=True,
        )


FAILURES = FailureLog()


class SnapshotCollector:
    """A prometheus_client collector over whatever snapshot `current()` returns."""

    def __init__(
        self,
        current: Callable[[], Snapshot],
        collectors: Mapping[str, Collector] = COLLECTORS,
        failures: FailureLog | None = None,
    ) -> None:
        self._current = current
        self._collectors = collectors
        # Shared by default: SnapshotPage makes a collector per render, the log's minute spans them.
        self._failures = failures if failures is not None else FAILURES

    def describe(self) -> list[Metric]:
        return []  # no fixed description: the families depend on the snapshot

    def collect(self) -> Iterator[Metric]:
        snapshot = self._current()
        success = family("netmon_scrape_collector_success", snapshot)
        for name, collector in self._collectors.items():
            try:
                # Whole or nothing: a collector that fails half-way exports none of its families.
                families = list(collector(snapshot))
            except Exception:
                self._failures.failed(name)
                success.add_metric([name], 0.0)
                continue
            success.add_metric([name], 1.0)
            yield from families
        yield success


# Representations of one snapshot kept rendered at once (SnapshotPage).
MAX_CACHED_FORMATS = 8


def make_registry(
    current: Callable[[], Snapshot], collectors: Mapping[str, Collector] = COLLECTORS
) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(current, collectors))
    return registry


class SnapshotPage:
    """/metrics as bytes, rendered once per snapshot and representation rather than per scrape.

    A snapshot is immutable and every family comes from it (none is measured at scrape time), so
    its exposition never changes: many Prometheus servers, or one scraping often, cost one render
    (and one gzip) per change of results. Concurrent scrapes of a new snapshot wait for one render.
    """

    def __init__(self, current: Callable[[], Snapshot]) -> None:
        self._current = current
        self._lock = threading.Lock()
        self._snapshot: Snapshot | None = None
        self._bodies: dict[Format, bytes] = {}
        self.renders = 0

    def __call__(self, fmt: Format = TEXT) -> bytes:
        snapshot = self._current()
        with self._lock:
            if self._snapshot is not snapshot:
                self._snapshot, self._bodies = snapshot, {}
            body = self._bodies.get(fmt)
            if body is None:
                body = fmt.render(make_registry(lambda: snapshot))
                self.renders += 1
                # The Accept header is the client's: odd versions each make a format of their
                # own, so only the first few are kept (text and OpenMetrics, each gzipped or not).
                if len(self._bodies) < MAX_CACHED_FORMATS:
                    self._bodies[fmt] = body
            return body
