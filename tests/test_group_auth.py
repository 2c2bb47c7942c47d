"""Node-group authentication: sealed messages, stores bound to one address, and intruders.

The sealing itself is pure and tested with literals. The rest is real: the store agent in its own
process, real daemons on loopback, and an intruder that speaks the member store's protocol to a
member's port (netmon.group.store), as anyone on the network could.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from netmon.group import store
from netmon.group.auth import AuthError, Sealer, check_fresh, read_secret
from netmon.group.link import GroupError, GroupLink, RejectedMessage, SealedLink
from netmon.group.members import GroupConfig, bind_address
from netmon.probe.launcher import Launcher
from netmon.probe.spec import ProbeSpec
from tests.daemon_harness import DaemonProcess, fast_config, secret_file, wait_until
from tests.group_harness import SECRET, store_agent
from tests.prometheus_harness import free_port

sealer = Sealer("rack-a", SECRET)


# ---- sealing, pure ----


def test_a_sealed_value_opens_with_the_same_secret_group_and_key() -> None:
    value = sealer.seal("netmon/7/plan", {"probe": "cross", "n": 1})
    assert sealer.open("netmon/7/plan", value) == {"probe": "cross", "n": 1}


@pytest.mark.parametrize(
    ("opener", "key"),
    [
        (Sealer("rack-a", b"another secret of 32 bytes......"), "netmon/7/plan"),
        (Sealer("rack-b", SECRET), "netmon/7/plan"),  # the same secret in another group
        (sealer, "netmon/8/plan"),  # replayed into a later round
        (sealer, "netmon/7/ready/10.0.0.2:29400"),  # moved to another key
    ],
)
def test_a_sealed_value_does_not_open_elsewhere(opener: Sealer, key: str) -> None:
    value = sealer.seal("netmon/7/plan", {"probe": "cross"})
    with pytest.raises(AuthError):
        opener.open(key, value)


@pytest.mark.parametrize(
    "forged",
    [
        "",
        '{"probe": "cross"}',  # what an unauthenticated writer would store
        "0" * 64 + '.{"probe": "cross"}',
        "zz." + "{}",
    ],
)
def test_unsealed_or_forged_values_are_refused(forged: str) -> None:
    with pytest.raises(AuthError):
        sealer.open("netmon/7/plan", forged)


def test_a_tampered_body_is_refused() -> None:
    value = sealer.seal("k", {"busbw": 1e9})
    with pytest.raises(AuthError, match="wrong MAC"):
        sealer.open("k", value.replace("1000000000", "9000000000"))


def test_the_secret_never_appears_in_a_sealed_value_or_a_repr() -> None:
    assert SECRET.decode() not in sealer.seal("k", {"a": 1})
    assert SECRET.decode() not in repr(sealer)


def test_freshness_bounds_age_both_ways() -> None:
    check_fresh("k", {"t": 1000.0}, now=1010.0, max_age=30)
    with pytest.raises(AuthError, match="old"):
        check_fresh("k", {"t": 1000.0}, now=1031.0, max_age=30)
    with pytest.raises(AuthError, match="future"):
        check_fresh("k", {"t": 1000.0}, now=960.0, max_age=30)
    with pytest.raises(AuthError, match="no time"):
        check_fresh("k", {"t": "yesterday"}, now=1000.0)


def test_a_secret_file_must_be_readable_and_long_enough(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    path.write_text("short\n")
    with pytest.raises(ValueError, match="at least 16"):
        read_secret(path)
    with pytest.raises(ValueError, match="cannot read"):
        read_secret(tmp_path / "absent")
    path.write_text("  " + SECRET.decode() + "\n")
    assert read_secret(path) == SECRET  # surrounding whitespace (a trailing newline) is dropped


# ---- configuration ----


def group_config(**fields: Any) -> GroupConfig:
    base: dict[str, Any] = {"name": "g", "members": ["127.0.0.1:29400", "127.0.0.1:29401"]}
    return GroupConfig.model_validate({**base, **fields})


def test_a_group_needs_a_secret_file() -> None:
    with pytest.raises(ValueError, match="secret_file is required"):
        group_config()


def test_the_store_binds_the_members_host_and_refuses_loopback_for_a_real_network() -> None:
    assert bind_address(group_config(secret_file="s"), "127.0.0.1:29400") == "127.0.0.1"
    remote = group_config(members=["10.0.0.1:29400", "10.0.0.2:29400"], secret_file="s")
    with pytest.raises(ValueError, match=r"group\.bind: .*loopback"):
        bind_address(remote.model_copy(update={"bind": "127.0.0.1"}), "10.0.0.1:29400")
    with pytest.raises(ValueError, match=r"group\.bind: cannot resolve"):
        bind_address(remote.model_copy(update={"bind": "no-such-host.invalid"}), "10.0.0.1:29400")


def test_check_config_names_a_bad_secret_file(tmp_path: Path) -> None:
    import subprocess
    import sys

    config = fast_config(
        tmp_path,
        group={
            "name": "g",
            "members": ["127.0.0.1:29400"],
            "self": "127.0.0.1:29400",
            "secret_file": str(tmp_path / "missing.secret"),
        },
    )
    path = tmp_path / "c.yaml"
    path.write_text(json.dumps(config))
    done = subprocess.run(
        [sys.executable, "-m", "netmon", "check-config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0  # one line
    assert "group.secret_file: cannot read" in done.stderr


# ---- the store agent, for real ----


def listeners_on(port: int) -> set[str]:
    """The local addresses of sockets listening on `port` (IPv4 as dotted quads)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            address, _, hex_port = fields[1].rpartition(":")
            if fields[3] == "0A" and int(hex_port, 16) == port:
                if len(address) == 8:
                    found.add(".".join(str(b) for b in reversed(bytes.fromhex(address))))
                else:
                    found.add(address)
    return found


@pytest.fixture
def agent() -> Iterator[GroupLink]:
    with store_agent() as link:
        yield link


def test_the_member_store_listens_on_the_group_address_only(agent: GroupLink) -> None:
    assert listeners_on(agent.port) == {"127.0.0.1"}


def test_forged_replayed_and_stale_messages_are_refused_by_a_real_store(agent: GroupLink) -> None:
    assert agent.me is not None
    me = agent.me
    refused: list[tuple[str, str]] = []
    clock = [time.time()]
    honest = SealedLink(agent, sealer, lambda *why: refused.append(why), lambda: clock[0])
    intruder = SealedLink(agent, Sealer("rack-a", b"guessed secret, 32 bytes long..."), print)

    honest.put(me, "netmon/5/ready/b", {"idle": True, "ranks": 1})
    assert honest.take(me, "netmon/5/ready/b", 1.0, "b") == {"idle": True, "ranks": 1}

    # A member with the wrong secret poisons a result: refused, and counted against it.
    intruder.put(me, "netmon/5/result/0", {"busbw": 1e15})
    with pytest.raises(RejectedMessage):
        honest.take(me, "netmon/5/result/0", 1.0, "b")
    assert refused[-1][0] == "b" and "wrong MAC" in refused[-1][1]

    # An honest value copied into a later round (raw bytes, as a replaying intruder would).
    agent.set(me, "netmon/6/ready/b", agent.get(me, "netmon/5/ready/b", 1.0))
    with pytest.raises(RejectedMessage):
        honest.take(me, "netmon/6/ready/b", 1.0, "b")

    # A hello recorded now and replayed later.
    honest.put(me, "netmon/hello", {"member": "b", "t": clock[0]})
    clock[0] += 120
    with pytest.raises(RejectedMessage, match="old"):
        honest.take(me, "netmon/hello", 1.0, "b", fresh=True)
    # A hello of another member, moved onto this member's port.
    clock[0] -= 120
    with pytest.raises(RejectedMessage, match="member is 'b'"):
        honest.take(me, "netmon/hello", 1.0, "c", fresh=True, expect={"member": "c"})
    assert len(refused) == 4

    # A missing key is absence, not a forgery: nothing more is counted.
    with pytest.raises(GroupError):
        honest.take(me, "netmon/9/plan", 0.3, "b")
    assert len(refused) == 4


def test_a_probes_rendezvous_store_listens_on_its_host_only_and_only_while_it_runs() -> None:
    seen: dict[str, Any] = {}

    def on_event(kind: str, fields: dict[str, Any]) -> None:
        if kind == "store":
            seen["port"] = int(fields["port"])
            seen["listeners"] = listeners_on(seen["port"])

    spec = ProbeSpec(backend="gloo", ranks=2, sizes=(1024,), iters=2, warmup=1)
    outcome = Launcher(spec, on_event=on_event).run()
    assert outcome.ok, outcome.failure
    assert seen["listeners"] == {"127.0.0.1"}
    assert listeners_on(seen["port"]) == set()  # gone with the probe


# ---- daemons and an intruder ----

ROUND = {
    "name": "cross",
    "scope": "group",
    "sizes": ["1K"],
    "iters": 2,
    "warmup": 1,
    "timeout": "60s",
}


def member_config(
    tmp_path: Path, members: list[str], me: str, secret: str, interval: str
) -> dict[str, Any]:
    name = me.rpartition(":")[2]
    return fast_config(
        tmp_path / name,
        ranks=1,
        probes=[{**ROUND, "interval": interval}],
        group={
            "name": "test",
            "members": members,
            "self": me,
            "heartbeat": "300ms",
            "ready_timeout": "3s",
            "interface": "lo",
            "secret_file": secret_file(tmp_path / name, secret),
        },
    )


def start_members(
    tmp_path: Path, secrets: dict[str, str], interval: str = "2s"
) -> dict[str, DaemonProcess]:
    members = sorted(secrets)
    return {
        me: DaemonProcess(
            tmp_path,
            member_config(tmp_path, members, me, secrets[me], interval),
            name=f"m{me.rpartition(':')[2]}",
        )
        for me in members
    }


@pytest.fixture
def started() -> Iterator[list[DaemonProcess]]:
    daemons: list[DaemonProcess] = []
    try:
        yield daemons
    finally:
        for daemon in daemons:
            if daemon.proc.poll() is None:
                daemon.kill_all()


def rejected(daemon: DaemonProcess, member: str) -> float:
    value = daemon.value("netmon_group_messages_rejected_total", group="test", member=member)
    return value or 0.0


def refused(daemon: DaemonProcess, reason: str = "bad_handshake") -> float:
    value = daemon.value("netmon_group_store_refused_total", group="test", reason=reason)
    return value or 0.0


def test_a_member_with_the_wrong_secret_cannot_join(
    tmp_path: Path, started: list[DaemonProcess]
) -> None:
    good, bad = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    daemons = start_members(tmp_path, {good: "the right secret, 32 bytes long..", bad: "x" * 32})
    started.extend(daemons.values())
    honest, outsider = daemons[good], daemons[bad]
    # Each store refuses the other's handshakes before anything is read or stored.
    wait_until(lambda: refused(honest) >= 3, 60, "the outsider's handshakes to be refused")
    wait_until(lambda: refused(outsider) >= 3, 60, "and the other way round")
    for daemon, other in ((honest, bad), (outsider, good)):
        assert daemon.value("netmon_group_member_up", group="test", member=other) == 0.0
        assert daemon.value("netmon_group_members", group="test") == 1.0
    wait_until(
        lambda: (
            (honest.value("netmon_probe_skips_total", probe="cross", reason="member_absent") or 0)
            >= 1
        ),
        60,
        "the honest member to skip its round for want of the outsider",
    )
    assert (honest.value("netmon_probe_runs_total", probe="cross") or 0) == 0
    assert (outsider.value("netmon_probe_runs_total", probe="cross") or 0) == 0
    assert "the right secret" not in honest.log() + outsider.log()


class Client:
    """Someone who speaks the member store's protocol to a member port, holding `secret`."""

    def __init__(self, member: str, secret: bytes) -> None:
        self.port = int(member.rpartition(":")[2])
        self.secret = secret

    def set(self, key: str, value: str) -> None:
        store.run("127.0.0.1", self.port, self.secret, "set", key, 10.0, value=value)

    def check(self, keys: list[str]) -> bool:
        return all(store.run("127.0.0.1", self.port, self.secret, "check", k, 10.0) for k in keys)

    def num_keys(self) -> int:
        return int(store.run("127.0.0.1", self.port, self.secret, "count", "", 10.0))


def test_an_intruder_cannot_inject_a_round_into_a_leaders_store(
    tmp_path: Path, started: list[DaemonProcess]
) -> None:
    lead, follow = sorted(f"127.0.0.1:{free_port()}" for _ in range(2))
    secret = "the group's secret, 32 bytes long"
    members = [lead, follow]
    # The leader has no group probe, so every round in its store is the intruder's.
    leader_config = member_config(tmp_path, members, lead, secret, "1h")
    leader_config["probes"] = [{"name": "local", "sizes": [8], "interval": "1h", "iters": 1}]
    leader = DaemonProcess(tmp_path, leader_config, name="leader")
    started.append(leader)
    follower = DaemonProcess(
        tmp_path, member_config(tmp_path, members, follow, secret, "1h"), name="follower"
    )
    started.append(follower)
    wait_until(
        lambda: follower.value("netmon_group_member_up", group="test", member=lead) == 1.0,
        60,
        "the follower to see the leader",
    )

    def inject(sealer: Sealer, wait_for_ready: bool = False) -> None:
        """A round for the follower in the leader's store, as anyone reaching its port could:
        plan and current, then (after the follower's readiness, if asked) go and port."""
        epoch = int(time.time() * 1000)
        prefix = f"netmon/{epoch}/"
        world = {"members": members, "host": "127.0.0.1", "ranks": {lead: [0], follow: [1]}}
        plan: list[tuple[str, dict[str, Any]]] = [
            (prefix + "plan", {"probe": "cross"}),
            ("netmon/current", {"epoch": epoch, "leader": lead, "t": time.time()}),
        ]
        go: list[tuple[str, dict[str, Any]]] = [
            (prefix + "go", {**world, "devices": []}),
            (prefix + "port", {"port": 1}),
        ]
        # The store admits only holders of the group's secret; this one seals with `sealer`.
        client = Client(lead, secret.encode())
        for key, body in plan if wait_for_ready else go + plan:
            client.set(key, sealer.seal(key, body))
        if wait_for_ready:
            wait_until(
                lambda: client.check([prefix + f"ready/{follow}"]), 30, "the follower's readiness"
            )
            for key, body in go:
                client.set(key, sealer.seal(key, body))

    # Without the group's secret the leader's store takes nothing at all: refused at the
    # handshake, and counted.
    guessed = b"a guessed secret, 32 bytes long."
    with pytest.raises((store.StoreError, OSError)):
        Client(lead, guessed).set("netmon/current", Sealer("test", guessed).seal("netmon/x", {}))
    wait_until(
        lambda: (
            (
                (
                    leader.value(
                        "netmon_group_store_refused_total", group="test", reason="bad_handshake"
                    )
                )
                or 0
            )
            >= 1
        ),
        30,
        "the leader to count the refused handshake",
    )
    # A value that reached the store (only a secret holder could write it) sealed with another
    # secret is still refused by the follower, heartbeat after heartbeat.
    inject(Sealer("test", guessed))
    wait_until(
        lambda: rejected(follower, lead) >= 3,
        30,
        "the follower to refuse the forged round, heartbeat after heartbeat",
    )
    assert (follower.value("netmon_probe_runs_total", probe="cross") or 0) == 0
    assert follower.value("netmon_group_member_up", group="test", member=lead) == 1.0
    assert "group message rejected" in follower.log()

    # A round decided before the follower saw it (here: go written with the plan) is not
    # joined even when it is genuine: late ranks would only disturb the ones rendezvousing.
    honest = Sealer("test", secret.encode())
    inject(honest)
    wait_until(
        lambda: "was decided before this member saw it" in follower.log(),
        30,
        "the follower to notice it is late",
    )
    assert (follower.value("netmon_probe_runs_total", probe="cross") or 0) == 0

    # The control: the same round sealed with the group's secret, in order, is taken, so it was
    # the secret alone that kept the forged one out.
    inject(honest, wait_for_ready=True)
    wait_until(
        lambda: (follower.value("netmon_probe_runs_total", probe="cross") or 0) >= 1,
        30,
        "the follower to take a round sealed with the right secret",
    )


def test_the_leaders_store_keeps_only_its_last_rounds(
    tmp_path: Path, started: list[DaemonProcess]
) -> None:
    from netmon.serve.rounds import ROUNDS_KEPT

    secret = "the group's secret, 32 bytes long"
    lead, follow = sorted(f"127.0.0.1:{free_port()}" for _ in range(2))
    daemons = start_members(tmp_path, {lead: secret, follow: secret}, interval="1s")
    started.extend(daemons.values())
    leaders_store = Client(lead, secret.encode())
    # hello and current, plus per kept round at most: plan, go, port and each member's readiness.
    bound = 2 + ROUNDS_KEPT * (3 + 2)
    counts = []
    for rounds in (2, 4, 6):
        wait_until(
            lambda n=rounds: (
                (daemons[follow].value("netmon_probe_runs_total", probe="cross") or 0) >= n
            ),
            120,
            f"{rounds} group rounds",
        )
        counts.append(leaders_store.num_keys())
    assert max(counts) <= bound, counts


def test_a_member_port_already_taken_is_a_one_line_error(tmp_path: Path) -> None:
    import socket
    import subprocess
    import sys

    me = f"127.0.0.1:{free_port()}"
    config = member_config(tmp_path, [me], me, "the group's secret, 32 bytes long", "1h")
    path = tmp_path / "taken.yaml"
    path.write_text(json.dumps(config))
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", int(me.rpartition(":")[2])))
        squatter.listen()
        done = subprocess.run(
            [sys.executable, "-m", "netmon", "serve", "--config", str(path)],
            capture_output=True,
            text=True,
            timeout=90,
        )
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("netmon:")]
    assert len(lines) == 1 and "Address already in use" in lines[0], done.stderr
    assert me in lines[0]
