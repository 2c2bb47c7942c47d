"""A real Prometheus scrapes a real daemon; netmon's numbers come back through its HTTP API."""

from __future__ import annotations

import re
import urllib.request
from pathlib import Path

from tests.conftest import wait_for
from tests.daemon_harness import DaemonProcess, fast_config
from tests.prometheus_harness import Prometheus
from tests.test_negotiation import parse_openmetrics

# The daemon's debug line for each /metrics answer: status, bytes sent, Content-Type, encoding.
ANSWER = re.compile(r'"GET /metrics HTTP/1\.1" 200, (\d+) bytes, ([^,]+), (\S+)$', re.MULTILINE)


def test_prometheus_scrapes_busbw_from_the_daemon(tmp_path: Path) -> None:
    # At debug the daemon logs what it sent each scrape: the gzip check below reads it.
    daemon = DaemonProcess(tmp_path, fast_config(tmp_path, logging={"level": "debug"}))
    prometheus = None
    try:
        # extra-scrape-metrics: scrape_body_size_bytes, the body Prometheus parsed, after gzip.
        prometheus = Prometheus(
            tmp_path, [f"127.0.0.1:{daemon.port}"], features=("extra-scrape-metrics",)
        )
        prom = prometheus
        result = wait_for(
            lambda: prom.query('netmon_busbw_bytes_per_second{probe="large"}'),
            90,
            "netmon_busbw_bytes_per_second in Prometheus",
            poll=0.5,
        )
        sample = result[0]
        assert sample["metric"]["job"] == "netmon"
        assert sample["metric"]["size_bytes"] == "65536"
        assert float(sample["value"][1]) > 0
        up = prom.query('up{job="netmon"}')
        assert float(up[0]["value"][1]) == 1.0
        (target,) = prom.api("targets", state="active")["activeTargets"]
        assert (target["health"], target["lastError"]) == ("up", "")

        # OpenMetrics, seen by Prometheus: it files a family's metadata under the name of its
        # TYPE line, which OpenMetrics gives a counter without _total and the text format with.
        job = {"match_target": '{job="netmon"}'}
        runs = prom.api("targets/metadata", metric="netmon_probe_runs", **job)
        assert [entry["type"] for entry in runs] == ["counter"]
        assert prom.api("targets/metadata", metric="netmon_probe_runs_total", **job) == []

        # gzip: every scrape was answered gzipped in OpenMetrics 1.0.0, and what the daemon sent
        # is a fraction of the body Prometheus parsed (scrape_body_size_bytes is decompressed).
        answers = ANSWER.findall(daemon.log())
        assert answers
        for _, content_type, encoding in answers:
            assert content_type.startswith("application/openmetrics-text; version=1.0.0;")
            assert encoding == "gzip"
        (parsed,) = prom.query('max_over_time(scrape_body_size_bytes{job="netmon"}[10m])')
        assert max(int(sent) for sent, _, _ in answers) * 2 < float(parsed["value"][1])

        # The live daemon's registry in OpenMetrics passes prometheus_client's strict parser too.
        request = urllib.request.Request(
            f"http://127.0.0.1:{daemon.port}/metrics",
            headers={"Accept": "application/openmetrics-text; version=1.0.0"},
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            page = response.read().decode()
        names = {family.name for family in parse_openmetrics(page)}
        assert {"netmon_busbw_bytes_per_second", "netmon_probe_runs", "netmon_build_info"} <= names
    finally:
        if prometheus is not None:
            prometheus.stop()
        assert daemon.stop() == 0
