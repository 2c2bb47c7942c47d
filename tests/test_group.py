"""Node groups for real: several daemons on loopback form a group and probe across "nodes".

Each daemon is a real `netmon serve` with its own store agent (netmon.group.store) and its own gloo
rank; members differ by port. Killing and restarting members exercises absence, rejoining and
leader handover, with every wait bounded.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.daemon_harness import DaemonProcess, secret_file, series, wait_until
from tests.prometheus_harness import free_port

ROUND = {
    "name": "cross",
    "scope": "group",
    "sizes": ["64K"],
    "interval": "2s",
    "iters": 3,
    "warmup": 1,
    "timeout": "60s",
}


NODE_PAIRS = {
    "name": "nodes",
    "scope": "node_pairs",
    "sizes": ["64K"],
    "interval": "3s",
    "iters": 3,
    "warmup": 1,
    "timeout": "60s",
}


def member_config(tmp_path: Path, members: list[str], me: str) -> dict[str, Any]:
    name = me.replace(":", "_").replace(".", "_")
    return {
        "listen": "127.0.0.1:0",
        "state_dir": str(tmp_path / name / "state"),
        "pause_file": str(tmp_path / name / "pause"),
        "backend": "gloo",
        "ranks": 1,
        "probes": [ROUND, NODE_PAIRS],
        "group": {
            "name": "test",
            "members": members,
            "self": me,
            "heartbeat": "500ms",
            "ready_timeout": "3s",
            "interface": "lo",
            "secret_file": secret_file(tmp_path),
        },
        "baseline": {"min_samples": 2},
    }


class Group:
    def __init__(self, tmp_path: Path, size: int) -> None:
        self.tmp_path = tmp_path
        self.members = [f"127.0.0.1:{free_port()}" for _ in range(size)]
        self.daemons: dict[str, DaemonProcess] = {}

    def start(self, member: str) -> DaemonProcess:
        config = member_config(self.tmp_path, self.members, member)
        run = len([p for p in self.tmp_path.glob("*.yaml")])
        daemon = DaemonProcess(self.tmp_path, config, name=f"m{run}")
        self.daemons[member] = daemon
        return daemon

    def stop_all(self) -> None:
        for daemon in self.daemons.values():
            if daemon.proc.poll() is None:
                daemon.kill_all()


@pytest.fixture
def group3(tmp_path: Path) -> Iterator[Group]:
    group = Group(tmp_path, 3)
    try:
        yield group
    finally:
        group.stop_all()


def up(daemon: DaemonProcess, member: str) -> float | None:
    return daemon.value("netmon_group_member_up", group="test", member=member)


def leader(daemon: DaemonProcess) -> str | None:
    leaders = series(daemon.scrape(), "netmon_group_leader")
    return dict(next(iter(leaders)))["leader"] if leaders else None


def group_busbw(daemon: DaemonProcess) -> float | None:
    return daemon.value_with(
        "netmon_busbw_bytes_per_second",
        probe="cross",
        op="all_reduce",
        size_bytes="65536",
        path="group",
    )


def skips(daemon: DaemonProcess, reason: str) -> float:
    return daemon.value("netmon_probe_skips_total", probe="cross", reason=reason) or 0.0


def test_three_daemons_form_a_group_survive_members_and_hand_over(group3: Group) -> None:
    first, second, third = sorted(group3.members)
    daemons = {member: group3.start(member) for member in group3.members}
    head = daemons[first]
    wait_until(
        lambda: all(up(d, m) == 1.0 for d in daemons.values() for m in group3.members),
        60,
        "every member to see every member",
    )
    assert all(leader(d) == first for d in daemons.values())
    busbw = wait_until(lambda: group_busbw(head), 90, "a cross-node round on the leader")
    assert busbw > 0
    # Exported once per group: by the member hosting rank 0, not by the followers.
    assert group_busbw(daemons[second]) is None and group_busbw(daemons[third]) is None
    assert all(
        (d.value("netmon_probe_runs_total", probe="cross") or 0) >= 1 for d in daemons.values()
    )

    # Node pairs: each pair exported once, by its lower-named member, naming the other as peer;
    # the leader exports the verdict for every member.
    def peers(daemon: DaemonProcess) -> set[str]:
        found = series(daemon.scrape(), "netmon_peer_busbw_bytes_per_second")
        return {dict(key)["peer"] for key in found}

    wait_until(
        lambda: (
            peers(head) == {second, third}
            and peers(daemons[second]) == {third}
            and len(series(head.scrape(), "netmon_peer_suspect")) == 3
        ),
        120,
        "every node pair measured and judged",
    )
    assert peers(daemons[third]) == set()
    assert set(series(head.scrape(), "netmon_peer_suspect").values()) == {0.0}

    # A follower dies: the others see it absent, rounds are skipped naming it, metrics go on.
    daemons[third].kill_all()
    wait_until(
        lambda: up(head, third) == 0.0 and up(daemons[second], third) == 0.0,
        20,
        "the dead member to be reported absent",
    )
    before = skips(head, "member_absent")
    wait_until(lambda: skips(head, "member_absent") > before, 20, "a member_absent skip")
    assert head.value("netmon_group_members", group="test") == 2.0
    assert f"absent={third}" in head.log() or third in head.log()

    # It comes back: it rejoins and rounds run again.
    daemons[third] = group3.start(third)
    wait_until(lambda: up(head, third) == 1.0, 60, "the member to rejoin")
    stamp = (
        head.value_with(
            "netmon_measurement_timestamp_seconds",
            probe="cross",
            op="all_reduce",
            size_bytes="65536",
            path="group",
        )
        or 0.0
    )
    wait_until(
        lambda: (
            (
                head.value_with(
                    "netmon_measurement_timestamp_seconds",
                    probe="cross",
                    op="all_reduce",
                    size_bytes="65536",
                    path="group",
                )
                or 0
            )
            > stamp
        ),
        60,
        "a new round after the rejoin",
    )

    # The leader dies: the next member takes over within a bounded time.
    head.kill_all()
    wait_until(
        lambda: leader(daemons[second]) == second and leader(daemons[third]) == second,
        20,
        "the next member to lead",
    )
    assert daemons[second].get("/healthz").strip() == "ok"
    for member in (second, third):
        assert daemons[member].stop() == 0
        assert daemons[member].tagged_processes() == []


@pytest.fixture
def group2(tmp_path: Path) -> Iterator[Group]:
    group = Group(tmp_path, 2)
    try:
        yield group
    finally:
        group.stop_all()


def test_two_daemons_form_a_group_and_export_cross_node_busbw_once(group2: Group) -> None:
    first, second = sorted(group2.members)
    daemons = {member: group2.start(member) for member in group2.members}
    wait_until(
        lambda: all(up(d, m) == 1.0 for d in daemons.values() for m in group2.members),
        60,
        "both members to see each other",
    )
    assert wait_until(lambda: group_busbw(daemons[first]), 90, "a cross-node round") > 0
    assert group_busbw(daemons[second]) is None
    daemons[second].kill_all()
    wait_until(lambda: up(daemons[first], second) == 0.0, 20, "the follower to be absent")
    assert daemons[first].get("/healthz").strip() == "ok"
    assert daemons[first].stop() == 0
    assert daemons[first].tagged_processes() == []
