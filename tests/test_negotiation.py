"""/metrics in the format and encoding a scraper accepts: the choice from literal headers, the
OpenMetrics rendering of every family netmon exports, and the real server on a loopback port."""

from __future__ import annotations

import gzip
import http.client
from collections.abc import Iterable, Iterator

import pytest
from prometheus_client import generate_latest
from prometheus_client.core import Metric
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families

from netmon.exposition.collector import MAX_CACHED_FORMATS, SnapshotPage, make_registry
from netmon.exposition.formats import TEXT, Format, negotiate
from netmon.exposition.http import MetricsServer
from netmon.exposition.snapshot import Snapshot
from tests.test_exporter import FULL_SNAPSHOT

# What Prometheus 2.42 (Debian's, which the tests run) sends on every scrape, with
# "Accept-Encoding: gzip" (scrape/scrape.go, scrapeAcceptHeader).
PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;"
    "q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)
OPENMETRICS = "application/openmetrics-text; version=1.0.0"


def media_type(content_type: str) -> tuple[str, dict[str, str]]:
    """The media type and its parameters (none of ours is quoted)."""
    kind, *params = (part.strip() for part in content_type.split(";"))
    return kind, dict(param.split("=", 1) for param in params)


def parse_openmetrics(text: str) -> list[Metric]:
    """prometheus_client's OpenMetrics parser (untyped), which is strict where its text parser
    is lenient: it refuses a missing # EOF, a counter sample without _total, a unit that is not
    the name's suffix, a family declared twice."""
    return list(openmetrics_families(text))  # type: ignore[no-untyped-call]


def samples_of(families: Iterable[Metric]) -> set[tuple[str, tuple[tuple[str, str], ...], float]]:
    return {
        (s.name, tuple(sorted(s.labels.items())), s.value)
        for family in families
        for s in family.samples
    }


# --- the choice, from literal headers


@pytest.mark.parametrize(
    "accept",
    [
        PROMETHEUS_ACCEPT,
        # Newer Prometheus servers weigh every entry, OpenMetrics 1.0.0 still first.
        "application/openmetrics-text;version=1.0.0;q=0.5,application/openmetrics-text;"
        "version=0.0.1;q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2",
        OPENMETRICS,
    ],
)
def test_prometheus_gets_openmetrics_1_0_0(accept: str) -> None:
    chosen = negotiate(accept, "gzip")
    kind, params = media_type(chosen.content_type)
    assert kind == "application/openmetrics-text"
    assert params["version"] == "1.0.0" and params["charset"] == "utf-8"
    assert chosen.gzip


@pytest.mark.parametrize(
    "accept",
    [None, "", "text/plain;version=0.0.4", "*/*", "application/json", "text/html,*/*;q=0.8"],
)
def test_no_known_preference_gets_the_text_format_0_0_4(accept: str | None) -> None:
    chosen = negotiate(accept, None)
    assert chosen == TEXT and chosen.content_type == CONTENT_TYPE_PLAIN_0_0_4 and not chosen.gzip


@pytest.mark.parametrize(
    ("accept_encoding", "gzipped"),
    [(None, False), ("", False), ("gzip", True), ("deflate, GZIP;q=1.0", True), ("br", False)],
)
def test_gzip_only_when_accepted(accept_encoding: str | None, gzipped: bool) -> None:
    assert negotiate(OPENMETRICS, accept_encoding).gzip is gzipped


def test_an_unreadable_or_unsendable_accept_gets_the_text_format() -> None:
    # prometheus_client compares the version's parts with numbers and raises on these...
    for version in ("1..0", "abc", "1.x"):
        chosen = negotiate(f"application/openmetrics-text; version={version}", "gzip")
        assert chosen == Format(CONTENT_TYPE_PLAIN_0_0_4, gzip=True)
    # ...and echoes this one, CR LF included (a folded header line), into the Content-Type.
    folded = "application/openmetrics-text;version=1.0.0.\r\n X-Injected: 1"
    assert negotiate(folded, None) == TEXT


# --- OpenMetrics, for every family netmon exports


def test_every_family_renders_as_valid_openmetrics_with_the_same_samples() -> None:
    registry = make_registry(lambda: FULL_SNAPSHOT)
    body = negotiate(OPENMETRICS, None).render(registry).decode()
    assert body.endswith("\n# EOF\n")
    families = parse_openmetrics(body)
    text = generate_latest(registry).decode()
    assert samples_of(families) == samples_of(text_string_to_metric_families(text))
    counters = {f.name for f in families if f.type == "counter"}
    assert "netmon_probe_runs" in counters  # OpenMetrics names the family without _total
    assert {f.name for f in families} >= {"netmon_build_info", "netmon_busbw_bytes_per_second"}


# --- the real server


@pytest.fixture
def served() -> Iterator[tuple[MetricsServer, SnapshotPage]]:
    page = SnapshotPage(lambda: FULL_SNAPSHOT)
    server = MetricsServer("127.0.0.1", 0, page)
    thread = server.serve_in_thread()
    try:
        yield server, page
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
    assert not thread.is_alive()


def get(
    server: MetricsServer, path: str = "/metrics", method: str = "GET", **headers: str
) -> tuple[http.client.HTTPResponse, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=10)
    try:
        names = {"accept": "Accept", "encoding": "Accept-Encoding"}
        connection.request(method, path, headers={names[k]: v for k, v in headers.items()})
        response = connection.getresponse()
        return response, response.read()
    finally:
        connection.close()


def test_openmetrics_when_asked_and_text_0_0_4_otherwise(
    served: tuple[MetricsServer, SnapshotPage],
) -> None:
    server, _ = served
    response, body = get(server, accept=OPENMETRICS)
    assert response.status == 200
    kind, params = media_type(response.getheader("Content-Type", ""))
    assert (kind, params["version"], params["charset"]) == (
        "application/openmetrics-text",
        "1.0.0",
        "utf-8",
    )
    assert body.endswith(b"\n# EOF\n") and response.getheader("Content-Encoding") is None
    assert response.getheader("Vary") == "Accept, Accept-Encoding"
    assert parse_openmetrics(body.decode())

    response, body = get(server)
    assert response.getheader("Content-Type") == CONTENT_TYPE_PLAIN_0_0_4
    assert body == generate_latest(make_registry(lambda: FULL_SNAPSHOT))
    assert b"# EOF" not in body and response.getheader("Content-Encoding") is None


def test_gzip_when_accepted_decompresses_to_the_same_exposition(
    served: tuple[MetricsServer, SnapshotPage],
) -> None:
    server, _ = served
    for accept in (OPENMETRICS, PROMETHEUS_ACCEPT, "text/plain;version=0.0.4"):
        plain_response, plain = get(server, accept=accept)
        response, body = get(server, accept=accept, encoding="gzip")
        assert response.getheader("Content-Encoding") == "gzip", accept
        assert int(response.getheader("Content-Length", "-1")) == len(body)
        assert gzip.decompress(body) == plain and len(body) < len(plain) / 4, accept
        assert response.getheader("Content-Type") == plain_response.getheader("Content-Type")
        assert response.getheader("Vary") == "Accept, Accept-Encoding"


def test_head_sends_the_headers_get_would(served: tuple[MetricsServer, SnapshotPage]) -> None:
    server, _ = served
    for encoding in ("gzip", "identity"):
        got, body = get(server, accept=PROMETHEUS_ACCEPT, encoding=encoding)
        head, nothing = get(server, method="HEAD", accept=PROMETHEUS_ACCEPT, encoding=encoding)
        assert nothing == b"" and body
        for name in ("Content-Type", "Content-Encoding", "Content-Length", "Vary"):
            assert head.getheader(name) == got.getheader(name), (encoding, name)


def test_other_paths_are_not_negotiated(served: tuple[MetricsServer, SnapshotPage]) -> None:
    server, _ = served
    response, body = get(server, "/healthz", accept=OPENMETRICS, encoding="gzip")
    assert (response.status, body) == (200, b"ok\n")
    assert response.getheader("Content-Encoding") is None and response.getheader("Vary") is None


def test_a_registry_page_negotiates_as_the_snapshot_page_does(
    served: tuple[MetricsServer, SnapshotPage],
) -> None:
    cached, _ = served
    server = MetricsServer("127.0.0.1", 0, make_registry(lambda: FULL_SNAPSHOT))
    thread = server.serve_in_thread()
    try:
        for accept in (PROMETHEUS_ACCEPT, "text/plain"):
            response, body = get(server, accept=accept, encoding="gzip")
            expected, reference = get(cached, accept=accept, encoding="gzip")
            assert response.getheader("Content-Type") == expected.getheader("Content-Type")
            assert response.getheader("Content-Encoding") == "gzip"
            assert gzip.decompress(body) == gzip.decompress(reference)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def test_each_representation_is_rendered_once_per_snapshot_and_the_cache_is_bounded(
    served: tuple[MetricsServer, SnapshotPage],
) -> None:
    server, page = served
    for _ in range(3):
        for accept, encoding in ((PROMETHEUS_ACCEPT, "gzip"), (OPENMETRICS, "gzip"), ("", "")):
            assert get(server, accept=accept, encoding=encoding)[0].status == 200
    # Prometheus' Accept and the bare one name the same format: two representations, not three.
    assert page.renders == 2
    # A client inventing versions fills the cache once; past that it costs a render a scrape.
    odd = [f"{OPENMETRICS[:-1]}{n}" for n in range(1, 2 * MAX_CACHED_FORMATS)]  # 1.0.1, 1.0.2...
    for _ in range(2):
        for accept in odd:
            assert get(server, accept=accept)[0].status == 200
    kept = MAX_CACHED_FORMATS - 2
    assert page.renders == 2 + kept + 2 * (len(odd) - kept)


def test_a_new_snapshot_is_rendered_again_in_every_representation() -> None:
    current = [FULL_SNAPSHOT]
    page = SnapshotPage(lambda: current[0])
    for accept in ("", OPENMETRICS):
        page(negotiate(accept, "gzip"))
    assert page.renders == 2
    current[0] = Snapshot()
    body = gzip.decompress(page(negotiate(OPENMETRICS, "gzip"))).decode()
    assert page.renders == 3 and "netmon_busbw_bytes_per_second{" not in body
