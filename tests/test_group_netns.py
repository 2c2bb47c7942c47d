"""A degraded inter-node link caught for real: two daemons in two network namespaces.

The namespaces are joined by one veth pair shaped with `tc ... tbf` (netem does not exist on
this kernel). At a healthy rate the group round's baseline is learned; with the rate cut to a
quarter, `netmon_degraded` must turn 1 and the baseline ratio fall under 0.5 within three
rounds; with the rate restored the verdict must clear.
"""

from __future__ import annotations

from collections.abc import Iterator
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


def config(tmp_path: Path, members: list[str], me: str) -> dict[str, Any]:
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
        # 2 of the last 3 rounds low: the verdict can turn within three rounds.
        "baseline": {"min_samples": 3, "window": 5, "ratio": 0.8, "trigger": 2, "of": 3},
    }


def test_a_quartered_link_turns_degraded_and_clears(link: Link, tmp_path: Path) -> None:
    members = [f"{address}:{PORT}" for address in link.addresses]
    link.shape("400mbit")
    daemons = [
        DaemonProcess(tmp_path, config(tmp_path, members, me), name=f"n{i}", netns=ns)
        for i, (me, ns) in enumerate(zip(members, link.names, strict=True))
    ]
    leader = daemons[0]  # the lower-named member hosts rank 0 and exports the round
    try:

        def value(name: str) -> float | None:
            return leader.value(name, **KEY)

        baseline = wait_until(
            lambda: value("netmon_busbw_baseline_bytes_per_second"),
            120,
            "a learned baseline at the healthy rate",
        )
        assert baseline > 0 and value("netmon_degraded") == 0.0

        def round_stamp() -> float:
            return value("netmon_measurement_timestamp_seconds") or 0.0

        link.shape("100mbit")
        cut_at = round_stamp()
        rounds: list[float] = []

        def degraded_within_three_rounds() -> bool:
            stamp = round_stamp()
            if stamp > (rounds[-1] if rounds else cut_at):
                rounds.append(stamp)
            assert len(rounds) <= 3 or value("netmon_degraded") == 1.0, "not degraded in 3"
            return value("netmon_degraded") == 1.0

        wait_until(degraded_within_three_rounds, 120, "netmon_degraded to turn 1")
        ratio = value("netmon_busbw_baseline_ratio")
        assert ratio is not None and ratio < 0.5, ratio

        link.shape("400mbit")
        wait_until(lambda: value("netmon_degraded") == 0.0, 120, "the verdict to clear")
    finally:
        for daemon in daemons:
            if daemon.proc.poll() is None:
                daemon.stop()
        for daemon in daemons:
            assert daemon.tagged_processes() == []
