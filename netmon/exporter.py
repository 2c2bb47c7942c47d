"""The exporter: an immutable snapshot of results in, Prometheus metric families out, over HTTP.

Probe data never lives in module-level gauges: the daemon publishes a new frozen Snapshot after
every probe and the collector renders whatever snapshot is current at scrape time, so a scrape
never sees half an update and never triggers a measurement.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST

log = logging.getLogger(__name__)

SERIES_LABELS = ("probe", "op", "size_bytes", "path")

# Bounded label values, exported as 0 from the start so that rate() and increase() see the first
# event (docs/METRICS.md lists them).
FAILURE_REASONS = (
    "timeout_spawn",
    "timeout_rendezvous",
    "timeout_init",
    "timeout_warmup",
    "timeout_measure",
    "timeout_check",
    "timeout_teardown",
    "rendezvous",
    "rank_exit",
    "rank_signal",
    "rank_error",
    "spawn",
    "check",
    "paused",
    "preempted",
    "shutdown",
    "internal",
)
SKIP_REASONS = (
    "paused",
    "devices_busy",
    "gpu_busy_process",
    "gpu_busy_utilization",
    "gpu_busy_memory",
    "gpu_unknown",
    "gpu_mig",
    "gpu_compute_mode",
    "gpu_missing",
    "nvml_error",
    "shutting_down",
    "still_running",
)


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
    baseline: float | None = None
    ratio: float | None = None
    degraded: bool = False
    min_busbw: float | None = None

    def labels(self) -> list[str]:
        return [self.probe, self.op, str(self.size_bytes), self.path]


@dataclass(frozen=True)
class VerdictPoint:
    """A baseline restored from the state file whose series has not been measured again yet."""

    probe: str
    op: str
    size_bytes: int
    path: str
    baseline: float | None
    degraded: bool

    def labels(self) -> list[str]:
        return [self.probe, self.op, str(self.size_bytes), self.path]


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
class Snapshot:
    series: tuple[SeriesPoint, ...] = ()
    restored: tuple[VerdictPoint, ...] = ()
    probes: Mapping[str, ProbeStats] = field(default_factory=dict)
    paused: bool = False
    build: Mapping[str, str] = field(default_factory=dict)
    started_at: float = 0.0
    links: tuple[LinkPoint, ...] = ()
    suspect_gpus: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    pair_members: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    topology: tuple[tuple[int, int, str], ...] = ()  # (gpu, peer_gpu, path class)
    transports: tuple[tuple[str, str, str], ...] = ()  # (probe, path, transport)
    transport_faults: Mapping[tuple[str, str, str], int] = field(default_factory=dict)
    link_health: Any = None  # netmon.linkhealth.LinkHealth, read during probe traffic


def _interval_text(snapshot: Snapshot) -> str:
    parts = [
        f"{name} every {stats.interval_s:g} s" if stats.interval_s else f"{name} once"
        for name, stats in snapshot.probes.items()
    ]
    return "Measured by the probes (" + ", ".join(parts) + "), not at scrape time"


class SnapshotCollector:
    """A prometheus_client collector over whatever snapshot `current()` returns."""

    def __init__(self, current: Callable[[], Snapshot]) -> None:
        self._current = current

    def describe(self) -> list[Metric]:
        return []  # no fixed description: the families depend on the snapshot

    def collect(self) -> Iterator[Metric]:
        snapshot = self._current()
        yield from self._series_families(snapshot)
        yield from self._path_families(snapshot)
        yield from self._link_families(snapshot)
        yield from self._probe_families(snapshot)
        yield from _health_families(snapshot)
        paused = GaugeMetricFamily("netmon_paused", "1 while the operator pause file exists")
        paused.add_metric([], 1.0 if snapshot.paused else 0.0)
        yield paused
        build = GaugeMetricFamily(
            "netmon_build_info",
            "netmon, torch and NCCL versions",
            labels=["version", "torch", "nccl"],
        )
        build.add_metric([snapshot.build.get(k, "") for k in ("version", "torch", "nccl")], 1.0)
        yield build
        started = GaugeMetricFamily("netmon_start_time_seconds", "When the daemon started")
        started.add_metric([], snapshot.started_at)
        yield started

    def _series_families(self, snapshot: Snapshot) -> Iterator[Metric]:
        when = _interval_text(snapshot)

        def family(name: str, help_text: str) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, f"{help_text}. {when}.", labels=SERIES_LABELS)

        busbw = family("netmon_busbw_bytes_per_second", "Bus bandwidth (nccl-tests busbw)")
        algbw = family("netmon_algbw_bytes_per_second", "Algorithm bandwidth (size / time)")
        latency = family("netmon_latency_seconds", "Time per op, median over samples")
        spread = family(
            "netmon_latency_variation_ratio", "Coefficient of variation of the time per op"
        )
        measured = family("netmon_measurement_timestamp_seconds", "When this value was measured")
        baseline = family(
            "netmon_busbw_baseline_bytes_per_second",
            "Learned baseline: median busbw of recent healthy results",
        )
        ratio = family("netmon_busbw_baseline_ratio", "Latest busbw divided by its baseline")
        degraded = family(
            "netmon_degraded",
            "1 when M of the last N results fell under R x baseline (hysteresis both ways)",
        )
        threshold = family(
            "netmon_busbw_threshold_bytes_per_second", "Configured min_busbw of the probe"
        )
        for point in snapshot.series:
            labels = point.labels()
            busbw.add_metric(labels, point.busbw)
            algbw.add_metric(labels, point.algbw)
            latency.add_metric(labels, point.latency_s)
            spread.add_metric(labels, point.cv)
            measured.add_metric(labels, point.measured_at)
            degraded.add_metric(labels, 1.0 if point.degraded else 0.0)
            if point.baseline is not None:
                baseline.add_metric(labels, point.baseline)
            if point.ratio is not None:
                ratio.add_metric(labels, point.ratio)
            if point.min_busbw is not None:
                threshold.add_metric(labels, point.min_busbw)
        for restored in snapshot.restored:
            degraded.add_metric(restored.labels(), 1.0 if restored.degraded else 0.0)
            if restored.baseline is not None:
                baseline.add_metric(restored.labels(), restored.baseline)
        yield from (busbw, algbw, latency, spread, measured, baseline, ratio, degraded, threshold)

    def _path_families(self, snapshot: Snapshot) -> Iterator[Metric]:
        ratio = GaugeMetricFamily(
            "netmon_nvlink_pcie_busbw_ratio",
            "busbw on the default (NVLink) path over the PCIe host-memory path (NCCL_P2P_DISABLE)"
            f". {_interval_text(snapshot)}.",
            labels=["probe", "op", "size_bytes"],
        )
        by_key: dict[tuple[str, str, int], dict[str, float]] = {}
        for point in snapshot.series:
            by_key.setdefault((point.probe, point.op, point.size_bytes), {})[point.path] = (
                point.busbw
            )
        for (probe, op, size), paths in sorted(by_key.items()):
            if paths.get("default") and paths.get("pcie"):
                ratio.add_metric([probe, op, str(size)], paths["default"] / paths["pcie"])
        yield ratio
        info = GaugeMetricFamily(
            "netmon_transport_info",
            "1 for each transport the ranks of a probe path used, from NCCL_DEBUG=INFO (p2p, shm, "
            "net_ib, net_socket, net_other, nvls; gloo for CPU ranks)",
            labels=["probe", "path", "transport"],
        )
        for probe, path, transport in snapshot.transports:
            info.add_metric([probe, path, transport], 1.0)
        yield info
        faults = CounterMetricFamily(
            "netmon_transport_mismatch",
            "Probe runs whose transports contradicted the intended path, by reason",
            labels=["probe", "path", "reason"],
        )
        for (probe, path, reason), count in sorted(snapshot.transport_faults.items()):
            faults.add_metric([probe, path, reason], count)
        yield faults

    def _link_families(self, snapshot: Snapshot) -> Iterator[Metric]:
        when = _interval_text(snapshot)
        labels = ["probe", "gpu", "peer_gpu", "path"]
        busbw = GaugeMetricFamily(
            "netmon_link_busbw_bytes_per_second",
            f"busbw of one GPU pair probed alone (2 ranks). {when}.",
            labels=["probe", "size_bytes", "gpu", "peer_gpu", "path"],
        )
        ratio = GaugeMetricFamily(
            "netmon_link_busbw_ratio",
            f"A pair's busbw at its largest size over the median of its path class. {when}.",
            labels=labels,
        )
        suspect = GaugeMetricFamily(
            "netmon_link_suspect",
            "1 when the pair is low against its path class and neither GPU explains it",
            labels=labels,
        )
        largest: dict[tuple[str, int, int], LinkPoint] = {}
        for point in snapshot.links:
            key = (point.probe, point.gpu, point.peer_gpu)
            busbw.add_metric(
                [
                    point.probe,
                    str(point.size_bytes),
                    str(point.gpu),
                    str(point.peer_gpu),
                    point.path,
                ],
                point.busbw,
            )
            if key not in largest or point.size_bytes > largest[key].size_bytes:
                largest[key] = point
        for point in largest.values():
            names = [point.probe, str(point.gpu), str(point.peer_gpu), point.path]
            if point.ratio is not None:
                ratio.add_metric(names, point.ratio)
            suspect.add_metric(names, 1.0 if point.suspect else 0.0)
        gpu_suspect = GaugeMetricFamily(
            "netmon_gpu_suspect",
            "1 when every pair of this GPU (or CPU rank) is low against its path class",
            labels=["probe", "gpu"],
        )
        for probe, members in sorted(snapshot.pair_members.items()):
            suspects = set(snapshot.suspect_gpus.get(probe, ()))
            for member in members:
                gpu_suspect.add_metric([probe, str(member)], 1.0 if member in suspects else 0.0)
        topology = GaugeMetricFamily(
            "netmon_topology_link_info",
            "1 for every GPU pair, with its path class as nvidia-smi topo -m shows it (NV18, PIX)",
            labels=["gpu", "peer_gpu", "path"],
        )
        for gpu, peer, path in snapshot.topology:
            topology.add_metric([str(gpu), str(peer), path], 1.0)
        yield from (busbw, ratio, suspect, gpu_suspect, topology)

    def _probe_families(self, snapshot: Snapshot) -> Iterator[Metric]:
        runs = CounterMetricFamily("netmon_probe_runs", "Probe runs started", labels=["probe"])
        failures = CounterMetricFamily(
            "netmon_probe_failures", "Probe runs that failed, by reason", labels=["probe", "reason"]
        )
        skips = CounterMetricFamily(
            "netmon_probe_skips",
            "Scheduled probe runs not started, by reason",
            labels=["probe", "reason"],
        )
        busy = CounterMetricFamily(
            "netmon_probe_busy_seconds",
            "Device-seconds held by probes (wall time x devices or CPU ranks): the cost of probing",
            labels=["probe"],
        )
        last_success = GaugeMetricFamily(
            "netmon_probe_last_success_timestamp_seconds",
            "When the probe last succeeded",
            labels=["probe"],
        )
        last_run = GaugeMetricFamily(
            "netmon_probe_last_run_timestamp_seconds",
            "When the probe last ended, success or not",
            labels=["probe"],
        )
        duration = GaugeMetricFamily(
            "netmon_probe_duration_seconds", "Wall time of the last run", labels=["probe"]
        )
        memory = GaugeMetricFamily(
            "netmon_probe_peak_device_memory_bytes",
            "Peak device memory a rank allocated in the last run (torch allocator, nccl only)",
            labels=["probe"],
        )
        interval = GaugeMetricFamily(
            "netmon_probe_interval_seconds", "Configured probe interval", labels=["probe"]
        )
        for name, stats in snapshot.probes.items():
            runs.add_metric([name], stats.runs)
            for reason in sorted(set(FAILURE_REASONS) | set(stats.failures)):
                failures.add_metric([name, reason], stats.failures.get(reason, 0))
            for reason in sorted(set(SKIP_REASONS) | set(stats.skips)):
                skips.add_metric([name, reason], stats.skips.get(reason, 0))
            busy.add_metric([name], stats.busy_seconds)
            interval.add_metric([name], stats.interval_s)
            if stats.last_success is not None:
                last_success.add_metric([name], stats.last_success)
            if stats.last_run is not None:
                last_run.add_metric([name], stats.last_run)
            if stats.duration_s is not None:
                duration.add_metric([name], stats.duration_s)
            if stats.peak_device_memory is not None:
                memory.add_metric([name], stats.peak_device_memory)
        yield from (runs, failures, skips, busy, last_success, last_run, duration, memory, interval)


def _health_families(snapshot: Snapshot) -> list[Metric]:
    if snapshot.link_health is None:
        return []
    from netmon.linkhealth import health_families

    return list(health_families(snapshot.link_health))


def make_registry(current: Callable[[], Snapshot]) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(current))
    return registry


class _Handler(BaseHTTPRequestHandler):
    server: MetricsServer
    protocol_version = "HTTP/1.1"
    # Bound a slow client: each socket read must complete within this many seconds.
    timeout = 10

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            self._send(200, generate_latest(self.server.registry), CONTENT_TYPE_LATEST)
        elif path == "/healthz":
            self._send(200, b"ok\n", "text/plain; charset=utf-8")
        elif path == "/":
            body = b"<html><body><h1>netmon</h1><a href='/metrics'>/metrics</a></body></html>\n"
            self._send(200, body, "text/html; charset=utf-8")
        else:
            self._send(404, b"not found\n", "text/plain; charset=utf-8")

    def do_HEAD(self) -> None:
        self.do_GET()

    def _not_allowed(self) -> None:
        # The request body is never read, so the connection cannot carry another request.
        headers = {"Allow": "GET, HEAD", "Connection": "close"}
        self._send(405, b"method not allowed\n", "text/plain; charset=utf-8", headers)

    do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _not_allowed

    def _send(
        self, status: int, body: bytes, content_type: str, headers: Mapping[str, str] | None = None
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("http: " + format, *args)


class MetricsServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, host: str, port: int, registry: CollectorRegistry) -> None:
        self.registry = registry
        if ":" in host:
            import socket

            self.address_family = socket.AF_INET6
        super().__init__((host, port), _Handler)

    def serve_in_thread(self) -> threading.Thread:
        thread = threading.Thread(target=self.serve_forever, name="metrics-http", daemon=True)
        thread.start()
        return thread
