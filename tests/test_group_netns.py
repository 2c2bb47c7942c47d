"""A degraded inter-node link caught for real: two daemons in two network namespaces.

The namespaces are joined by one veth pair shaped with `tc ... tbf` (netem does not exist on
this kernel). At a healthy rate (400 Mbit/s) the group round's baseline is learned; cut to 70 %
and held for 60 rounds (issue 23), `netmon_degraded` must turn 1 within ten conclusive results,
stay 1 with its reason at every result of the hold, and clear within ten once restored.
bench/cut_depth.py uses `measure_cut` for its table of cut depths (a quarter, 60 %, ...: how
many rounds each takes to turn and to clear); the tests of a quartered and a 60 % cut that ran
here until issue 25 live on as its rows, for CI's 30-minute budget.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from netmon import baseline
from tests.daemon_harness import DaemonProcess, Samples, secret_file, wait_until
from tests.netns import Link

PORT = 29400
KEY = {"probe": "cross", "op": "all_reduce", "size_bytes": "2097152", "path": "group", "ranks": "2"}


@pytest.fixture
def link() -> Iterator[Link]:
    cable = Link()
    try:
        yield cable
    finally:
        cable.remove()
        assert cable.existing() == []


def config(
    tmp_path: Path, members: list[str], me: str, policy: dict[str, Any] | None = None
) -> dict[str, Any]:
    return {
        "listen": "127.0.0.1:0",
        "state_dir": str(tmp_path / me / "state"),
        "pause_file": str(tmp_path / me / "pause"),
        "backend": "gloo",
        "ranks": 1,
        "probes": [
            {
                "name": "cross",
                "scope": "group",
                "sizes": ["2M"],
                "interval": "1s",
                "iters": 3,
                "warmup": 1,
                "batch": 1,
                "timeout": "60s",
            }
        ],
        "group": {
            "name": "pair",
            "members": members,
            "self": me,
            "interface": "eth0",
            "heartbeat": "500ms",
            "ready_timeout": "5s",
            "secret_file": secret_file(tmp_path),
        },
        "baseline": policy or {},
    }


@dataclass
class CutResult:
    """Rounds (group round results) from the cut to the verdict, and from the repair to its end;
    None: not within the limit."""

    baseline: float
    to_verdict: int | None
    ratio_at_verdict: float | None
    to_clear: int | None


def measure_cut(
    link: Link,
    tmp_path: Path,
    rate: str,
    limit: int,
    policy: dict[str, Any] | None = None,
    healthy: str = "400mbit",
    clear_limit: int | None = None,
) -> CutResult:
    """Two daemons learn the group round at `healthy`; the cable is cut to `rate` for at most
    `limit` rounds, then restored for at most `clear_limit` rounds (`limit` unless given)."""
    with node_group(link, tmp_path, policy, healthy) as (leader, learned):
        link.shape(rate)
        to_verdict = _rounds_until(leader, 1.0, limit)
        ratio = leader.value("netmon_busbw_baseline_ratio", **KEY)
        link.shape(healthy)
        to_clear = (
            _rounds_until(leader, 0.0, clear_limit or limit) if to_verdict is not None else None
        )
        return CutResult(learned, to_verdict, ratio, to_clear)


@contextlib.contextmanager
def node_group(
    link: Link, tmp_path: Path, policy: dict[str, Any] | None, healthy: str
) -> Iterator[tuple[DaemonProcess, float]]:
    """Two daemons, one in each namespace, with the cable at `healthy`: yields the leader once
    its baseline is learned, and that baseline; stops both and finds nothing of theirs left."""
    members = [f"{address}:{PORT}" for address in link.addresses]
    link.shape(healthy)
    daemons = [
        DaemonProcess(tmp_path, config(tmp_path, members, me, policy), name=f"n{i}", netns=ns)
        for i, (me, ns) in enumerate(zip(members, link.names, strict=True))
    ]
    leader = daemons[0]  # the lower-named member hosts rank 0 and exports the round
    try:
        learned = wait_until(
            lambda: leader.value("netmon_busbw_baseline_bytes_per_second", **KEY),
            180,
            "a learned baseline at the healthy rate",
        )
        assert learned > 0 and leader.value("netmon_degraded", **KEY) == 0.0
        yield leader, learned
    finally:
        for daemon in daemons:
            if daemon.proc.poll() is None:
                daemon.stop()
        for daemon in daemons:
            assert daemon.tagged_processes() == []


def _rounds_until(leader: DaemonProcess, degraded: float, limit: int) -> int | None:
    """Rounds measured until netmon_degraded reads `degraded`, counting the round that set it.

    One scrape per poll, four polls a second: the probes count any CPU this test burns as other
    work, and results disturbed by it are never judged (docs/SIGNAL.md)."""

    def reading() -> tuple[float, float | None]:
        samples = leader.scrape()
        stamp = samples.get(("netmon_measurement_timestamp_seconds", frozenset(KEY.items())))
        return stamp or 0.0, samples.get(("netmon_degraded", frozenset(KEY.items())))

    seen, _ = reading()
    rounds = 0
    deadline = time.monotonic() + 60 * limit
    while time.monotonic() < deadline:
        stamp, verdict = reading()
        if stamp > seen:
            seen, rounds = stamp, rounds + 1
            if verdict == degraded:
                return rounds
            if rounds >= limit:
                return None
        time.sleep(0.25)
    raise AssertionError(f"fewer than {limit} rounds in {60 * limit} s")


@dataclass(frozen=True)
class Reading:
    """The leader's series after its latest result: how many results came since the previous
    reading and how many of them were conclusive (judged or learned: not settling, disturbed
    or noisy), and the verdict they left."""

    results: int
    conclusive: int
    degraded: float | None
    reasons: dict[str, float | None]
    ratio: float | None

    def why(self) -> list[str]:
        return [reason for reason, value in self.reasons.items() if value == 1.0]


class Results:
    """Follows the group round's series on the leader, one reading per result.

    A reading is taken when netmon_series_results_total moves, and the counts come from the
    counters, not from how often the test looked: a reading that spans two results says so.
    The rule counts conclusive results only (an inconclusive one never turns the verdict), and
    on a 2-core machine another process's CPU makes results inconclusive, so the limits below
    are in conclusive results; each result is still read, conclusive or not. One scrape per
    poll, four polls a second, as in _rounds_until."""

    def __init__(self, leader: DaemonProcess) -> None:
        self.leader = leader
        self._results, self._conclusive = self._counts(leader.scrape())

    @staticmethod
    def _counts(samples: Samples) -> tuple[float, float]:
        results = samples.get(("netmon_series_results_total", frozenset({("probe", "cross")})))
        inconclusive = sum(
            samples.get(
                (
                    "netmon_inconclusive_results_total",
                    frozenset({("probe", "cross"), ("reason", reason)}),
                ),
                0.0,
            )
            for reason in baseline.INCONCLUSIVE_REASONS
        )
        assert results is not None, "no netmon_series_results_total for the group probe"
        return results, results - inconclusive

    def next(self, timeout: float = 60) -> Reading:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            samples = self.leader.scrape()
            results, conclusive = self._counts(samples)
            if results > self._results:
                reading = Reading(
                    results=round(results - self._results),
                    conclusive=round(conclusive - self._conclusive),
                    degraded=samples.get(("netmon_degraded", frozenset(KEY.items()))),
                    reasons={
                        reason: samples.get(
                            (
                                "netmon_degraded_reason",
                                frozenset({**KEY, "reason": reason}.items()),
                            )
                        )
                        for reason in baseline.DEGRADED_REASONS
                    },
                    ratio=samples.get(("netmon_busbw_baseline_ratio", frozenset(KEY.items()))),
                )
                self._results, self._conclusive = results, conclusive
                return reading
            time.sleep(0.25)
        raise AssertionError(f"no result of the group round in {timeout} s")


HELD_ROUNDS = 60  # conclusive results at the cut rate
WITHIN = 10  # conclusive results to the verdict, and from the repair to the clearing
# A stall guard, not a pace: a result comes every 1.2 s or so on an idle machine, and other
# work on a 2-core one leaves many inconclusive (one busy core is half its CPUs), uncounted.
SECONDS_PER_RESULT = 6


# The learning (up to 180 s) and the guards below exceed the default 300 s on a busy machine.
@pytest.mark.timeout(180 + (HELD_ROUNDS + WITHIN) * SECONDS_PER_RESULT + 120)
def test_a_link_held_at_70_percent_for_60_rounds_stays_degraded_and_clears_when_restored(
    link: Link, tmp_path: Path
) -> None:
    # Issue 23: a cut that lasts must never become the series' new normal. At 70 % the results
    # sit just over the floor (0.7 x expected) and under the low line (0.8 x): degraded as
    # "low" (3 of the last 5) or "drift" (the recent level), and never healthy enough to clear.
    # Other work on the host (a CPU hog takes one of two cores: a foreign share near 0.5) would
    # leave every result disturbed and nothing learned; what other work does to a verdict is
    # tests/test_signal.py's subject, a cut held for an hour this one's.
    with node_group(link, tmp_path, {"max_foreign_cpu": 0.75}, "400mbit") as (leader, _):
        results = Results(leader)
        link.shape("280mbit")
        deadline = time.monotonic() + HELD_ROUNDS * SECONDS_PER_RESULT
        held, seen, flagged_at, reasons = 0, 0, None, set()
        while held < HELD_ROUNDS:
            assert time.monotonic() < deadline, f"only {held} conclusive of {seen} results"
            reading = results.next()
            held, seen = held + reading.conclusive, seen + reading.results
            if flagged_at is None:
                if reading.degraded != 1.0:
                    assert held < WITHIN, f"not degraded within {WITHIN} conclusive results"
                    assert reading.why() == [], f"a reason while not degraded: {reading}"
                    continue
                # The verdict turned at one of this reading's results (one, unless unread).
                flagged_at = held - reading.conclusive + 1
                assert flagged_at <= WITHIN, f"not degraded within {WITHIN} conclusive results"
                assert reading.ratio is not None and reading.ratio < 0.8, reading
            else:
                assert reading.results == 1, f"result {seen} of the cut was not read"
                assert reading.degraded == 1.0, f"cleared at result {seen} ({held} conclusive)"
            assert len(reading.why()) == 1, f"degraded needs one reason: {reading.reasons}"
            reasons.update(reading.why())
        print(f"degraded at conclusive result {flagged_at} ({sorted(reasons)}); held for {seen}")

        link.shape("400mbit")
        deadline = time.monotonic() + WITHIN * SECONDS_PER_RESULT
        repaired = 0
        while True:
            assert time.monotonic() < deadline, f"only {repaired} conclusive results"
            reading = results.next()
            repaired += reading.conclusive
            if reading.degraded == 0.0:
                repaired -= reading.conclusive - 1
                break
            assert reading.degraded == 1.0 and len(reading.why()) == 1, reading
            assert repaired < WITHIN, f"not cleared within {WITHIN} conclusive results"
        assert repaired <= WITHIN, f"not cleared within {WITHIN} conclusive results"
        assert reading.why() == [], f"a reason left after clearing: {reading.reasons}"
        print(f"cleared at conclusive result {repaired} after the repair")
