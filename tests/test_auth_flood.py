"""Basic auth that a flood of wrong passwords cannot starve (issue 44, item 6): bcrypt checks
bounded in number and in waiting, failures limited per client, a cached scrape never behind them.

The unit tests hold bcrypt still with an event, so they measure nothing; the two daemon tests are
the issue's reproductions against `netmon serve` with a bcrypt hash of cost 12, the attacker an
asyncio process of its own (700 coroutines, not 700 threads, and not in the test's interpreter).
"""

from __future__ import annotations

import base64
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import bcrypt
import pytest
import yaml

from netmon.exposition.webconfig import BasicAuth, Verdict, WebSecurity
from tests.conftest import wait_for
from tests.daemon_harness import DaemonProcess, fast_config
from tests.test_http_hostile import exchange, head_of, status

PASSWORD = b"scrape me"
CHEAP = bcrypt.hashpw(PASSWORD, bcrypt.gensalt(rounds=4)).decode()


def header(user: str, password: bytes) -> str:
    return "Basic " + base64.b64encode(user.encode() + b":" + password).decode()


GOOD, WRONG = header("prometheus", PASSWORD), header("prometheus", b"guess")


class HeldBcrypt:
    """bcrypt.checkpw that waits for `release` on wrong passwords: slots stay taken on demand."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.real = bcrypt.checkpw
        self.release = threading.Event()
        self.waiting = 0
        self.calls = 0
        self._lock = threading.Lock()
        monkeypatch.setattr(bcrypt, "checkpw", self)

    def __call__(self, password: bytes, hashed: bytes) -> bool:
        with self._lock:
            self.calls += 1
            self.waiting += password != PASSWORD
        if password != PASSWORD:
            assert self.release.wait(30), "never released"
        return bool(self.real(password, hashed))


def test_a_cached_scrape_never_waits_and_an_uncached_guess_waits_a_bounded_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    auth = BasicAuth({"prometheus": CHEAP}, checks=2, wait_s=0.3)
    assert auth.verify(GOOD, "10.0.0.1") is Verdict.OK  # checked once, now cached
    held = HeldBcrypt(monkeypatch)
    guesses = [threading.Thread(target=auth.verify, args=(WRONG, "10.0.0.9")) for _ in range(2)]
    for thread in guesses:
        thread.start()
    try:
        wait_for(lambda: held.waiting == 2, 10, "two guesses to take both bcrypt slots")
        # Both slots held: the cached scrape is answered without one (it used to queue behind).
        assert auth.verify(GOOD, "10.0.0.1") is Verdict.OK
        # A third guess waits for a slot only so long, then is refused unchecked.
        begin = time.monotonic()
        assert auth.verify(WRONG, "10.0.0.9") is Verdict.BUSY
        assert 0.3 <= time.monotonic() - begin < 10
        assert held.calls == 2 and auth.refused[Verdict.BUSY] == 1
    finally:
        held.release.set()
        for thread in guesses:
            thread.join(10)
    assert auth.verify(WRONG, "10.0.0.9") is Verdict.DENIED  # the slots are back


def test_failed_attempts_are_limited_per_client_by_a_token_bucket(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    now = [100.0]
    auth = BasicAuth({"prometheus": CHEAP}, burst=3, interval_s=2.0, clock=lambda: now[0], wait_s=5)
    held = HeldBcrypt(monkeypatch)
    held.release.set()
    assert [auth.verify(WRONG, "10.0.0.9") for _ in range(4)] == [Verdict.DENIED] * 3 + [
        Verdict.LIMITED
    ]
    assert held.calls == 3  # the fourth guess cost no bcrypt
    assert auth.verify(WRONG, "10.0.0.8") is Verdict.DENIED  # another address has its own
    assert auth.verify(GOOD, "10.0.0.1") is Verdict.OK
    now[0] += 2.0  # one interval: one more attempt
    assert [auth.verify(WRONG, "10.0.0.9") for _ in range(2)] == [Verdict.DENIED, Verdict.LIMITED]
    # A header without credentials costs nothing and spends nothing.
    assert auth.verify("Bearer x", "10.0.0.7") is Verdict.DENIED
    assert auth.verify(None, "10.0.0.7") is Verdict.DENIED
    assert [auth.verify(WRONG, "10.0.0.7") for _ in range(3)] == [Verdict.DENIED] * 3
    # Refusals are said, at most once a minute: a flood does not flood the log.
    warnings = [r.getMessage() for r in caplog.records if "refusing unchecked" in r.getMessage()]
    assert len(warnings) == 1 and "0 with bcrypt busy, 1 over a client's rate" in warnings[0]
    now[0] += 60.0
    for _ in range(5):
        auth.verify(WRONG, "10.0.0.7")
    warnings = [r.getMessage() for r in caplog.records if "refusing unchecked" in r.getMessage()]
    assert len(warnings) == 2 and "0 with bcrypt busy, 3 over" in warnings[1], warnings


@pytest.fixture
def limited_server() -> Iterator[int]:
    from netmon.exposition.collector import make_registry
    from netmon.exposition.http import MetricsServer
    from netmon.exposition.snapshot import Snapshot

    auth = BasicAuth({"prometheus": CHEAP}, burst=1, interval_s=600)
    server = MetricsServer(
        "127.0.0.1",
        0,
        make_registry(lambda: Snapshot()),
        security=WebSecurity(auth=auth),
        request_timeout=2.0,
    )
    server.serve_in_thread()
    yield int(server.server_address[1])
    server.shutdown()
    server.server_close()


def test_a_refused_guess_is_429_and_closed_and_a_post_body_is_dropped_first(
    limited_server: int,
) -> None:
    request = f"GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: {WRONG}\r\n\r\n".encode()
    closing = request.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n")
    assert status(exchange(limited_server, closing)) == 401
    second = exchange(limited_server, request)  # not asked to close: the server closes it
    assert status(second) == 429
    head = head_of(second)
    assert head["connection"] == "close" and head["retry-after"] == "1"
    post = closing.replace(b"GET /metrics", b"POST /sweep").replace(
        b"\r\n\r\n", b"\r\nContent-Length: 3\r\n\r\nabc"
    )
    assert status(exchange(limited_server, post)) == 404  # no inbox: not even asked
    good = closing.replace(WRONG.encode(), GOOD.encode())
    # The same address is refused even with the right password, which it has not shown before:
    # it is not checked (docs/SECURITY.md: a Prometheus already checked is cached, so unaffected).
    assert status(exchange(limited_server, good)) == 429


# --- the real daemon, bcrypt cost 12

# The attacker: `burst` sends N wrong-password requests on N sockets at once and closes each as
# soon as it is written; `flood` keeps N clients guessing (connect, send, read the status, close,
# again) until the time is up. It prints how many answers of each status it saw.
ATTACKER = r"""
import asyncio, collections, sys, time
port, clients, seconds, mode, token = sys.argv[1:6]
clients, seconds = int(clients), float(seconds)
request = ("GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: " + token + "\r\n\r\n").encode()
seen = collections.Counter()

async def connect():
    return await asyncio.wait_for(asyncio.open_connection("127.0.0.1", int(port)), 15)

async def once():
    try:
        reader, writer = await connect()
        writer.write(request)
        await writer.drain()
        writer.close()
        seen["sent"] += 1
    except (OSError, asyncio.TimeoutError) as exc:
        seen[type(exc).__name__] += 1

async def guess(end):
    while time.monotonic() < end:
        writer = None
        try:
            reader, writer = await connect()
            writer.write(request)
            await writer.drain()
            line = await asyncio.wait_for(reader.readline(), 15)
            seen[line[9:12].decode() or "closed"] += 1
        except (OSError, asyncio.TimeoutError) as exc:
            seen[type(exc).__name__] += 1
            await asyncio.sleep(0.1)
        finally:
            if writer is not None:
                writer.close()

async def main():
    end = time.monotonic() + seconds
    await asyncio.gather(*(once() if mode == "burst" else guess(end) for _ in range(clients)))

asyncio.run(main())
print(dict(seen), flush=True)
"""


@pytest.fixture(scope="module")
def costly_hash() -> str:
    return bcrypt.hashpw(PASSWORD, bcrypt.gensalt(rounds=12)).decode()


@pytest.fixture
def guarded(tmp_path: Path, costly_hash: str) -> Iterator[DaemonProcess]:
    web = tmp_path / "web.yml"
    web.write_text(yaml.safe_dump({"basic_auth_users": {"prometheus": costly_hash}}))
    # One small probe, rarely: the daemon's own threads stay few and steady.
    probes = [{"name": "small", "sizes": [8], "interval": "10m", "iters": 1, "warmup": 1}]
    daemon = DaemonProcess(
        tmp_path, fast_config(tmp_path, probes=probes), args=("--web-config", str(web))
    )
    try:
        yield daemon
    finally:
        daemon.kill_all()


def timed_scrape(port: int, timeout: float = 5.0) -> float:
    """Seconds a scrape with the right password took; fails past `timeout`."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/metrics", headers={"Authorization": GOOD}
    )
    begin = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            response.read()
            assert response.status == 200
    except (urllib.error.URLError, TimeoutError) as exc:
        raise AssertionError(
            f"a legitimate scrape failed after {time.monotonic() - begin:.1f} s: {exc!r}"
        ) from None
    return time.monotonic() - begin


def threads_of(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    raise AssertionError("no Threads: line")


def attack(port: int, mode: str, clients: int, seconds: float) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", ATTACKER, str(port), str(clients), str(seconds), mode, WRONG],
        stdout=subprocess.PIPE,
        text=True,
    )


def scrape_while(daemon: DaemonProcess, seconds: float) -> tuple[list[float], int]:
    """Scrapes every half second for `seconds`: how long each took (every one under 5 s), and
    the most threads the daemon had at those moments."""
    took, peak = [], 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        took.append(timed_scrape(daemon.port))
        peak = max(peak, threads_of(daemon.proc.pid))
        time.sleep(0.5)
    return took, peak


def test_a_burst_of_guesses_past_the_connection_cap_does_not_block_a_cached_scrape(
    guarded: DaemonProcess,
) -> None:
    from netmon.exposition.http import MAX_CONNECTIONS

    timed_scrape(guarded.port, timeout=60)  # the one bcrypt check of the right password
    burst = attack(guarded.port, "burst", MAX_CONNECTIONS + 88, 0)
    out, _ = burst.communicate(timeout=120)
    assert "'sent'" in out, out
    # The issue asks for 30 s of scrapes; 10 s show the same: the guesses queued before the
    # first scrape are what blocked it (for ~27 s), and no more arrive after.
    took, _ = scrape_while(guarded, 10)
    assert len(took) >= 3 and max(took) < 5, took
    print(f"{out.strip()}; scrapes {len(took)}, slowest {max(took):.2f} s")  # docs/SECURITY.md


def test_700_guessing_clients_neither_starve_scrapes_nor_leave_threads(
    guarded: DaemonProcess,
) -> None:
    timed_scrape(guarded.port, timeout=60)
    normal = threads_of(guarded.proc.pid)
    # 12 s rather than the 30: the queue of guesses reaches its steady state (every slot
    # taken, clients refused and reconnecting) within the first seconds, and what is measured,
    # each scrape's time and the threads left after, does not grow with the flood's length.
    flood = attack(guarded.port, "flood", 700, 12)
    try:
        took, peak = scrape_while(guarded, 12)
        out, _ = flood.communicate(timeout=60)
    finally:
        if flood.poll() is None:
            flood.kill()
            flood.wait()
    assert max(took) < 5, took
    assert "'429'" in out, out  # refused unchecked, not queued
    ended = time.monotonic()
    wait_for(lambda: threads_of(guarded.proc.pid) <= normal + 8, 10, f"threads back to {normal}")
    drained = time.monotonic() - ended
    print(f"scrapes {len(took)}, slowest {max(took):.2f} s; threads {normal} -> {peak}, back in")
    print(f"{drained:.1f} s; the attacker saw {out.strip()}")  # the figures in docs/SECURITY.md
