"""The daemon's side of cluster sweeps: what the inbox accepts of a sealed report (pure, literal
inputs), the state it keeps on disk, POST /sweep on the real HTTP server, and a real `netmon
serve` that takes reports from `netmon sweep`'s own delivery, exports them and keeps them across
a restart."""

from __future__ import annotations

import base64
import json
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import bcrypt
import pytest
import yaml

from netmon.exposition.http import MAX_POST_BODY, MetricsServer
from netmon.exposition.snapshot import SweepView
from netmon.exposition.webconfig import BasicAuth, WebSecurity
from netmon.group.auth import Sealer
from netmon.serve.sweep_inbox import STATE_FILE, SweepInbox, load, node_names
from netmon.sweep.delivery import inbox
from netmon.sweep.delivery.deliver import deliver
from netmon.sweep.delivery.inbox import SweepState, accept
from netmon.sweep.delivery.node_report import (
    MAX_RESULTS,
    SEAL_GROUP,
    NodeReport,
    PeerResult,
    seal_key,
)
from tests.conftest import wait_for
from tests.daemon_harness import DaemonProcess, fast_config, secret_file, series
from tests.test_http_hostile import exchange, status

BENCH_ALERTS = Path(__file__).resolve().parent.parent / "bench" / "sweep_alerts.py"

SECRET_TEXT = "netmon-test-sweep-secret-0123456789"
SECRET = SECRET_TEXT.encode()
NOW = 1_700_000_000.0
NAMES = ("n1", "n1.cluster")


def sweep_id(at: float, tail: str = "00abcd") -> str:
    return f"{int(at * 1000):013d}-{tail}"


def report(
    node: str = "n1", at: float = NOW, suspect: bool = False, peers: tuple[str, ...] = ()
) -> NodeReport:
    """A two-round sweep: rail 0 and 1 with n2 (rail 1 failed), then preempted with n3."""
    return NodeReport(
        sweep=sweep_id(at - 600),
        node=node,
        at=at,
        finished_at=at - 5,
        results=(
            PeerResult(
                peer="n2",
                rail=0,
                round=1,
                outcome="pass",
                busbw=20e9,
                expected=20e9,
                ratio=1.0,
                measured_at=at - 300,
            ),
            PeerResult(
                peer="n2",
                rail=1,
                round=1,
                outcome="fail",
                busbw=5e9,
                expected=20e9,
                ratio=0.25,
                measured_at=at - 300,
            ),
            PeerResult(peer="n3", rail=0, round=2, outcome="preempted", measured_at=at - 60),
        ),
        suspect=suspect,
        suspect_peers=peers,
    )


def seal(body: NodeReport | dict[str, Any], secret: bytes = SECRET, key: str | None = None) -> str:
    document = body.model_dump(mode="json") if isinstance(body, NodeReport) else body
    return Sealer(SEAL_GROUP, secret).seal(seal_key(key or str(document["node"])), document)


# --- what the inbox accepts (pure)


def test_a_report_sealed_for_this_node_is_accepted_under_either_of_its_names() -> None:
    sent = report()
    assert accept(seal(sent), SECRET, NAMES, NOW + 1, None) == sent
    full = report(node="n1.cluster")
    assert accept(seal(full), SECRET, NAMES, NOW, sweep_id(NOW - 3600)) == full


def _tampered() -> str:
    mac, _, payload = seal(report()).partition(".")
    return f"{mac}.{payload.replace('20000000000.0', '90000000000.0', 1)}"


def _with(**changes: Any) -> dict[str, Any]:
    return {**report().model_dump(mode="json"), **changes}


REFUSED: dict[str, tuple[Callable[[], str], str | None, type[inbox.InboxError], int]] = {
    # name: (the sealed text, the last sweep accepted, the error, its HTTP status)
    "another secret": (
        lambda: seal(report(), b"another-secret-0123456789"),
        None,
        inbox.BadSeal,
        403,
    ),
    "tampered with": (_tampered, None, inbox.BadSeal, 403),
    "another node's key": (lambda: seal(report(), key="n2"), None, inbox.BadSeal, 403),
    "another node's report": (lambda: seal(report(node="n2")), None, inbox.WrongNode, 403),
    "sealed 31 s ago": (lambda: seal(report(at=NOW - 31)), None, inbox.Stale, 403),
    "sealed 31 s ahead": (lambda: seal(report(at=NOW + 31)), None, inbox.Stale, 403),
    "a sweep from the future": (
        lambda: seal(_with(sweep=sweep_id(NOW + 3600))),
        None,
        inbox.Stale,
        403,
    ),
    "the same sweep again": (
        lambda: seal(report()),
        sweep_id(NOW - 600, "ffffff"),
        inbox.Replayed,
        403,
    ),
    "an older sweep": (lambda: seal(report()), sweep_id(NOW - 60), inbox.Replayed, 403),
    "not sealed": (lambda: '{"node": "n1"}', None, inbox.Malformed, 400),
    "sealed, not JSON": (lambda: "0" * 64 + ".{nope", None, inbox.Malformed, 400),
    "no node": (
        lambda: seal({"node": "n1"}, key="n1").replace('"n1"', "1"),
        None,
        inbox.Malformed,
        400,
    ),
    "not a report": (lambda: seal(_with(extra=1)), None, inbox.Malformed, 400),
    "a time that is NaN": (
        lambda: seal(_with(finished_at=float("nan"))),
        None,
        inbox.Malformed,
        400,
    ),
    "over 64 KiB": (lambda: "x" * (inbox.MAX_REPORT_BYTES + 1), None, inbox.TooLarge, 413),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_a_report_is_refused_with_its_reason(case: str) -> None:
    make, last, error, code = REFUSED[case]
    with pytest.raises(error) as raised:
        accept(make(), SECRET, NAMES, NOW, last)
    assert raised.value.status == code
    assert raised.value.outcome == ("refused" if code == 403 else "malformed")
    assert "\n" not in str(raised.value) and len(str(raised.value)) <= 200


def test_a_full_report_with_long_node_names_fits_the_body_limit() -> None:
    name = "gpu-node-0001.rack-12.example"  # 29 characters
    results = tuple(
        PeerResult(
            peer=name,
            rail=i % 8,
            round=1 + i % 3,
            outcome="pass",
            busbw=123456789012.345,
            expected=123456789012.345,
            ratio=0.987654321,
            measured_at=NOW,
        )
        for i in range(MAX_RESULTS)
    )
    full = NodeReport(
        sweep=sweep_id(NOW), node=name, at=NOW, finished_at=NOW, results=results, suspect=True
    )
    assert len(seal(full).encode()) < min(inbox.MAX_REPORT_BYTES, MAX_POST_BODY)


def test_sweeps_in_a_row_count_up_reset_and_survive_the_document() -> None:
    state = SweepState()
    for suspect, expected in ((True, 1), (True, 2), (False, 0), (True, 1)):
        state = state.after(report(suspect=suspect))
        assert state.suspect_sweeps == expected
    state = state.after(report(suspect=True, peers=("n2",)))
    assert SweepState.from_json(json.loads(json.dumps(state.to_json()))) == state
    assert SweepState.from_json(SweepState().to_json()) == SweepState()
    bad_documents: list[Any] = [
        [],
        {"version": 2},
        {"version": 1, "suspect_sweeps": -1, "report": None},
        {"version": 1, "suspect_sweeps": 1, "report": {"node": "n1"}},
        {"version": 1, "suspect_sweeps": 0, "recent": [1, 0], "report": None},
        {"version": 1, "suspect_sweeps": 0, "recent": "x", "report": None},
    ]
    for bad in bad_documents:
        with pytest.raises(ValueError):
            SweepState.from_json(bad)
    # A document saved before the recent verdicts were kept starts them from its sweeps in a row.
    older = {"version": 1, "suspect_sweeps": 2, "report": None}
    assert SweepState.from_json(older) == SweepState(None, 2, (True, True))
    assert SweepState.from_json({**older, "suspect_sweeps": 0}).recent == ()
    # A longer window than this version keeps (a newer netmon's) is cut, not refused.
    longer = {**older, "recent": [True] + [False] * inbox.RECENT_SWEEPS}
    assert SweepState.from_json(longer).recent == (False,) * inbox.RECENT_SWEEPS


def _states(named: str) -> SweepState:
    """The state after sweeps that named the node (x) or not (.)."""
    state = SweepState()
    for mark in named:
        state = state.after(report(suspect=mark == "x"))
    return state


def test_a_fault_that_comes_and_goes_counts_onsets_and_a_steady_one_counts_one() -> None:
    assert _states("").suspect_onsets == 0
    assert _states("....").suspect_onsets == 0
    assert _states("xxxxxxxxxxxxxxxxxx").suspect_onsets == 1  # however long it lasts
    assert _states("xxxxxxxxxxx.....").suspect_onsets == 1  # and after its repair
    assert _states("x..x.xx...x.").suspect_onsets == 4
    flapping = _states("x..x.xx...x.")
    assert flapping.suspect_sweeps == 0 and len(flapping.recent) == inbox.RECENT_SWEEPS
    # The first sweep of the window counts as an onset when it named the node.
    assert _states(".x.x.x" + "." * (inbox.RECENT_SWEEPS - 1)).suspect_onsets == 1
    assert _states("x" + "." * inbox.RECENT_SWEEPS).suspect_onsets == 0  # rolled out
    assert SweepState.from_json(json.loads(json.dumps(flapping.to_json()))) == flapping


def test_the_node_is_known_by_its_short_host_name_and_its_full_one() -> None:
    assert node_names("gpu01.cluster.example") == ("gpu01", "gpu01.cluster.example")
    assert node_names("gpu01") == ("gpu01",)


# --- the inbox's state on disk


def test_the_inbox_saves_what_it_accepts_and_sets_a_corrupt_file_aside(tmp_path: Path) -> None:
    path = tmp_path / STATE_FILE
    shown: list[SweepView] = []
    clock = [NOW]
    box = SweepInbox(SECRET, NAMES, path, shown.append, clock=lambda: clock[0])
    assert shown[-1] == SweepView(None, 0, 0, {"accepted": 0, "malformed": 0, "refused": 0})
    assert box.receive(seal(report(suspect=True)).encode()) == (204, "accepted")
    clock[0] += 3600
    later = report(at=clock[0], suspect=True, peers=("n3",))
    assert box.receive(seal(later).encode()) == (204, "accepted")
    code, why = box.receive(seal(later).encode())
    assert code == 403 and "not newer" in why
    assert box.receive(b"\xff\xfe")[0] == 400
    assert shown[-1] == SweepView(later, 2, 1, {"accepted": 2, "malformed": 1, "refused": 1})

    again: list[SweepView] = []
    SweepInbox(SECRET, NAMES, path, again.append)
    assert (again[-1].report, again[-1].suspect_sweeps) == (later, 2)

    path.write_text('{"version": 1, "suspect_sweeps": "many"}')
    assert load(path) == SweepState()
    (aside,) = tmp_path.glob(f"{STATE_FILE}.corrupt-*")
    assert "many" in aside.read_text() and not path.exists()


# --- POST /sweep on the real HTTP server


@pytest.fixture
def serve() -> Iterator[Callable[..., int]]:
    servers: list[MetricsServer] = []

    def start(**options: Any) -> int:
        options.setdefault("request_timeout", 1.0)
        server = MetricsServer("127.0.0.1", 0, lambda _format: b"metrics\n", **options)
        server.serve_in_thread()
        servers.append(server)
        return int(server.server_address[1])

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def post(port: int, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, str]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/sweep", data=body, method="POST", headers=headers or {}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return int(answer.status), answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_post_sweep_hands_the_body_to_the_callback_and_answers_its_line(
    serve: Callable[..., int],
) -> None:
    bodies: list[bytes] = []

    def on_sweep(body: bytes) -> tuple[int, str]:
        bodies.append(body)
        return (204, "accepted") if body == b"good" else (403, "refused: why")

    port = serve(on_sweep=on_sweep)
    assert post(port, b"good") == (204, "")
    assert post(port, b"bad") == (403, "refused: why\n")
    assert bodies == [b"good", b"bad"]
    # 204 has no body and no Content-Length; the connection stays usable.
    answer = exchange(port, b"POST /sweep HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\ngood")
    assert answer.startswith(b"HTTP/1.1 204 ") and b"Content-Length" not in answer
    for request, code in (
        (b"POST /sweep HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", 411),
        (b"POST /sweep HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 411),
        (b"POST /sweep HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n", 400),
        (b"POST /sweep HTTP/1.1\r\nHost: x\r\nContent-Length: 65537\r\n\r\n", 413),
        (b"GET /sweep HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", 405),
        (b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\nx", 405),
    ):
        assert status(exchange(port, request)) == code, request
    # A body that never arrives is cut off at the request deadline (1 s here).
    started = time.monotonic()
    answer = exchange(port, b"POST /sweep HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nabc")
    assert answer == b"" and time.monotonic() - started < 4
    assert bodies == [b"good", b"bad", b"good"]


def test_post_sweep_is_404_without_a_callback_and_needs_basic_auth_like_get(
    serve: Callable[..., int],
) -> None:
    assert post(serve(), b"x") == (404, "not found\n")
    hashed = bcrypt.hashpw(b"pw", bcrypt.gensalt(rounds=4)).decode()
    secured = WebSecurity(auth=BasicAuth({"sweep": hashed}))
    calls: list[bytes] = []

    def on_sweep(body: bytes) -> tuple[int, str]:
        calls.append(body)
        if body == b"boom":
            raise RuntimeError("a bug in the inbox")
        return 204, "accepted"

    port = serve(on_sweep=on_sweep, security=secured)
    assert post(port, b"x")[0] == 401 and calls == []
    token = base64.b64encode(b"sweep:pw").decode()
    auth = {"Authorization": f"Basic {token}"}
    assert post(port, b"x", auth) == (204, "")
    assert post(port, b"boom", auth) == (500, "internal error\n")
    assert post(port, b"y", auth) == (204, "") and calls == [b"x", b"boom", b"y"]


# --- a real daemon


def _scrape_sweep(daemon: DaemonProcess) -> dict[str, dict[frozenset[tuple[str, str]], float]]:
    samples = daemon.scrape()
    names = {name for name, _ in samples if name.startswith("netmon_sweep_")}
    return {name: series(samples, name) for name in names}


def _labels(**pairs: str) -> frozenset[tuple[str, str]]:
    return frozenset(pairs.items())


def test_a_daemon_exports_delivered_sweeps_and_keeps_them_across_a_restart(
    tmp_path: Path, daemons: list[DaemonProcess]
) -> None:
    secret = secret_file(tmp_path / "secrets", SECRET_TEXT, "sweep.secret")
    # No probes: this test is about the inbox, and rank processes would only load the machine.
    config = fast_config(tmp_path, probes=[], sweep={"secret_file": secret})
    daemon = DaemonProcess(tmp_path, config)
    daemons.append(daemon)
    plain = DaemonProcess(tmp_path, fast_config(tmp_path / "plain", probes=[]), name="plain")
    daemons.append(plain)
    me = node_names()[0]
    assert me == socket.gethostname().split(".")[0]

    now = time.time()
    first = report(node=me, at=now, suspect=True)
    # Delivered as `netmon sweep` delivers it.
    assert deliver([first], {me: "127.0.0.1"}, SECRET, port=daemon.port) == {me: "ok"}
    found = _scrape_sweep(daemon)
    assert found["netmon_sweep_busbw_bytes_per_second"] == {
        _labels(peer="n2", rail="0"): 20e9,
        _labels(peer="n2", rail="1"): 5e9,
    }
    assert found["netmon_sweep_busbw_ratio"] == {
        _labels(peer="n2", rail="0"): 1.0,
        _labels(peer="n2", rail="1"): 0.25,
    }
    assert set(found["netmon_sweep_measurement_timestamp_seconds"].values()) == {now - 300}
    assert found["netmon_sweep_pair_result"] == {
        _labels(peer="n2", rail="0", outcome="pass"): 1.0,
        _labels(peer="n2", rail="1", outcome="fail"): 1.0,
        _labels(peer="n3", rail="0", outcome="preempted"): 1.0,
    }
    assert found["netmon_sweep_suspect"] == {_labels(peer=""): 1.0}
    assert found["netmon_sweep_suspect_sweeps"] == {_labels(): 1.0}
    assert found["netmon_sweep_suspect_onsets"] == {_labels(): 1.0}
    assert found["netmon_sweep_last_timestamp_seconds"] == {_labels(): now - 5}

    second = report(node=me, at=time.time() + 1, suspect=True, peers=("n2",))
    assert post(daemon.port, seal(second).encode()) == (204, "")
    # Refused, each with its answer, and the daemon serves on.
    refusals = [
        (seal(second), 403, "not newer"),
        (seal(report(node=me, at=time.time() + 2), b"another-secret-0123456789"), 403, "MAC"),
        (seal(report(node="not-this-node", at=time.time() + 2)), 403, "not-this-node"),
        ("not a report", 400, "not a sealed report"),
    ]
    for body, code, why in refusals:
        answer = post(daemon.port, body.encode())
        assert answer[0] == code and why in answer[1], answer
    too_large = f"POST /sweep HTTP/1.1\r\nHost: x\r\nContent-Length: {MAX_POST_BODY + 1}\r\n\r\n"
    assert status(exchange(daemon.port, too_large.encode())) == 413
    assert daemon.get("/healthz") == "ok\n"
    found = _scrape_sweep(daemon)
    assert found["netmon_sweep_suspect"] == {_labels(peer="n2"): 1.0}
    assert found["netmon_sweep_suspect_sweeps"] == {_labels(): 2.0}
    assert found["netmon_sweep_reports_total"] == {
        _labels(outcome="accepted"): 2.0,
        _labels(outcome="malformed"): 1.0,
        _labels(outcome="refused"): 3.0,
    }

    # Without a sweep secret: nothing is taken and nothing exported.
    assert post(plain.port, seal(second).encode()) == (404, "not found\n")
    assert _scrape_sweep(plain) == {}
    assert plain.stop() == 0

    # The secret is read at start: a reload that changes it is refused, and the inbox stays.
    daemon.config_path.write_text(yaml.safe_dump({**config, "sweep": None}))
    daemon.proc.send_signal(signal.SIGHUP)
    wait_for(
        lambda: "sweep.secret_file: changing this needs a restart" in daemon.log(),
        10,
        "the reload refused",
    )
    assert post(daemon.port, seal(second).encode())[0] == 403  # still there, still a replay
    assert daemon.stop() == 0
    restarted = DaemonProcess(tmp_path, config, name="restarted")
    daemons.append(restarted)
    found = _scrape_sweep(restarted)
    assert found["netmon_sweep_suspect_sweeps"] == {_labels(): 2.0}
    assert found["netmon_sweep_suspect_onsets"] == {_labels(): 1.0}  # kept with the state
    assert found["netmon_sweep_suspect"] == {_labels(peer="n2"): 1.0}
    assert found["netmon_sweep_last_timestamp_seconds"] == {_labels(): second.finished_at}
    assert set(found["netmon_sweep_reports_total"].values()) == {0.0}  # counters start at 0
    # The restart still knows the last sweep: its replay is refused.
    assert post(restarted.port, seal(second).encode())[0] == 403
    wait_for(lambda: "report refused" in restarted.log(), 10, "the refusal in the log")
    assert restarted.stop() == 0


def test_the_flapping_alert_catches_more_flaps_and_holds_longer_than_two_in_a_row() -> None:
    """bench/sweep_alerts.py on few nodes: a fault named in about a third of the sweeps, swept
    hourly for a day, is caught more often with the onsets beside the sweeps in a row, and
    stays caught."""
    done = subprocess.run(
        [sys.executable, str(BENCH_ALERTS), "--json", "--nodes", "300"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    rows = {row["p_named"]: row for row in json.loads(done.stdout)["rows"]}
    flap = rows[0.32]
    assert flap["either_fired"] > flap["in_a_row_fired"] + 0.05
    assert flap["either_held_after_first"] > 2 * flap["in_a_row_held_after_first"]
    assert rows[0.001]["either_fired"] < 0.02  # a healthy large fabric, a month of sweeps
