"""A collector that fails costs its own families only: the scrape still answers 200 with every other
family, netmon_scrape_collector_success says which collector failed, and the log says why, once."""

from __future__ import annotations

import dataclasses
import logging
import urllib.request
from collections.abc import Iterator
from typing import cast

import pytest
from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families

from netmon.exposition import collector
from netmon.exposition.catalogue import CATALOGUE
from netmon.exposition.collector import (
    COLLECTORS,
    FailureLog,
    SnapshotPage,
    make_registry,
)
from netmon.exposition.families import family
from netmon.exposition.http import MetricsServer
from netmon.exposition.snapshot import Snapshot
from netmon.gpu.linkhealth import LinkHealth
from tests.test_exporter import FULL_SNAPSHOT

SUCCESS = "netmon_scrape_collector_success"


class BrokenReading:
    """Link health whose every attribute raises, as a reader's bug would."""

    def __getattr__(self, name: str) -> object:
        raise RuntimeError(f"cannot read {name}")


def scrape(snapshot: Snapshot) -> dict[str, Metric]:
    server = MetricsServer("127.0.0.1", 0, SnapshotPage(lambda: snapshot))
    thread = server.serve_in_thread()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            assert response.status == 200
            text = response.read().decode()
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
    return {f.name: f for f in text_string_to_metric_families(text)}


def success(found: dict[str, Metric]) -> dict[str, float]:
    return {s.labels["collector"]: s.value for s in found[SUCCESS].samples}


def names_of(collector: str) -> set[str]:
    return {f.name for f in CATALOGUE if f.collector == collector}


def test_a_broken_reading_fails_its_collector_and_the_scrape_goes_on(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level(logging.ERROR, logger="netmon.exposition.collector")
    monkeypatch.setattr(collector, "FAILURES", FailureLog())  # no minute left by another test
    broken = dataclasses.replace(FULL_SNAPSHOT, link_health=cast(LinkHealth, BrokenReading()))
    found = scrape(broken)

    assert success(found) == {name: 0.0 if name == "link_health" else 1.0 for name in COLLECTORS}
    assert not names_of("link_health") & set(found)
    for name in COLLECTORS:
        if name != "link_health":
            assert names_of(name) <= set(found), name
    assert found["netmon_busbw_bytes_per_second"].samples  # with their values, not just HELP
    errors = [r for r in caplog.records if "collector link_health failed" in r.getMessage()]
    assert len(errors) == 1 and errors[0].exc_info is not None
    assert "cannot read pcie" in caplog.text


def test_a_collector_that_fails_half_way_exports_none_of_its_families() -> None:
    def half(snapshot: Snapshot) -> Iterator[Metric]:
        made = family("netmon_link_busbw_bytes_per_second", snapshot)
        made.add_metric(["p", "8", "0", "1", "NV18"], 1.0)
        yield made
        raise ValueError("the second family cannot be built")

    registry = make_registry(lambda: FULL_SNAPSHOT, {**COLLECTORS, "pairs": half})
    found = {f.name: f for f in registry.collect()}
    assert "netmon_link_busbw_bytes_per_second" not in found
    assert registry.get_sample_value(SUCCESS, {"collector": "pairs"}) == 0.0
    assert registry.get_sample_value(SUCCESS, {"collector": "series"}) == 1.0
    assert registry.get_sample_value("netmon_paused") == 1.0


def test_every_collector_is_listed_when_all_succeed() -> None:
    found = scrape(FULL_SNAPSHOT)
    assert success(found) == dict.fromkeys(COLLECTORS, 1.0)
    # With nothing to export (no NVML reading, no group) a collector still succeeds.
    assert success(scrape(Snapshot())) == dict.fromkeys(COLLECTORS, 1.0)


def test_a_failing_collector_is_logged_at_most_once_a_minute(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.ERROR, logger="netmon.exposition.collector")
    now = [1000.0]
    failures = FailureLog(every=60.0, clock=lambda: now[0])

    def fail(collector: str) -> None:
        try:
            raise RuntimeError("boom")
        except RuntimeError:
            failures.failed(collector)

    for _ in range(5):
        fail("pairs")
        now[0] += 10.0
    fail("series")  # another collector has its own minute
    assert [r.getMessage() for r in caplog.records] == [
        "collector pairs failed; its families are left out of /metrics",
        "collector series failed; its families are left out of /metrics",
    ]
    now[0] += 60.0
    fail("pairs")
    assert caplog.records[-1].getMessage() == (
        "collector pairs failed (4 more failures since the last report); "
        "its families are left out of /metrics"
    )
