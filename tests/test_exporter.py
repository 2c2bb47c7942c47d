"""The metric contract: snapshots built by hand rendered by the collector, the real HTTP server on a
loopback port, and Results turning hand-made probe outcomes into snapshots, baselines and state."""

from __future__ import annotations

import dataclasses
import http.client
import json
import re
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import get_args

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.parser import text_string_to_metric_families

from netmon import baseline
from netmon.bandwidth import bus_factor
from netmon.config import NetmonConfig, ProbeConfig, parse_config
from netmon.exposition.catalogue import (
    FAILURE_REASONS,
    PAIR_SKIP_REASONS,
    SERIES_LABELS,
    SKIP_REASONS,
)
from netmon.exposition.collector import SnapshotPage, make_registry
from netmon.exposition.http import MetricsServer
from netmon.exposition.snapshot import (
    GroupView,
    JobsView,
    LinkPoint,
    PeerPoint,
    PeerVerdict,
    ProbeStats,
    SeriesPoint,
    Snapshot,
    SweepView,
    VerdictPoint,
    forget_verdict,
    verdict_fields,
    verdict_point,
)
from netmon.gpu import idle
from netmon.gpu.linkhealth import (
    LinkHealth,
    NvLinkReading,
    NvLinkThroughput,
    PcieReading,
    marked_loaded,
)
from netmon.probe.build import build_spec
from netmon.probe.spec import (
    PHASES,
    FailureCause,
    ProbeEnvironment,
    ProbeFailure,
    ProbeOutcome,
    SizeResult,
)
from netmon.probe.streaks import Streak
from netmon.serve.current import CurrentConfig
from netmon.serve.keeper import BaselineKeeper
from netmon.serve.results import Results
from netmon.sweep.delivery import textfile
from netmon.sweep.delivery.node_report import NodeReport, PeerResult

DOCS = Path(__file__).resolve().parent.parent / "docs" / "METRICS.md"
MIB = 1 << 20
T0 = 1_700_000_000.0

SMALL = SeriesPoint(
    probe="small",
    op="all_reduce",
    size_bytes=8,
    path="default",
    busbw=1.5e6,
    algbw=0.75e6,
    latency_s=2.5e-5,
    cv=0.04,
    measured_at=T0 + 10,
    ranks=2,
)
LARGE = SeriesPoint(
    probe="large",
    op="all_reduce",
    size_bytes=256 * MIB,
    path="nv4",
    busbw=90e9,
    algbw=45e9,
    latency_s=5.96e-3,
    cv=0.01,
    measured_at=T0 + 20,
    ranks=8,
    baseline=100e9,
    ratio=0.9,
    degraded=True,
    min_busbw=1e9,
    spread=2e9,
    low_bound=80e9,
    judged=True,
    low_recent=3,
    foreign_cpu=0.02,
    cpu_modes=(("irq", 0.01), ("softirq", 0.03), ("steal", 0.0)),
)
SNAPSHOT = Snapshot(
    series=(SMALL, LARGE),
    probes={
        "small": ProbeStats(
            runs=7,
            failures={"timeout_measure": 2, "rank_exit": 1},
            skips={"paused": 3},
            last_success=T0 + 10,
            last_run=T0 + 11,
            duration_s=4.5,
            busy_seconds=9.0,
            interval_s=60.0,
        ),
        "large": ProbeStats(
            runs=1,
            last_success=T0 + 20,
            last_run=T0 + 20,
            duration_s=30.0,
            busy_seconds=240.0,
            peak_device_memory=2 << 30,
            interval_s=900.0,
        ),
    },
    build={"version": "0.1.0", "torch": "2.4.0", "nccl": "2.21.5"},
    started_at=T0,
)

SERIES_FAMILIES = (
    "netmon_busbw_bytes_per_second",
    "netmon_algbw_bytes_per_second",
    "netmon_latency_seconds",
    "netmon_latency_variation_ratio",
    "netmon_measurement_timestamp_seconds",
    "netmon_busbw_baseline_bytes_per_second",
    "netmon_busbw_baseline_ratio",
    "netmon_degraded",
    "netmon_busbw_threshold_bytes_per_second",
)


def labels(point: SeriesPoint) -> dict[str, str]:
    return dict(zip(SERIES_LABELS, point.labels(), strict=True))


def value(registry: CollectorRegistry, name: str, **label_values: str) -> float | None:
    return registry.get_sample_value(name, label_values)


def exposition(registry: CollectorRegistry) -> str:
    return generate_latest(registry).decode()


# --- the collector over hand-made snapshots


def test_series_families_carry_the_latest_measurement() -> None:
    registry = make_registry(lambda: SNAPSHOT)
    small, large = labels(SMALL), labels(LARGE)

    assert value(registry, "netmon_busbw_bytes_per_second", **small) == 1.5e6
    assert value(registry, "netmon_algbw_bytes_per_second", **small) == 0.75e6
    assert value(registry, "netmon_latency_seconds", **small) == 2.5e-5
    assert value(registry, "netmon_latency_variation_ratio", **small) == 0.04
    assert value(registry, "netmon_measurement_timestamp_seconds", **small) == T0 + 10
    assert value(registry, "netmon_degraded", **small) == 0.0
    # No baseline learned yet, no threshold configured: those series are absent, not 0.
    assert value(registry, "netmon_busbw_baseline_bytes_per_second", **small) is None
    assert value(registry, "netmon_busbw_baseline_ratio", **small) is None
    assert value(registry, "netmon_busbw_threshold_bytes_per_second", **small) is None

    assert large == {
        "probe": "large",
        "op": "all_reduce",
        "size_bytes": "268435456",
        "path": "nv4",
        "ranks": "8",
    }
    assert value(registry, "netmon_busbw_bytes_per_second", **large) == 90e9
    assert value(registry, "netmon_busbw_baseline_bytes_per_second", **large) == 100e9
    assert value(registry, "netmon_busbw_baseline_ratio", **large) == 0.9
    assert value(registry, "netmon_degraded", **large) == 1.0
    assert value(registry, "netmon_busbw_threshold_bytes_per_second", **large) == 1e9


def test_probe_families_count_runs_failures_and_skips() -> None:
    registry = make_registry(lambda: SNAPSHOT)

    assert value(registry, "netmon_probe_runs_total", probe="small") == 7
    assert value(registry, "netmon_probe_runs_total", probe="large") == 1
    failures = "netmon_probe_failures_total"
    assert value(registry, failures, probe="small", reason="timeout_measure") == 2
    assert value(registry, failures, probe="small", reason="rank_exit") == 1
    assert value(registry, "netmon_probe_skips_total", probe="small", reason="paused") == 3
    assert value(registry, "netmon_probe_busy_seconds_total", probe="large") == 240.0
    assert value(registry, "netmon_probe_last_success_timestamp_seconds", probe="small") == T0 + 10
    assert value(registry, "netmon_probe_last_run_timestamp_seconds", probe="small") == T0 + 11
    assert value(registry, "netmon_probe_duration_seconds", probe="large") == 30.0
    assert value(registry, "netmon_probe_peak_device_memory_bytes", probe="large") == 2 << 30
    assert value(registry, "netmon_probe_peak_device_memory_bytes", probe="small") is None
    assert value(registry, "netmon_probe_interval_seconds", probe="large") == 900.0
    build = {"version": "0.1.0", "torch": "2.4.0", "nccl": "2.21.5"}
    assert value(registry, "netmon_build_info", **build) == 1.0
    assert value(registry, "netmon_paused") == 0.0
    assert value(registry, "netmon_start_time_seconds") == T0


def test_known_reasons_are_exported_as_zero_from_the_start() -> None:
    fresh = Snapshot(probes={"small": ProbeStats(interval_s=60.0)})
    registry = make_registry(lambda: fresh)

    for reason in FAILURE_REASONS:
        assert value(registry, "netmon_probe_failures_total", probe="small", reason=reason) == 0
    for reason in SKIP_REASONS:
        assert value(registry, "netmon_probe_skips_total", probe="small", reason=reason) == 0
    assert value(registry, "netmon_probe_runs_total", probe="small") == 0
    assert value(registry, "netmon_probe_busy_seconds_total", probe="small") == 0
    # Never happened: no timestamp, rather than a 1970 one.
    assert value(registry, "netmon_probe_last_success_timestamp_seconds", probe="small") is None


def test_label_cardinality_is_bounded_by_the_reason_lists() -> None:
    families = {f.name: f for f in make_registry(lambda: SNAPSHOT).collect()}
    probes = len(SNAPSHOT.probes)
    assert len(families["netmon_probe_failures"].samples) == probes * len(set(FAILURE_REASONS))
    assert len(families["netmon_probe_skips"].samples) == probes * len(set(SKIP_REASONS))
    assert len(families["netmon_busbw_bytes_per_second"].samples) == len(SNAPSHOT.series)
    # A reason outside the list (a future cause) is still exported, not dropped.
    odd = Snapshot(probes={"small": ProbeStats(failures={"brand_new": 1})})
    odd_families = {f.name: f for f in make_registry(lambda: odd).collect()}
    reasons = {s.labels["reason"] for s in odd_families["netmon_probe_failures"].samples}
    assert reasons == set(FAILURE_REASONS) | {"brand_new"}


def test_every_reason_the_code_can_produce_is_a_known_one() -> None:
    causes: tuple[FailureCause, ...] = get_args(FailureCause)
    produced = set()
    for phase in PHASES:
        for cause in causes:
            cancel_reasons = (
                ("paused", "preempted", "shutdown") if cause == "cancelled" else (None,)
            )
            for cancel in cancel_reasons:
                failure = ProbeFailure(
                    phase=phase, rank=0, cause=cause, detail="x", cancel_reason=cancel
                )
                produced.add(failure.reason)
    assert produced <= set(FAILURE_REASONS), produced - set(FAILURE_REASONS)
    # Idle decisions, and the runner's and scheduler's own skips (runner.py, daemon.py).
    skips = set(idle.REASONS) | {"paused", "devices_busy", "shutting_down", "still_running"}
    assert skips <= set(SKIP_REASONS), skips - set(SKIP_REASONS)


def test_help_says_values_are_measured_by_the_probes_not_at_scrape_time() -> None:
    text = exposition(make_registry(lambda: SNAPSHOT))
    when = "Measured by the probes (small every 60 s, large every 900 s), not at scrape time."
    for name in SERIES_FAMILIES:
        help_line = next(line for line in text.splitlines() if line.startswith(f"# HELP {name} "))
        assert help_line.endswith(when), help_line
    assert "# HELP netmon_busbw_bytes_per_second Bus bandwidth (nccl-tests busbw). " in text
    assert "# TYPE netmon_probe_runs_total counter" in text
    assert "# TYPE netmon_busbw_bytes_per_second gauge" in text


def test_exposition_parses_back_with_one_type_per_family() -> None:
    text = exposition(make_registry(lambda: SNAPSHOT))
    types = {family.name: family.type for family in text_string_to_metric_families(text)}
    counters = {"runs", "failures", "skips", "busy_seconds", "rank_cpu_seconds"}
    assert {name for name, kind in types.items() if kind == "counter"} == {
        f"netmon_probe_{name}" for name in counters
    } | {
        "netmon_transport_mismatch",
        "netmon_config_reload_failures",
        "netmon_pair_skips",
        "netmon_rank_starts",
        "netmon_rank_fork_fallbacks",
        "netmon_zygote_starts",
        "netmon_inconclusive_results",
        "netmon_series_results",
        "netmon_reference_resets",
        "netmon_state_write_errors",
        "netmon_state_errors",
        "netmon_clock_steps",
        "netmon_degraded_episodes",
    }
    assert set(types) >= set(SERIES_FAMILIES)
    assert all(kind in ("counter", "gauge") for kind in types.values())


def test_a_new_snapshot_shows_on_the_next_scrape_and_nothing_old_survives() -> None:
    current = [SNAPSHOT]
    calls = [0]

    def now() -> Snapshot:
        calls[0] += 1
        return current[0]

    registry = make_registry(now)
    assert value(registry, "netmon_busbw_bytes_per_second", **labels(LARGE)) == 90e9
    replacement = dataclasses.replace(LARGE, probe="other", busbw=42.0, baseline=None, ratio=None)
    current[0] = Snapshot(
        series=(replacement,),
        probes={"other": ProbeStats(runs=3, interval_s=5.0)},
        build={"version": "0.2.0"},
    )

    text = exposition(registry)
    assert 'probe="small"' not in text and 'probe="large"' not in text
    assert value(registry, "netmon_busbw_bytes_per_second", **labels(replacement)) == 42.0
    assert value(registry, "netmon_busbw_bytes_per_second", **labels(LARGE)) is None
    assert value(registry, "netmon_busbw_baseline_bytes_per_second", **labels(replacement)) is None
    assert value(registry, "netmon_probe_runs_total", probe="small") is None
    assert value(registry, "netmon_build_info", version="0.2.0", torch="", nccl="") == 1.0
    assert "other every 5 s" in text
    # One snapshot per scrape: a scrape is one consistent view and never starts a measurement.
    calls[0] = 0
    exposition(registry)
    assert calls[0] == 1


# Every optional family present: paths, transports, pairs, topology and NVML link health.
# Measured on GPUs: with their SM clock.
_PCIE = dataclasses.replace(LARGE, path="pcie", busbw=10e9, sm_clock_hz=1.98e9)
# A judged series with its reference, fixed, and its long level, degraded on drift.
_DEFAULT = dataclasses.replace(
    LARGE,
    path="default",
    reference=12e9,
    degraded=True,
    reason="drift",
    judged=True,
    long_level=10e9,
    reference_line=10.8e9,
    reference_mature=True,
    flaps=2,
    degraded_since=T0 + 15,
    episodes=1,
)
_HEALTH = LinkHealth(
    pcie=(PcieReading(gpu=0, gen=4, gen_max=4, width=8, width_max=16, replay_counter=3),),
    nvlinks=(
        NvLinkReading(
            gpu=0,
            link=0,
            active=True,
            replay_errors=0,
            recovery_errors=0,
            crc_flit_errors=1,
            crc_data_errors=0,
        ),
    ),
    throughput=(NvLinkThroughput(gpu=0, tx_bytes=1024, rx_bytes=2048),),
    under_load=True,
    read_at=T0,
)
_LINK = LinkPoint(
    probe="pairs",
    size_bytes=MIB,
    gpu=0,
    peer_gpu=1,
    path="NV18",
    busbw=1e9,
    ratio=1.0,
    low=False,
    suspect=False,
)
# A sweep that measured rail 0 with n2 (and failed it) and was preempted with n3, naming the path.
_SWEEP = NodeReport(
    sweep=f"{int(T0 * 1000):013d}-00abcd",
    node="n1",
    at=T0 + 60,
    finished_at=T0 + 50,
    results=(
        PeerResult(
            peer="n2",
            rail=0,
            round=1,
            outcome="fail",
            busbw=5e9,
            expected=10e9,
            ratio=0.5,
            measured_at=T0 + 40,
        ),
        PeerResult(peer="n3", rail=0, round=2, outcome="preempted", measured_at=T0 + 45),
    ),
    suspect=True,
    suspect_peers=("n2",),
)
FULL_SNAPSHOT = dataclasses.replace(
    SNAPSHOT,
    paused=True,
    series=(*SNAPSHOT.series, _PCIE, _DEFAULT),
    links=(_LINK,),
    suspect_gpus={"pairs": ()},
    pair_members={"pairs": (0, 1)},
    gpu_streaks={"pairs": {0: Streak(0, T0), 1: Streak(1, T0)}},
    topology=((0, 1, "NV18"),),
    transports=(("large", "default", "p2p"),),
    transport_faults={("large", "pcie", "p2p_where_pcie_expected"): 1},
    pair_skips={("pairs", "gpu_busy_process"): 2},
    link_health=dataclasses.replace(_HEALTH, under_load=False, read_at=T0 + 30),
    link_load=marked_loaded(_HEALTH, {0}),  # GPU 0 carried the pcie-path probe's traffic
    link_interval_s=30.0,
    link_load_interval_s=900.0,
    link_read_errors=1,
    nvlink_per_link=True,
    group=GroupView("rack-a", ("a:1", "b:1"), ("a:1",), "a:1", "a:1"),
    peers=(PeerPoint("nodes", MIB, "b:1", 1e9),),
    peer_verdicts={
        "nodes": PeerVerdict(
            ("a:1", "b:1"),
            (),
            (("a:1", "b:1"),),
            {"a:1": Streak(0, T0), "b:1": Streak(0, T0)},
            {("a:1", "b:1"): Streak(2, T0)},
        )
    },
    inconclusive={("large", "disturbed"): 4, ("large", "settling"): 2},
    series_results={"large": 9},
    reference_resets={("large", "operator"): 1, ("large", "hardware"): 0},
    sweep=SweepView(_SWEEP, 2, 1, {"accepted": 2, "refused": 1}),
    jobs=JobsView(
        collectives={"node": 120, "nodes": 40},
        overflow=3,
        shapes=2,
        covered=0.97,
        rejected={"symlink": 1},
        removed=1,
        directories={"live": 2, "foreign": 1},
        read_at=T0 + 30,
        window_s=120.0,
        probe_ratios={("all_reduce", 64 * MIB, 8): 0.93},
    ),
    gpu_model="NVIDIA H100 80GB HBM3",
)


def collect(snapshot: Snapshot) -> list[Metric]:
    return list(make_registry(lambda: snapshot).collect())


def test_the_documented_contract_matches_what_is_exported() -> None:
    docs = DOCS.read_text()
    documented = set(re.findall(r"^\| `(netmon_[a-z_]+)`", docs, flags=re.MULTILINE))
    # The sweep host's textfile families are documented beside the daemon's; never a daemon's.
    sweep_host = {family.name for family in textfile.FAMILIES}
    assert sweep_host <= documented
    documented -= sweep_host
    exported = {sample.name for family in collect(FULL_SNAPSHOT) for sample in family.samples}
    assert documented == exported, (documented - exported, exported - documented)
    for reason in (*FAILURE_REASONS, *SKIP_REASONS):
        assert f"`{reason}`" in docs, reason


# --- the HTTP server, for real on a loopback port


@pytest.fixture
def server() -> Iterator[tuple[MetricsServer, list[Snapshot]]]:
    current = [SNAPSHOT]
    # As the daemon serves it: rendered once per snapshot.
    metrics = MetricsServer("127.0.0.1", 0, SnapshotPage(lambda: current[0]))
    thread = metrics.serve_in_thread()
    try:
        yield metrics, current
    finally:
        metrics.shutdown()
        metrics.server_close()
        thread.join(timeout=5)
    assert not thread.is_alive()


def connect(metrics: MetricsServer) -> http.client.HTTPConnection:
    return http.client.HTTPConnection("127.0.0.1", metrics.server_address[1], timeout=5)


def request(
    metrics: MetricsServer, method: str, path: str, body: bytes | None = None
) -> tuple[int, http.client.HTTPResponse, bytes]:
    connection = connect(metrics)
    try:
        connection.request(method, path, body=body)
        response = connection.getresponse()
        return response.status, response, response.read()
    finally:
        connection.close()


def test_a_snapshot_is_rendered_once_however_many_scrape_it(
    server: tuple[MetricsServer, list[Snapshot]],
) -> None:
    metrics, current = server
    page = metrics.page
    assert isinstance(page, SnapshotPage)
    with ThreadPoolExecutor(max_workers=8) as pool:
        bodies = list(pool.map(lambda _: request(metrics, "GET", "/metrics")[2], range(24)))
    assert len(set(bodies)) == 1 and page.renders == 1
    assert bodies[0] == generate_latest(make_registry(lambda: SNAPSHOT))
    replacement = dataclasses.replace(LARGE, busbw=42.0)
    current[0] = dataclasses.replace(SNAPSHOT, series=(replacement,))
    body = request(metrics, "GET", "/metrics")[2]
    assert page.renders == 2
    assert b'path="nv4",probe="large",ranks="8",size_bytes="268435456"} 42.0' in body


def test_results_give_one_snapshot_object_while_nothing_changes(
    setup: tuple[NetmonConfig, Results, Path], tmp_path: Path
) -> None:
    _, results, _ = setup
    first = results.snapshot()
    assert results.snapshot() is first and not first.paused
    (tmp_path / "pause").touch()
    paused = results.snapshot()
    assert paused.paused and results.snapshot() is paused  # not a new copy per scrape
    (tmp_path / "pause").unlink()
    assert not results.snapshot().paused


def test_http_metrics_healthz_and_errors(server: tuple[MetricsServer, list[Snapshot]]) -> None:
    metrics, _ = server

    status, response, body = request(metrics, "GET", "/metrics")
    assert status == 200
    # No Accept header: the text format 0.0.4 (tests/test_negotiation.py has the others).
    assert response.getheader("Content-Type") == CONTENT_TYPE_PLAIN_0_0_4
    assert int(response.getheader("Content-Length") or -1) == len(body)
    assert b'netmon_busbw_bytes_per_second{op="all_reduce",path="nv4",probe="large"' in body

    assert request(metrics, "GET", "/metrics?name[]=netmon_paused")[0] == 200
    status, _, body = request(metrics, "GET", "/healthz")
    assert (status, body) == (200, b"ok\n")
    status, _, body = request(metrics, "GET", "/")
    assert status == 200 and b"/metrics" in body
    assert request(metrics, "GET", "/nope")[0] == 404
    for method in ("POST", "PUT", "DELETE"):
        status, response, _ = request(metrics, method, "/metrics", body=b"x=1")
        assert status == 405
        assert response.getheader("Allow") == "GET, HEAD"


def test_http_head_sends_headers_only(server: tuple[MetricsServer, list[Snapshot]]) -> None:
    metrics, _ = server
    status, response, body = request(metrics, "HEAD", "/metrics")
    assert status == 200
    assert response.getheader("Content-Type") == CONTENT_TYPE_PLAIN_0_0_4
    assert int(response.getheader("Content-Length") or 0) > 0
    assert body == b""


def test_http_keep_alive_survives_a_refused_post(
    server: tuple[MetricsServer, list[Snapshot]],
) -> None:
    metrics, _ = server
    connection = connect(metrics)
    try:
        for _ in range(2):  # keep-alive: one connection, several scrapes
            connection.request("GET", "/metrics")
            response = connection.getresponse()
            assert response.status == 200 and response.read()
        # The unread body of a refused request must not be taken for the next request.
        connection.request("POST", "/metrics", body=b"name=value&more=1")
        response = connection.getresponse()
        assert response.status == 405
        response.read()
        connection.request("GET", "/healthz")
        response = connection.getresponse()
        assert (response.status, response.read()) == (200, b"ok\n")
    finally:
        connection.close()


def test_concurrent_scrapes_each_see_one_whole_snapshot(
    server: tuple[MetricsServer, list[Snapshot]],
) -> None:
    metrics, current = server
    url = f"http://127.0.0.1:{metrics.server_address[1]}/metrics"
    stop = threading.Event()

    def publish() -> None:
        # busbw == algbw == generation within each snapshot; a torn read would show them apart.
        generation = 0
        while not stop.is_set():
            generation += 1
            point = dataclasses.replace(LARGE, busbw=float(generation), algbw=float(generation))
            current[0] = dataclasses.replace(SNAPSHOT, series=(point,))
            time.sleep(0.001)

    def scrape(_: int) -> tuple[int, float, float]:
        with urllib.request.urlopen(url, timeout=10) as response:
            text = response.read().decode()
            status = response.status
        found = {
            family.name: sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if family.name in ("netmon_busbw_bytes_per_second", "netmon_algbw_bytes_per_second")
        }
        return (
            status,
            found["netmon_busbw_bytes_per_second"],
            found["netmon_algbw_bytes_per_second"],
        )

    publisher = threading.Thread(target=publish)
    publisher.start()
    try:
        with ThreadPoolExecutor(max_workers=16) as pool:
            outcomes = list(pool.map(scrape, range(50)))
    finally:
        stop.set()
        publisher.join(timeout=5)
    assert len(outcomes) == 50
    assert all(status == 200 for status, _, _ in outcomes)
    assert all(busbw == algbw for _, busbw, algbw in outcomes)


def test_http_on_ipv6_loopback() -> None:
    try:
        metrics = MetricsServer("::1", 0, make_registry(lambda: SNAPSHOT))
    except OSError as exc:
        pytest.skip(f"no IPv6 loopback here: {exc}")
    thread = metrics.serve_in_thread()
    try:
        connection = http.client.HTTPConnection("::1", metrics.server_address[1], timeout=5)
        connection.request("GET", "/healthz")
        assert connection.getresponse().status == 200
        connection.close()
    finally:
        metrics.shutdown()
        metrics.server_close()
        thread.join(timeout=5)
    assert metrics.address_family == socket.AF_INET6


# --- Results: hand-made probe outcomes in, snapshots, baselines and state out

MIN_SAMPLES = 3
# The M-of-N rule alone, on every size: no settling, no spread margin (tests/test_signal.py);
# the recent level (which a turn needs beside M of N) as short as the M-of-N window.
POLICY = {
    "window": 5,
    "min_samples": MIN_SAMPLES,
    "ratio": 0.8,
    "trigger": 2,
    "of": 3,
    "level_window": 3,
    "settle": 0,
    "spread_k": 0,
    "latency_bound_below": 0,
}


def results_config(tmp_path: Path) -> NetmonConfig:
    return parse_config(
        {
            "backend": "gloo",
            "ranks": 2,
            "state_dir": str(tmp_path),
            "pause_file": str(tmp_path / "pause"),
            "pause_dir": str(tmp_path / "pause.d"),
            "probes": [
                {"name": "small", "sizes": [8, "1K"], "interval": "60s"},
                {"name": "large", "sizes": ["64K"], "interval": "15m", "min_busbw": "1G"},
            ],
            "baseline": POLICY,
        }
    )


def outcome(
    config: NetmonConfig,
    probe: ProbeConfig,
    busbw: float = 10e9,
    failure: ProbeFailure | None = None,
    wall_s: float = 2.0,
    nccl: str | None = None,
) -> ProbeOutcome:
    spec = build_spec(probe, config)
    factor = bus_factor(spec.op, spec.ranks)
    results: tuple[SizeResult, ...] = ()
    if failure is None:
        results = tuple(
            SizeResult(
                op=spec.op,
                size_bytes=size,
                count=size // 4,
                dtype=spec.dtype,
                chunks=1,
                time_s=size / (busbw / factor),
                min_s=size / (busbw / factor),
                p10_s=size / (busbw / factor),
                p90_s=size / (busbw / factor),
                max_s=size / (busbw / factor),
                cv=0.02,
                samples=spec.iters,
                algbw_bytes_per_second=busbw / factor,
                busbw_bytes_per_second=busbw,
                bus_factor=factor,
            )
            for size in spec.sizes
        )
    environment = ProbeEnvironment(
        netmon="0.1.0", backend=spec.backend, ranks=spec.ranks, host="127.0.0.1", nccl=nccl
    )
    return ProbeOutcome(
        spec=spec,
        results=results,
        environment=environment,
        failure=failure,
        started_at=time.time(),
        wall_s=wall_s,
        collective_s=wall_s / 2,
    )


@pytest.fixture
def setup(tmp_path: Path) -> tuple[NetmonConfig, Results, Path]:
    config = results_config(tmp_path)
    state = tmp_path / "b.json"
    return (
        config,
        Results(
            CurrentConfig(config), BaselineKeeper(baseline.BaselineBook(config.baseline), state)
        ),
        state,
    )


def run(results: Results, probe: ProbeConfig, done: ProbeOutcome) -> list[baseline.Verdict]:
    results.started(probe.name)
    return results.finished(probe, done)


def test_results_start_with_zero_counters_and_no_series(
    setup: tuple[NetmonConfig, Results, Path],
) -> None:
    _, results, state = setup
    snapshot = results.snapshot()
    assert snapshot.series == ()
    assert set(snapshot.probes) == {"small", "large"}
    assert snapshot.probes["small"] == ProbeStats(interval_s=60.0)
    assert snapshot.probes["large"].interval_s == 900.0
    assert snapshot.build["version"] == "0.1.0" and not snapshot.paused
    assert not state.exists()


def test_results_of_a_successful_run(setup: tuple[NetmonConfig, Results, Path]) -> None:
    config, results, state = setup
    assert config.probes is not None
    small, large = config.probes
    before = time.time()
    verdicts = run(results, small, outcome(config, small, busbw=10e9, nccl="2.21.5"))
    run(results, large, outcome(config, large, busbw=2e9, wall_s=3.0))

    assert len(verdicts) == 2 and all(v.baseline is None for v in verdicts)
    snapshot = results.snapshot()
    stats = snapshot.probes["small"]
    assert stats.runs == 1 and stats.duration_s == 2.0
    assert stats.busy_seconds == 4.0  # 2 s x 2 CPU ranks
    assert stats.last_success is not None and stats.last_success >= before
    assert stats.last_run == stats.last_success
    assert snapshot.build["nccl"] == "2.21.5"
    keys = [(p.probe, p.size_bytes) for p in snapshot.series]
    assert keys == [("large", 64 << 10), ("small", 8), ("small", 1024)]

    registry = make_registry(results.snapshot)
    point = {
        "probe": "small",
        "op": "all_reduce",
        "size_bytes": "1024",
        "path": "default",
        "ranks": "2",
    }
    assert value(registry, "netmon_busbw_bytes_per_second", **point) == 10e9
    assert value(registry, "netmon_algbw_bytes_per_second", **point) == 10e9  # 2 ranks: factor 1
    assert value(registry, "netmon_latency_seconds", **point) == pytest.approx(1024 / 10e9)
    assert value(registry, "netmon_busbw_threshold_bytes_per_second", **point) is None
    assert value(registry, "netmon_degraded", **point) == 0.0
    point_large = {**point, "probe": "large", "size_bytes": "65536"}
    assert value(registry, "netmon_busbw_threshold_bytes_per_second", **point_large) == 1e9
    assert value(registry, "netmon_probe_runs_total", probe="large") == 1
    assert state.exists()


def test_results_count_failures_by_reason_and_skips(
    setup: tuple[NetmonConfig, Results, Path],
) -> None:
    config, results, _ = setup
    assert config.probes is not None
    small = config.probes[0]
    run(results, small, outcome(config, small))
    first = results.snapshot().probes["small"]
    failures = [
        ProbeFailure(phase="measure", rank=1, cause="timeout", detail="no progress"),
        ProbeFailure(phase="measure", rank=1, cause="timeout", detail="no progress"),
        ProbeFailure(phase="init", rank=0, cause="exit", detail="exit status 1"),
        ProbeFailure(
            phase="warmup", rank=None, cause="cancelled", detail="job", cancel_reason="preempted"
        ),
    ]
    for failure in failures:
        assert run(results, small, outcome(config, small, failure=failure, wall_s=1.0)) == []
    results.skip("small", "paused")
    results.skip("small", "paused")
    results.skip("small", "gpu_busy_process")

    stats = results.snapshot().probes["small"]
    assert stats.runs == 5
    assert stats.failures == {"timeout_measure": 2, "rank_exit": 1, "preempted": 1}
    assert stats.skips == {"paused": 2, "gpu_busy_process": 1}
    assert stats.last_success == first.last_success  # failures do not count as success
    assert stats.last_run is not None and first.last_run is not None
    assert stats.last_run >= first.last_run
    assert stats.busy_seconds == first.busy_seconds + 4 * 1.0 * 2

    registry = make_registry(results.snapshot)
    failed = "netmon_probe_failures_total"
    assert value(registry, failed, probe="small", reason="timeout_measure") == 2
    assert value(registry, failed, probe="small", reason="preempted") == 1
    assert value(registry, failed, probe="small", reason="timeout_spawn") == 0
    assert value(registry, failed, probe="large", reason="timeout_measure") == 0
    assert value(registry, "netmon_probe_skips_total", probe="small", reason="paused") == 2
    assert value(registry, "netmon_probe_skips_total", probe="large", reason="paused") == 0
    # The last good measurement stays exported; its timestamp tells how old it is.
    point = {
        "probe": "small",
        "op": "all_reduce",
        "size_bytes": "8",
        "path": "default",
        "ranks": "2",
    }
    assert value(registry, "netmon_busbw_bytes_per_second", **point) == 10e9


def test_results_learn_a_baseline_then_degrade_and_recover(
    setup: tuple[NetmonConfig, Results, Path],
) -> None:
    config, results, state = setup
    assert config.probes is not None
    large = config.probes[1]
    registry = make_registry(results.snapshot)
    point = {
        "probe": "large",
        "op": "all_reduce",
        "size_bytes": "65536",
        "path": "default",
        "ranks": "2",
    }

    def feed(busbw: float) -> baseline.Verdict:
        (verdict,) = run(results, large, outcome(config, large, busbw=busbw))
        return verdict

    def metric(name: str) -> float | None:
        return value(registry, name, **point)

    for _ in range(MIN_SAMPLES - 1):
        assert feed(10e9).baseline is None
        assert metric("netmon_busbw_baseline_bytes_per_second") is None
    assert feed(10e9).baseline == 10e9  # min_samples reached: the baseline appears
    assert metric("netmon_busbw_baseline_bytes_per_second") == 10e9
    assert metric("netmon_busbw_baseline_ratio") == 1.0
    assert metric("netmon_degraded") == 0.0
    # Young until a window (5) is learned: every result is learned then, for the young check.
    for _ in range(int(POLICY["window"]) - MIN_SAMPLES):
        assert not feed(10e9).degraded

    low = feed(5e9)  # 1 low of the last 3: not yet (trigger 2)
    assert (low.ratio, low.degraded) == (0.5, False)
    assert metric("netmon_degraded") == 0.0
    assert metric("netmon_busbw_baseline_ratio") == 0.5
    assert feed(5e9).degraded  # 2 of the last 3 low
    assert metric("netmon_degraded") == 1.0
    assert metric("netmon_busbw_baseline_bytes_per_second") == 10e9  # lows are not learned

    # 2 good of the last 3 after two, but the results since the fault count once there are
    # `of` of them (3 here): a fault whose next results were back at once (it never held)
    # clears by the third.
    assert all(feed(10e9).degraded for _ in range(2))
    assert not feed(10e9).degraded
    assert metric("netmon_degraded") == 0.0

    # The state file holds the same book, and was written whole (no temporary left behind).
    saved, warning = baseline.load(state, config.baseline)
    assert warning is None
    key = ("large", "all_reduce", 64 << 10, "default", 2)
    verdict = saved.verdict(key)
    assert verdict is not None and verdict.baseline == 10e9 and not verdict.degraded
    document = json.loads(state.read_text())
    assert document["version"] == baseline.STATE_VERSION
    assert [p.name for p in state.parent.iterdir() if p.name.endswith(".tmp")] == []


def test_results_export_the_long_level_and_when_and_how_often_a_series_turned(
    tmp_path: Path,
) -> None:
    """Issue 33: the long level, the reference's maturity, since when a series is degraded (kept
    across a restart) and its episodes (counted from the start) reach /metrics, restored
    verdicts included; the node says its GPU model (cpu on CPU ranks)."""
    document = results_config(tmp_path).model_dump(mode="json", exclude_unset=True)
    document["baseline"] = {**POLICY, "long_window": 3, "clear_window": 3}
    config = parse_config(document)
    assert config.probes is not None
    large = config.probes[1]
    state = tmp_path / "b.json"

    def daemon() -> Results:
        keeper = BaselineKeeper.open(state, config.baseline, {})
        return Results(CurrentConfig(config), keeper)

    results = daemon()
    registry = make_registry(results.snapshot)
    point = {"probe": "large", "op": "all_reduce", "size_bytes": "65536", "path": "default"}
    point["ranks"] = "2"
    assert value(registry, "netmon_node_info", gpu_model="cpu") == 1.0
    for _ in range(MIN_SAMPLES):
        run(results, large, outcome(config, large, busbw=10e9))
    assert value(registry, "netmon_busbw_level_bytes_per_second", **point) == 10e9
    assert value(registry, "netmon_reference_mature", **point) == 0.0  # young: under a day
    assert value(registry, "netmon_degraded_episodes_total", **point) == 0.0
    assert value(registry, "netmon_degraded_since_timestamp_seconds", **point) is None
    (verdict,) = run(results, large, outcome(config, large, busbw=5e9))
    (verdict,) = run(results, large, outcome(config, large, busbw=5e9))
    assert verdict.degraded and verdict.degraded_since is not None
    since = value(registry, "netmon_degraded_since_timestamp_seconds", **point)
    assert since == verdict.degraded_since
    assert value(registry, "netmon_degraded_episodes_total", **point) == 1.0

    # After a restart, before the series is measured again: its verdict as the state kept it.
    restored = make_registry(daemon().snapshot)
    assert value(restored, "netmon_degraded", **point) == 1.0
    assert value(restored, "netmon_degraded_since_timestamp_seconds", **point) == since
    assert value(restored, "netmon_degraded_episodes_total", **point) == 0.0
    assert value(restored, "netmon_busbw_level_bytes_per_second", **point) is not None


def test_a_degraded_verdict_that_does_not_say_since_when_is_degraded_since_the_start() -> None:
    # A state file of an older netmon kept the verdict but not when it turned.
    old = VerdictPoint("large", "all_reduce", MIB, "default", 8, 10e9, True, judged=True)
    registry = make_registry(lambda: Snapshot(restored=(old,), started_at=T0))
    point = dict(zip(SERIES_LABELS, old.labels(), strict=True))
    assert value(registry, "netmon_degraded_since_timestamp_seconds", **point) == T0
    assert value(registry, "netmon_degraded_episodes_total", **point) == 0.0


def test_a_series_that_outgrew_its_reference_says_so_measured_restored_and_forgotten() -> None:
    """netmon_reference_stale follows Verdict.reference_stale on a measured series and on one
    restored from the state file, is 0 where the reference still fits, and a rebaseline
    (forget_verdict) takes it back to 0 with the rest of the verdict."""
    upgraded = baseline.Verdict(
        12e9, 1.2, False, 20, 0, reference=10e9, reference_mature=True, reference_stale=True
    )
    fits = dataclasses.replace(upgraded, reference_stale=False)
    measured = dataclasses.replace(LARGE, path="default", **verdict_fields(upgraded))
    steady = dataclasses.replace(LARGE, path="nv4", **verdict_fields(fits))
    forgotten = forget_verdict(dataclasses.replace(measured, path="pcie"))
    restored = verdict_point(("large", "all_reduce", MIB, "nvls", 8), upgraded)
    snapshot = Snapshot(series=(measured, steady, forgotten), restored=(restored,), started_at=T0)
    registry = make_registry(lambda: snapshot)

    def exported(name: str, point: SeriesPoint | VerdictPoint) -> float | None:
        return value(registry, name, **dict(zip(SERIES_LABELS, point.labels(), strict=True)))

    stale = [exported("netmon_reference_stale", p) for p in (measured, restored, steady)]
    assert stale == [1.0, 1.0, 0.0]
    # Beside netmon_reference_mature, on the same labels: a stale reference is a mature one.
    assert exported("netmon_reference_mature", measured) == 1.0
    assert exported("netmon_reference_stale", forgotten) == 0.0


def test_a_textfile_snapshot_names_no_gpu_model() -> None:
    assert all(f.name != "netmon_node_info" or not f.samples for f in collect(SNAPSHOT))


def test_results_snapshots_are_frozen_values(setup: tuple[NetmonConfig, Results, Path]) -> None:
    config, results, _ = setup
    assert config.probes is not None
    small = config.probes[0]
    before = results.snapshot()
    run(results, small, outcome(config, small))
    assert before.probes["small"].runs == 0 and before.series == ()
    assert results.snapshot().probes["small"].runs == 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        before.paused = True  # type: ignore[misc]


def test_results_report_the_pause_file(setup: tuple[NetmonConfig, Results, Path]) -> None:
    config, results, _ = setup
    registry = make_registry(results.snapshot)
    assert value(registry, "netmon_paused") == 0.0
    assert config.pause_file is not None
    config.pause_file.touch()
    assert results.snapshot().paused
    assert value(registry, "netmon_paused") == 1.0
    config.pause_file.unlink()
    assert value(registry, "netmon_paused") == 0.0


def test_results_survive_an_unwritable_state_file(tmp_path: Path) -> None:
    config = results_config(tmp_path)
    assert config.probes is not None
    small = config.probes[0]
    state = tmp_path / "missing-dir" / "b.json"
    results = Results(
        CurrentConfig(config), BaselineKeeper(baseline.BaselineBook(config.baseline), state)
    )
    run(results, small, outcome(config, small))
    assert results.state_write_errors == 1
    assert results.snapshot().probes["small"].runs == 1
    assert not state.exists()


def test_a_reload_gives_added_probes_zero_counters_and_drops_removed_ones(
    setup: tuple[NetmonConfig, Results, Path],
) -> None:
    config, results, _ = setup
    pairs = {"name": "pairs", "kind": "pairs", "sizes": ["64K"], "interval": "60s", "ranks": 3}
    document = config.model_dump(mode="json", exclude_none=True)
    document["probes"] = [document["probes"][0], pairs]
    results.reconfigure(parse_config(document))
    snapshot = results.snapshot()
    # A pairs probe added by a reload: its skip series exist from 0, as at start.
    assert {reason for (probe, reason) in snapshot.pair_skips if probe == "pairs"} == set(
        PAIR_SKIP_REASONS
    )
    assert all(count == 0 for count in snapshot.pair_skips.values())
    # Inconclusive results are counted for probes judged against a baseline: not pairs probes.
    assert set(snapshot.inconclusive) == {
        ("small", reason) for reason in baseline.INCONCLUSIVE_REASONS
    }
