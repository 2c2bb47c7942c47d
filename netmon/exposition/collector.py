"""The exporter: an immutable snapshot of results in, Prometheus metric families out, over HTTP.

Probe data never lives in module-level gauges: the daemon publishes a new frozen Snapshot after
every probe and the collector renders whatever snapshot is current at scrape time, so a scrape
never sees half an update and never triggers a measurement.
"""

from __future__ import annotations

import http.client
import io
import logging
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST

if TYPE_CHECKING:
    from netmon.exposition.webconfig import WebConfigReloader, WebSecurity

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
    "member_absent",
)
SKIP_REASONS = (
    "paused",
    "devices_busy",
    "gpu_busy_process",
    "gpu_busy_utilization",
    "gpu_busy_memory",
    "gpu_allocated",
    "gpu_unknown",
    "gpu_mig",
    "gpu_compute_mode",
    "gpu_missing",
    "nvml_error",
    "kubelet_error",
    "shutting_down",
    "still_running",
    "member_absent",
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
    link_health: Any = None  # netmon.gpu.linkhealth.LinkHealth, read during probe traffic
    group: Any = None  # netmon.serve.results.GroupView
    peers: tuple[PeerPoint, ...] = ()
    peer_verdicts: Mapping[str, PeerVerdict] = field(default_factory=dict)
    # Group messages that failed authentication, by the member they claimed to come from.
    group_rejected: Mapping[str, int] = field(default_factory=dict)
    # (last reload successful, failed reloads, when the configuration was last loaded)
    config_reload: tuple[bool, int, float] = (True, 0, 0.0)


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
        yield from _group_families(snapshot)
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
        ok, failures, loaded_at = snapshot.config_reload
        reload_ok = GaugeMetricFamily(
            "netmon_config_last_reload_successful",
            "1 if the last configuration reload (SIGHUP) succeeded",
        )
        reload_ok.add_metric([], 1.0 if ok else 0.0)
        reload_failed = CounterMetricFamily(
            "netmon_config_reload_failures", "Configuration reloads refused (the old one stayed)"
        )
        reload_failed.add_metric([], float(failures))
        reload_at = GaugeMetricFamily(
            "netmon_config_last_reload_success_timestamp_seconds",
            "When the running configuration was loaded",
        )
        reload_at.add_metric([], loaded_at)
        yield from (reload_ok, reload_failed, reload_at)
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


def _group_families(snapshot: Snapshot) -> Iterator[Metric]:
    peer_busbw = GaugeMetricFamily(
        "netmon_peer_busbw_bytes_per_second",
        "busbw between this node and `peer` (a node_pairs probe, 2-node world), exported by the "
        f"node that hosted rank 0. {_interval_text(snapshot)}.",
        labels=["probe", "size_bytes", "peer"],
    )
    for point in snapshot.peers:
        peer_busbw.add_metric([point.probe, str(point.size_bytes), point.peer], point.busbw)
    yield peer_busbw
    suspect = GaugeMetricFamily(
        "netmon_peer_suspect",
        "1 when every node pair of this member is low against the median "
        "of all node pairs (exported by the leader)",
        labels=["probe", "peer"],
    )
    pair = GaugeMetricFamily(
        "netmon_peer_link_suspect",
        "1 for a node pair low against the median of all node pairs "
        "that neither node explains (exported by the leader)",
        labels=["probe", "member", "peer"],
    )
    for probe, verdict in sorted(snapshot.peer_verdicts.items()):
        for member in verdict.members:
            suspect.add_metric([probe, member], 1.0 if member in verdict.suspects else 0.0)
        for a, b in verdict.pair_suspects:
            pair.add_metric([probe, a, b], 1.0)
    yield from (suspect, pair)
    view = snapshot.group
    if view is None:
        return
    members = GaugeMetricFamily(
        "netmon_group_members",
        "Group members this node reaches now, itself included",
        labels=["group"],
    )
    members.add_metric([view.name], float(len(view.seen)))
    up = GaugeMetricFamily(
        "netmon_group_member_up",
        "1 when this node reaches the member's store agent",
        labels=["group", "member"],
    )
    for member in view.members:
        up.add_metric([view.name, member], 1.0 if member in view.seen else 0.0)
    leader = GaugeMetricFamily(
        "netmon_group_leader",
        "1 for the member this node follows as leader (the lowest-named reachable member)",
        labels=["group", "leader"],
    )
    if view.leader is not None:
        leader.add_metric([view.name, view.leader], 1.0)
    rejected = CounterMetricFamily(
        "netmon_group_messages_rejected",
        "Group messages that failed authentication (wrong secret, tampered, replayed or stale), "
        "by the member they claimed to come from",
        labels=["group", "member"],
    )
    for member in view.members:
        rejected.add_metric([view.name, member], float(snapshot.group_rejected.get(member, 0)))
    yield from (members, up, leader, rejected)


def _health_families(snapshot: Snapshot) -> list[Metric]:
    if snapshot.link_health is None:
        return []
    from netmon.gpu.linkhealth import health_families

    return list(health_families(snapshot.link_health))


def make_registry(current: Callable[[], Snapshot]) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(current))
    return registry


class SnapshotPage:
    """/metrics as bytes, rendered once per snapshot rather than once per scrape.

    A snapshot is immutable and every family comes from it (none is measured at scrape time), so
    its exposition never changes: many Prometheus servers, or one scraping often, cost one render
    per change of results. Concurrent scrapes of a new snapshot wait for one render.
    """

    def __init__(self, current: Callable[[], Snapshot]) -> None:
        self._current = current
        self._lock = threading.Lock()
        self._rendered: tuple[Snapshot, bytes] | None = None
        self.renders = 0

    def __call__(self) -> bytes:
        snapshot = self._current()
        with self._lock:
            if self._rendered is None or self._rendered[0] is not snapshot:
                page = generate_latest(make_registry(lambda: snapshot))
                self._rendered = (snapshot, page)
                self.renders += 1
            return self._rendered[1]


# --- HTTP: bounded against hostile or broken clients (docs/SECURITY.md)

# What a client may send before it is answered. Prometheus sends a request line of a few dozen
# bytes and well under 1 KiB of headers; Apache's defaults are of the same order.
MAX_REQUEST_LINE = 8192
MAX_HEADER_BYTES = 16384
# A body (never expected) up to this size is read and dropped; a larger one closes the connection.
MAX_DISCARDED_BODY = 65536
# The request line and headers must arrive within this many seconds of the server starting to wait
# for them, however slowly the bytes trickle in; each response write is bounded by it too.
REQUEST_TIMEOUT_S = 10.0
# Connections served at once, one thread each; past that, new ones wait in the listen backlog.
# Prometheus' own --web.max-connections default; measured: 500 idle connections cost 13 MB and
# left a scrape at 1.8 ms (1.4 ms without them). It also keeps a flood short of the fd limit.
MAX_CONNECTIONS = 512
# How often, at most, a server started with --web-config compares the state of its files: a stat
# of up to four files a second, whatever the rate of connections (see WebConfigReloader).
WEB_CONFIG_CHECK_S = 1.0


class _DeadlineReader(io.RawIOBase):
    """Socket reads under one deadline for the whole request head, so trickling is cut off."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self.deadline = float("inf")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the request did not arrive in time")
        if left != float("inf"):
            self._sock.settimeout(left)
        return self._sock.recv_into(buffer)


class _HeadLimit:
    """The request's rfile while its headers are parsed: at most `budget` bytes in all."""

    def __init__(self, rfile: Any, budget: int) -> None:
        self._rfile = rfile
        self._budget = budget

    def readline(self, limit: int = -1) -> bytes:
        size = self._budget + 1 if limit < 0 else min(limit, self._budget + 1)
        line: bytes = self._rfile.readline(size)
        self._budget -= len(line)
        if self._budget < 0:
            # parse_request answers 431 to this.
            raise http.client.HTTPException(f"headers over {MAX_HEADER_BYTES} bytes")
        return line


class _Handler(BaseHTTPRequestHandler):
    server: MetricsServer
    protocol_version = "HTTP/1.1"
    server_version = "netmon"

    def version_string(self) -> str:
        return self.server_version  # no Python version in the Server header

    def setup(self) -> None:
        super().setup()
        self.connection.settimeout(self.server.request_timeout)
        self.rfile.close()
        self._reader = _DeadlineReader(self.connection)
        self.rfile = io.BufferedReader(self._reader)

    def handle_one_request(self) -> None:
        """BaseHTTPRequestHandler's, with bounds on the time and size of the request head."""
        self._reader.deadline = time.monotonic() + self.server.request_timeout
        try:
            self.raw_requestline = self.rfile.readline(MAX_REQUEST_LINE + 1)
            if not self.raw_requestline:
                self.close_connection = True
                return
            if len(self.raw_requestline) > MAX_REQUEST_LINE:
                self.requestline = self.request_version = self.command = ""
                self.send_error(414)  # and closes the connection
                return
            rfile, self.rfile = self.rfile, _HeadLimit(self.rfile, MAX_HEADER_BYTES)  # type: ignore[assignment]
            try:
                if not self.parse_request():
                    return  # parse_request has answered 400, 431 or 505
            finally:
                self.rfile = rfile
            self._skip_body()
            self._reader.deadline = float("inf")
            if self.command == "GET":
                self.do_GET()
            elif self.command == "HEAD":
                self.do_HEAD()
            else:
                self._not_allowed()
            self.wfile.flush()
        except TimeoutError as exc:
            self.log_error("request timed out: %r", exc)
            self.close_connection = True

    def _skip_body(self) -> None:
        """Reads a small body (none is expected) to keep the connection; else closes it after."""
        length = self.headers.get("Content-Length")
        if "Transfer-Encoding" in self.headers or length is None:
            self.close_connection |= "Transfer-Encoding" in self.headers
            return
        try:
            size = int(length)
        except ValueError:
            size = -1
        if 0 <= size <= MAX_DISCARDED_BODY:
            self.rfile.read(size)  # under the request deadline
        else:
            self.close_connection = True

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        auth = self.server.security.auth if self.server.security else None
        # /healthz says only "ok", so probes (kubelet) need no credentials; see docs/SECURITY.md.
        if (
            path != "/healthz"
            and auth is not None
            and not auth.check(self.headers["Authorization"])
        ):
            headers = {"WWW-Authenticate": 'Basic realm="netmon"'}
            self._send(401, b"unauthorized\n", "text/plain; charset=utf-8", headers)
        elif path == "/metrics":
            self._send(200, self.server.page(), CONTENT_TYPE_LATEST)
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
        self.close_connection = True  # the body was not necessarily read
        self._send(
            405, b"method not allowed\n", "text/plain; charset=utf-8", {"Allow": "GET, HEAD"}
        )

    def _send(
        self, status: int, body: bytes, content_type: str, headers: Mapping[str, str] | None = None
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def end_headers(self) -> None:
        for name, value in self.server.security.headers if self.server.security else ():
            self.send_header(name, value)
        self.connection.settimeout(self.server.request_timeout)  # bounds the response's writes
        super().end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("http: " + format, *args)


class MetricsServer(ThreadingHTTPServer):
    """/metrics, /healthz and / over HTTP, or HTTPS and basic auth with a web-config."""

    daemon_threads = True
    # The listen backlog: a burst of connections waits here rather than in SYN retries.
    request_queue_size = 128

    def __init__(
        self,
        host: str,
        port: int,
        page: CollectorRegistry | Callable[[], bytes],
        *,
        security: WebSecurity | None = None,
        request_timeout: float = REQUEST_TIMEOUT_S,
        max_connections: int = MAX_CONNECTIONS,
        web_config_check_s: float = WEB_CONFIG_CHECK_S,
    ) -> None:
        # What /metrics serves: a SnapshotPage, or any registry, rendered on every scrape.
        self.page: Callable[[], bytes] = (
            (lambda: generate_latest(page)) if isinstance(page, CollectorRegistry) else page
        )
        self._security = security
        self.web_config = _follow(security, web_config_check_s)
        self.request_timeout = request_timeout
        self._slots = threading.BoundedSemaphore(max_connections)
        self._closing = threading.Event()
        if ":" in host:
            self.address_family = socket.AF_INET6
        super().__init__((host, port), _Handler)

    @property
    def security(self) -> WebSecurity | None:
        """What to enforce now; the handshake and every request ask, so a reload applies at once."""
        return self.web_config.current() if self.web_config is not None else self._security

    def reload_web_config(self) -> None:
        """SIGHUP: read the web-config file now, even if its files look unchanged."""
        if self.web_config is not None:
            self.web_config.reload()

    @property
    def scheme(self) -> str:
        return "https" if self.security is not None and self.security.tls is not None else "http"

    def process_request(self, request: Any, client_address: Any) -> None:
        # One thread per connection, at most max_connections: past that the accept loop waits for
        # a connection to end (an idle one ends within request_timeout).
        while not self._slots.acquire(timeout=0.1):
            if self._closing.is_set():
                self.shutdown_request(request)
                return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            self.shutdown_request(request)
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def finish_request(self, request: Any, client_address: Any) -> None:
        tls = self.security.tls if self.security is not None else None
        if tls is None:
            super().finish_request(request, client_address)
            return
        # The handshake runs in the connection's own thread, bounded by request_timeout: in the
        # accept loop, one silent client would stall every other scrape.
        request.settimeout(self.request_timeout)
        with tls.wrap_socket(request, server_side=True, do_handshake_on_connect=False) as conn:
            try:
                conn.do_handshake()
            except OSError as exc:  # ssl.SSLError, a timeout, a reset
                log.debug("http: TLS handshake with %s failed: %s", client_address[0], exc)
                return
            super().finish_request(conn, client_address)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that resets or stalls mid-response is a network event, not a traceback.
        error = sys.exc_info()[1]
        if isinstance(error, OSError):
            log.debug("http: connection from %s ended: %s", client_address[0], error)
        else:
            log.error("http: error serving %s", client_address[0], exc_info=True)

    def shutdown(self) -> None:
        self._closing.set()
        super().shutdown()

    def serve_in_thread(self) -> threading.Thread:
        thread = threading.Thread(target=self.serve_forever, name="metrics-http", daemon=True)
        thread.start()
        return thread


def _follow(security: WebSecurity | None, interval: float) -> WebConfigReloader | None:
    if security is None or security.source is None:
        return None  # no file, or one built in code: nothing to follow
    # Imported here: a server without --web-config needs neither bcrypt nor the TLS code.
    from netmon.exposition.webconfig import WebConfigReloader

    return WebConfigReloader(security, interval)
