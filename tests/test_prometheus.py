"""A real Prometheus scrapes a real daemon; netmon's numbers come back through its HTTP API."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import wait_for
from tests.daemon_harness import DaemonProcess, fast_config
from tests.prometheus_harness import Prometheus


def test_prometheus_scrapes_busbw_from_the_daemon(tmp_path: Path) -> None:
    daemon = DaemonProcess(tmp_path, fast_config(tmp_path))
    prometheus = None
    try:
        prometheus = Prometheus(tmp_path, [f"127.0.0.1:{daemon.port}"])
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
    finally:
        if prometheus is not None:
            prometheus.stop()
        assert daemon.stop() == 0
