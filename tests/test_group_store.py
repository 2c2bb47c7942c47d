"""The member port's store (netmon.group.store): nothing unauthenticated is stored, nothing on the
node network can exhaust it.

The limits are checked on a real server in a thread with small pure helpers; the acceptance
figures (a flood of 8 MiB writes, a thousand idle sockets) against the real agent process, with
its RSS read from /proc.
"""

from __future__ import annotations

import datetime
import importlib
import resource
import socket
import struct
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from netmon.group import store
from netmon.group.link import GroupError, GroupLink
from netmon.group.store import StoreClient, StoreError, StoreServer, frame, split_frames
from netmon.listen import listen_on
from tests.daemon_harness import wait_until
from tests.group_harness import SECRET, store_agent
from tests.prometheus_harness import free_port

OTHER = b"a guessed secret, 32 bytes long."


# ---- frames, pure ----


def test_frames_split_whole_and_refuse_oversize_or_non_objects() -> None:
    buffer = bytearray(frame({"a": 1}) + frame({"b": 2}) + frame({"c": 3})[:5])
    assert split_frames(buffer, 64) == [{"a": 1}, {"b": 2}]
    assert len(buffer) == 5  # the partial third frame waits for the rest
    assert split_frames(bytearray(struct.pack(">I", 65)), 64) is None
    assert split_frames(bytearray(struct.pack(">I", 3) + b"[1]"), 64) is None


# ---- a real server in a thread ----


@pytest.fixture
def server() -> Iterator[StoreServer]:
    listener = listen_on("127.0.0.1")
    refused: list[str] = []
    running = StoreServer(listener, SECRET, refused.append)
    running.refused = refused  # type: ignore[attr-defined]
    thread = threading.Thread(target=running.serve_forever, daemon=True)
    thread.start()
    yield running
    running.stop()
    thread.join(5)
    listener.close()


def port_of(server: StoreServer) -> int:
    return int(server.listener.getsockname()[1])


def test_an_authenticated_client_sets_waits_checks_and_deletes(server: StoreServer) -> None:
    port = port_of(server)
    answers: list[object] = []
    waiter = threading.Thread(
        target=lambda: answers.append(store.run("127.0.0.1", port, SECRET, "get", "k", 10.0))
    )
    waiter.start()
    wait_until(lambda: server.waiters.get("k"), 10, "the get to wait for its key")
    assert store.run("127.0.0.1", port, SECRET, "set", "k", 5.0, value="v") is True
    waiter.join(10)
    assert answers == ["v"]
    assert store.run("127.0.0.1", port, SECRET, "check", "k", 5.0) is True
    assert store.run("127.0.0.1", port, SECRET, "delete", "k", 5.0) is True
    assert store.run("127.0.0.1", port, SECRET, "check", "k", 5.0) is False
    with pytest.raises(StoreError, match="not set"):
        store.run("127.0.0.1", port, SECRET, "get", "k", 0.3)
    assert server.refused == []  # type: ignore[attr-defined]


def test_a_wrong_secret_is_refused_at_the_handshake_and_stores_nothing(
    server: StoreServer,
) -> None:
    with pytest.raises((StoreError, OSError)):
        store.run("127.0.0.1", port_of(server), OTHER, "set", "k", 5.0, value="forged")
    assert server.values == {}
    wait_until(lambda: "bad_handshake" in server.refused, 10, "the refusal")  # type: ignore[attr-defined]


def test_a_frame_sent_without_a_handshake_closes_the_connection(server: StoreServer) -> None:
    with socket.create_connection(("127.0.0.1", port_of(server)), timeout=10) as raw:
        raw.sendall(frame({"op": "set", "key": "k", "value": "x"}))
        raw.sendall(struct.pack(">I", 8 << 20) + b"x" * 65536)
        assert read_until_closed(raw)
    assert server.values == {}


def read_until_closed(raw: socket.socket) -> bool:
    """True when the server closes the connection (reset counts) within the socket's timeout."""
    try:
        while raw.recv(65536):
            pass
    except ConnectionResetError:
        pass
    return True


def test_values_are_capped_one_by_one_and_in_all(server: StoreServer) -> None:
    port = port_of(server)
    with StoreClient("127.0.0.1", port, SECRET, 30.0) as client:
        with pytest.raises(StoreError, match="larger than"):
            client.request("set", "big", value="x" * (store.MAX_VALUE + 1))
        value = "x" * (store.MAX_VALUE - 64)
        with pytest.raises(StoreError, match="wrote its limit"):
            for n in range(store.MAX_TOTAL // len(value) + 1):
                client.request("set", f"k{n}", value=value)
    assert server.total_bytes <= store.MAX_PER_ADDRESS <= store.MAX_TOTAL
    assert {"value_too_large", "address_full"} <= set(server.refused)  # type: ignore[attr-defined]


def test_nonsense_from_a_secret_holder_closes_its_connection_only(server: StoreServer) -> None:
    port = port_of(server)
    client = StoreClient("127.0.0.1", port, SECRET, 10.0)
    with client, pytest.raises(StoreError, match="closed"):
        client.request("get", "k", wait="soon")
    assert "bad_frame" in server.refused  # type: ignore[attr-defined]
    assert store.run("127.0.0.1", port, SECRET, "set", "k", 5.0, value="v") is True


def test_a_silent_connection_is_closed_after_the_handshake_deadline(
    server: StoreServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store, "HANDSHAKE_S", 0.5)
    with socket.create_connection(("127.0.0.1", port_of(server)), timeout=20) as raw:
        assert read_until_closed(raw)
    assert "handshake_timeout" in server.refused  # type: ignore[attr-defined]


# ---- the real agent ----


@pytest.fixture
def agent() -> Iterator[GroupLink]:
    with store_agent() as link:
        yield link


def agent_pid(link: GroupLink) -> int:
    assert link._proc is not None
    return link._proc.pid


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_the_agent_imports_no_torch(agent: GroupLink) -> None:
    maps = Path(f"/proc/{agent_pid(agent)}/maps").read_text()
    assert "libtorch" not in maps


def test_a_flood_of_unauthenticated_8_mib_writes_is_refused_and_costs_no_memory(
    agent: GroupLink,
) -> None:
    """The review's reproduction: 40 torch TCPStore clients each setting an 8 MiB value on the
    member port at once (torch's store took them all: 221 -> 557 MiB in 2.4 s)."""
    assert agent.me is not None
    dist: Any = importlib.import_module("torch.distributed")
    pid = agent_pid(agent)
    before = rss_bytes(pid)
    outcomes: list[str] = []

    def write(n: int) -> None:
        try:
            client = dist.TCPStore(
                "127.0.0.1",
                agent.port,
                is_master=False,
                timeout=datetime.timedelta(seconds=3),
                wait_for_workers=False,
            )
            client.set(f"key{n}", b"\0" * (8 << 20))
            outcomes.append("stored")
        except Exception:  # torch raises DistNetworkError or RuntimeError: refused
            outcomes.append("refused")

    writers = [threading.Thread(target=write, args=(n,)) for n in range(40)]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join(60)
    assert outcomes == ["refused"] * 40
    assert rss_bytes(pid) - before < 64 << 20
    assert agent.check(agent.me, "key0") is False  # nothing of it was stored
    agent.set(agent.me, "netmon/ok", "still answers")
    assert agent.get(agent.me, "netmon/ok", 5.0) == "still answers"


def open_files_limit(pid: int) -> int:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            return int(line.split()[3])
    raise AssertionError("no Max open files")


def test_a_thousand_idle_connections_do_not_keep_a_member_out() -> None:
    """The agent starts with a soft limit of 256 descriptors (as the review's node had), and a
    thousand idle sockets are held open at its member port while a member sets and gets."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert hard >= 1200, "the test needs a hard RLIMIT_NOFILE above a thousand sockets"
    member = f"127.0.0.1:{free_port()}"
    link = GroupLink(int(member.rpartition(":")[2]), "127.0.0.1", member, secret=SECRET)
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))  # what the agent inherits
    try:
        link.start()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 4096)), hard))
    idle = []
    try:
        assert open_files_limit(agent_pid(link)) == hard  # raised at start
        for _ in range(1000):
            idle.append(socket.create_connection(("127.0.0.1", link.port), timeout=30))
        # Every one of them is still open on this side while a member sets and gets.
        link.set(member, "netmon/1/ready/b", "sealed")
        assert link.get(member, "netmon/1/ready/b", 10.0) == "sealed"
        with pytest.raises(GroupError):  # a key that never came is still told apart
            link.get(member, "netmon/never", 0.2)
    finally:
        for sock in idle:
            sock.close()
        link.stop()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_member_round_completes_with_a_thousand_idle_sockets_at_the_leaders_port(
    tmp_path: Path,
) -> None:
    """Two daemons started at a soft limit of 256 descriptors; a thousand idle sockets held at
    the leader's member port; the group's rounds go on."""
    from tests.test_group_auth import start_members

    secret = "the group's secret, 32 bytes long"
    lead, follow = sorted(f"127.0.0.1:{free_port()}" for _ in range(2))
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))  # what the daemons inherit
    try:
        daemons = start_members(tmp_path, {lead: secret, follow: secret}, interval="1s")
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 4096)), hard))
    idle = []
    try:
        follower = daemons[follow]

        def rounds() -> float:
            return follower.value("netmon_probe_runs_total", probe="cross") or 0.0

        wait_until(lambda: rounds() >= 1, 120, "a first group round")
        port = int(lead.rpartition(":")[2])
        for _ in range(1000):
            idle.append(socket.create_connection(("127.0.0.1", port), timeout=30))
        before = rounds()
        wait_until(lambda: rounds() >= before + 2, 120, "two more rounds with the sockets open")
        refused = daemons[lead].value(
            "netmon_group_store_refused_total", group="test", reason="evicted"
        )
        assert (refused or 0) >= 1000 - store.PENDING_PER_ADDRESS
    finally:
        for sock in idle:
            sock.close()
        for daemon in daemons.values():
            daemon.kill_all()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
