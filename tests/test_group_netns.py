"""A degraded inter-node link caught for real: two daemons in two network namespaces.

The namespaces are joined by one veth pair shaped with `tc ... tbf` (netem does not exist on
this kernel). At a healthy rate (400 Mbit/s) the group round's baseline is learned; with the
rate cut to a quarter, `netmon_degraded` must turn 1 and the baseline ratio fall under 0.5
within three rounds, and clear within three once restored; cut to 60 % (240 Mbit/s), under the
default policy, it must turn within five rounds and clear within five. bench/cut_depth.py uses
`measure_cut` for its table of cut depths.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.daemon_harness import DaemonProcess, secret_file, wait_until
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


# 2 of the last 3 rounds low: the verdict can turn within three rounds.
FAST = {"min_samples": 3, "window": 5, "ratio": 0.8, "trigger": 2, "of": 3}


@dataclass
class CutResult:
    """Rounds (group round results) from the cut to the verdict, and from the repair to its end;
    None: not within `limit` rounds."""

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
) -> CutResult:
    """Two daemons learn the group round at `healthy`; the cable is cut to `rate` for at most
    `limit` rounds, then restored for at most `limit` rounds."""
    members = [f"{address}:{PORT}" for address in link.addresses]
    link.shape(healthy)
    daemons = [
        DaemonProcess(tmp_path, config(tmp_path, members, me, policy), name=f"n{i}", netns=ns)
        for i, (me, ns) in enumerate(zip(members, link.names, strict=True))
    ]
    leader = daemons[0]  # the lower-named member hosts rank 0 and exports the round
    try:

        def value(name: str) -> float | None:
            return leader.value(name, **KEY)

        baseline = wait_until(
            lambda: value("netmon_busbw_baseline_bytes_per_second"),
            180,
            "a learned baseline at the healthy rate",
        )
        assert baseline > 0 and value("netmon_degraded") == 0.0
        link.shape(rate)
        to_verdict = _rounds_until(leader, 1.0, limit)
        ratio = value("netmon_busbw_baseline_ratio")
        link.shape(healthy)
        to_clear = _rounds_until(leader, 0.0, limit) if to_verdict is not None else None
        return CutResult(baseline, to_verdict, ratio, to_clear)
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


def test_a_quartered_link_turns_degraded_within_three_rounds_and_clears(
    link: Link, tmp_path: Path
) -> None:
    result = measure_cut(link, tmp_path, "100mbit", limit=3, policy=FAST)
    assert result.to_verdict is not None, "not degraded within 3 rounds"
    assert result.ratio_at_verdict is not None and result.ratio_at_verdict < 0.5
    assert result.to_clear is not None, "not cleared within 3 rounds"


def test_a_link_cut_to_60_percent_degrades_within_five_rounds_and_clears_within_five(
    link: Link, tmp_path: Path
) -> None:
    # The default policy (3 of the last 5 low, settling, the spread margin): a lane or a NIC
    # speed lost falls to 50-75 %, not to a quarter.
    result = measure_cut(link, tmp_path, "240mbit", limit=5)
    assert result.to_verdict is not None, "not degraded within 5 rounds"
    assert result.ratio_at_verdict is not None and result.ratio_at_verdict < 0.8
    assert result.to_clear is not None, "not cleared within 5 rounds"
