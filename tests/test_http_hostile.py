"""The HTTP server against hostile or broken clients: a real server on a loopback port, raw sockets,
and a deadline on every wait."""

from __future__ import annotations

import base64
import gzip
import http.client
import select
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import bcrypt
import pytest

from netmon.exposition.collector import make_registry
from netmon.exposition.http import (
    MAX_CONNECTIONS,
    MAX_HEADER_BYTES,
    MAX_REQUEST_LINE,
    MetricsServer,
)
from netmon.exposition.snapshot import Snapshot
from netmon.exposition.webconfig import BasicAuth, WebSecurity
from tests.conftest import wait_for

TIMEOUT = 1.0  # the server's request timeout in these tests


@pytest.fixture
def serve() -> Iterator[Any]:
    servers: list[MetricsServer] = []

    def start(**options: Any) -> int:
        options.setdefault("request_timeout", TIMEOUT)
        server = MetricsServer("127.0.0.1", 0, make_registry(lambda: Snapshot()), **options)
        server.serve_in_thread()
        servers.append(server)
        return int(server.server_address[1])

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


@pytest.fixture
def port(serve: Any) -> int:
    return int(serve())


def exchange(port: int, data: bytes, timeout: float = 5) -> bytes:
    """Sends `data`, then reads until the server closes the connection (or the deadline)."""
    deadline = time.monotonic() + timeout
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(data)
        received = b""
        while time.monotonic() < deadline:
            sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            received += chunk
    return received


def status(response: bytes) -> int:
    return int(response.split(b" ", 2)[1])


def scrape(port: int, timeout: float = 5) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout) as response:
        response.read()
        return int(response.status)


def test_unknown_paths_are_404(port: int) -> None:
    for path in ("/nope", "/metrics/x", "/../etc/passwd", "/%00", "*", "http://x/metrics"):
        request = f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode()
        assert status(exchange(port, request)) == 404, path


def test_every_method_but_get_and_head_is_405(port: int) -> None:
    for method in ("POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE", "CONNECT", "FOO"):
        response = exchange(port, f"{method} /metrics HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        assert status(response) == 405, method
        assert b"\r\nAllow: GET, HEAD\r\n" in response
        assert b"\r\nConnection: close\r\n" in response


def test_malformed_requests_are_400_and_closed(port: int) -> None:
    for line in (
        b"GARBAGE\r\n\r\n",
        b"GET /metrics HTTP/1.1 extra\r\n\r\n",
        b"\x16\x03\x01\r\n\r\n",
    ):
        # A one-word request line reads as HTTP/0.9, whose answer is a body alone.
        assert b"Error code: 400" in exchange(port, line), line


def test_a_request_line_over_the_limit_is_414(port: int) -> None:
    fits = "/" + "a" * (MAX_REQUEST_LINE - 100)
    request = f"GET {fits} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode()
    assert status(exchange(port, request)) == 404  # long, but within the limit
    path = "/" + "a" * MAX_REQUEST_LINE
    response = exchange(port, f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    assert status(response) == 414
    # No newline at all: the server stops reading at the limit, it does not buffer forever.
    assert status(exchange(port, b"GET /" + b"a" * (4 * MAX_REQUEST_LINE))) == 414


def test_headers_over_the_limit_are_431(port: int) -> None:
    one_big = b"X-Big: " + b"a" * MAX_HEADER_BYTES + b"\r\n"
    many = b"".join(b"X-H%d: %s\r\n" % (i, b"a" * 100) for i in range(MAX_HEADER_BYTES // 100))
    for headers in (one_big, many):
        response = exchange(port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n" + headers + b"\r\n")
        assert status(response) == 431
    # Within the limit: served.
    fine = b"".join(b"X-H%d: %s\r\n" % (i, b"a" * 100) for i in range(50))
    request = b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" + fine + b"\r\n"
    assert status(exchange(port, request)) == 200


def test_a_slow_client_is_cut_off_without_blocking_scrapes(port: int) -> None:
    request = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    outcome: list[tuple[float, int, bytes]] = []
    started = time.monotonic()

    def trickle() -> None:
        # One byte per 100 ms: every read is quick, but the request would take 3.6 s in all.
        # Between bytes, wait (select, 100 ms) for the server to answer or hang up.
        sent, answer = 0, b""
        try:
            for byte in request:
                sock.sendall(bytes([byte]))
                sent += 1
                readable, _, _ = select.select([sock], [], [], 0.1)
                if readable:
                    answer = sock.recv(65536)
                    break
        except OSError:
            pass
        outcome.append((time.monotonic() - started, sent, answer))

    trickler = threading.Thread(target=trickle)
    trickler.start()
    try:
        for _ in range(5):  # meanwhile, scrapes are answered at once
            begin = time.monotonic()
            assert scrape(port) == 200
            assert time.monotonic() - begin < TIMEOUT / 2
        trickler.join(15)
        assert not trickler.is_alive()
        elapsed, sent, answer = outcome[0]
        # Hung up on at the request timeout, with no answer, before the request was whole.
        assert answer == b"" and sent < len(request), outcome
        assert TIMEOUT * 0.8 < elapsed < TIMEOUT + 1.5, outcome
    finally:
        sock.close()


def test_a_silent_connection_is_closed_after_the_timeout(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        started = time.monotonic()
        assert sock.recv(1) == b""
        assert time.monotonic() - started < TIMEOUT + 1.0


def test_a_body_on_get_is_ignored(port: int) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        for _ in range(3):  # a small body is read and dropped: the connection carries on
            connection.request("GET", "/metrics", body=b"x=1&y=2")
            response = connection.getresponse()
            assert response.status == 200 and response.read()
            assert response.getheader("Connection") is None
        # A body too large to skip: answered, and the connection closed.
        connection.request("GET", "/healthz", headers={"Content-Length": str(10**9)})
        response = connection.getresponse()
        assert (response.status, response.read()) == (200, b"ok\n")
        assert response.getheader("Connection") == "close"
    finally:
        connection.close()
    chunked = (
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n"
    )
    answer = exchange(port, chunked)
    assert status(answer) == 200 and b"\r\nConnection: close\r\n" in answer
    bad_length = b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: \xb2\r\n\r\n"
    assert status(exchange(port, bad_length)) == 200


def head_of(response: bytes) -> dict[str, str]:
    lines = response.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")[1:]
    return {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines)}


def test_an_accept_header_the_negotiation_cannot_use_gets_the_text_format(port: int) -> None:
    for accept in (
        b"application/openmetrics-text; version=1..0",  # prometheus_client raises on it
        # Folded (obsolete, still parsed): prometheus_client would echo the CR LF and the line
        # after it into the Content-Type, a header of the client's making in our response.
        b"application/openmetrics-text;version=1.0.0.\r\n X-Injected: 1",
    ):
        request = b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\nAccept: " + accept
        response = exchange(port, request + b"\r\nAccept-Encoding: gzip\r\n\r\n")
        assert status(response) == 200, accept
        assert b"X-Injected" not in response.split(b"\r\n\r\n", 1)[0]
        head = head_of(response)
        assert head["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
        assert head["content-encoding"] == "gzip"
        body = gzip.decompress(response.split(b"\r\n\r\n", 1)[1])
        assert b"# TYPE netmon_paused gauge" in body


def test_basic_auth_guards_every_representation(serve: Any) -> None:
    hashed = bcrypt.hashpw(b"pw", bcrypt.gensalt(rounds=4)).decode()
    port = serve(security=WebSecurity(auth=BasicAuth({"prometheus": hashed})))
    prometheus = {
        "Accept": "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5",
        "Accept-Encoding": "gzip",
    }
    for method in ("GET", "HEAD"):
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        try:
            connection.request(method, "/metrics", headers=prometheus)
            refused = connection.getresponse()
            body = refused.read()
            assert refused.status == 401 and refused.getheader("Content-Encoding") is None
            assert body == (b"unauthorized\n" if method == "GET" else b"")
            token = base64.b64encode(b"prometheus:pw").decode()
            connection.request(
                method, "/metrics", headers={**prometheus, "Authorization": f"Basic {token}"}
            )
            allowed = connection.getresponse()
            body = allowed.read()
            assert allowed.status == 200 and allowed.getheader("Content-Encoding") == "gzip"
            assert (allowed.getheader("Content-Type") or "").startswith(
                "application/openmetrics-text; version=1.0.0;"
            )
            if method == "GET":
                assert gzip.decompress(body).endswith(b"# EOF\n")
        finally:
            connection.close()


def test_a_hundred_concurrent_scrapes_are_all_served(port: int) -> None:
    barrier = threading.Barrier(100, timeout=10)
    results: list[int] = []
    lock = threading.Lock()

    def one() -> None:
        barrier.wait()
        code = scrape(port, timeout=10)
        with lock:
            results.append(code)

    threads = [threading.Thread(target=one) for _ in range(100)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert results == [200] * 100


def half_open(port: int, count: int) -> list[socket.socket]:
    """Connections that never send a byte (non-blocking: a full backlog must not stall the test)."""
    sockets = []
    for _ in range(count):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        sock.connect_ex(("127.0.0.1", port))
        sockets.append(sock)
    return sockets


def test_half_open_connections_do_not_stop_scrapes(serve: Any) -> None:
    port = serve(request_timeout=5.0)
    before = threading.active_count()
    flood = half_open(port, MAX_CONNECTIONS // 2)
    try:
        # Every connection was accepted and holds a thread...
        wait_for(
            lambda: threading.active_count() >= before + MAX_CONNECTIONS // 2, 5, "the threads"
        )
        # ...and a scrape is answered at once, long before those connections time out.
        begin = time.monotonic()
        assert scrape(port) == 200
        assert time.monotonic() - begin < 2.5
    finally:
        for sock in flood:
            sock.close()


def test_a_flood_past_the_connection_cap_is_bounded(serve: Any) -> None:
    cap = 8
    port = serve(max_connections=cap)
    before = threading.active_count()
    flood = half_open(port, 5 * cap)
    try:
        peak = 0
        deadline = time.monotonic() + 2 * TIMEOUT
        while time.monotonic() < deadline:
            peak = max(peak, threading.active_count() - before)
            time.sleep(0.01)
        assert 0 < peak <= cap  # never more handler threads than the cap
        # The flood drains at `cap` connections per request timeout; a scrape queued behind it
        # is answered once its turn comes, within a bounded time.
        begin = time.monotonic()
        assert scrape(port, timeout=15) == 200
        assert time.monotonic() - begin < 5 * TIMEOUT + 3
    finally:
        for sock in flood:
            sock.close()


def test_shutdown_is_prompt_with_the_cap_exhausted() -> None:
    server = MetricsServer(
        "127.0.0.1", 0, make_registry(lambda: Snapshot()), request_timeout=30, max_connections=2
    )
    thread = server.serve_in_thread()
    flood = half_open(int(server.server_address[1]), 6)
    try:
        wait_for(lambda: server._slots._value == 0, 5, "the cap to be reached")  # type: ignore[attr-defined]
        begin = time.monotonic()
        server.shutdown()
        server.server_close()
        thread.join(5)
        assert not thread.is_alive()
        assert time.monotonic() - begin < 2
    finally:
        for sock in flood:
            sock.close()
