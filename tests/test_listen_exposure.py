"""The daemon's warning for /metrics that anyone on the node's own network can read: a listen
address other than loopback, no basic auth nor client certificates, in PID 1's network
namespace (the host's, for a process that sees the host's PIDs). The decision is pure; one real
daemon shows the line in its log."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from netmon.listen import exposure_warning, is_loopback_host, shares_pid1_network
from tests.conftest import wait_for
from tests.daemon_harness import fast_config

SERVING = re.compile(r"listen\W+https?://\S+/metrics")


def _proc(tmp_path: Path, same: bool) -> Path:
    """A /proc with self/ns/net and 1/ns/net: one file twice (a hard link) or two files."""
    proc = tmp_path / "proc"
    for pid in ("self", "1"):
        (proc / pid / "ns").mkdir(parents=True)
    (proc / "self" / "ns" / "net").write_text("")
    if same:
        os.link(proc / "self" / "ns" / "net", proc / "1" / "ns" / "net")
    else:
        (proc / "1" / "ns" / "net").write_text("")
    return proc


def test_pid1s_network_namespace_is_told_by_the_namespace_files(tmp_path: Path) -> None:
    assert shares_pid1_network(_proc(tmp_path / "a", same=True)) is True
    assert shares_pid1_network(_proc(tmp_path / "b", same=False)) is False
    assert shares_pid1_network(tmp_path / "missing") is False  # another user's PID 1


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "[::]", "10.0.0.7", "gpu-a1"])
def test_a_reachable_address_without_credentials_on_the_hosts_network_is_warned_about(
    host: str,
) -> None:
    warning = exposure_warning(host, 19464, authenticated=False, host_network=True)
    assert warning is not None and "\n" not in warning
    assert "without authentication" in warning and "--web-config" in warning
    assert ("every address of this node" in warning) == (host in ("0.0.0.0", "::", "[::]"))


@pytest.mark.parametrize(
    ("host", "authenticated", "host_network"),
    [
        ("127.0.0.1", False, True),
        ("::1", False, True),
        ("localhost", False, True),
        ("0.0.0.0", True, True),  # basic auth or client certificates
        ("0.0.0.0", False, False),  # a pod network: only what routes to the pod
    ],
)
def test_no_warning_where_nothing_unauthenticated_is_on_the_hosts_network(
    host: str, authenticated: bool, host_network: bool
) -> None:
    assert exposure_warning(host, 19464, authenticated, host_network) is None


def test_loopback_hosts() -> None:
    assert is_loopback_host("127.0.0.2") and is_loopback_host("[::1]")
    assert not is_loopback_host("10.0.0.7") and not is_loopback_host("gpu-a1")


@pytest.mark.parametrize(("listen", "warned"), [("0.0.0.0:0", True), ("127.0.0.1:0", False)])
def test_the_daemon_warns_when_it_serves_unauthenticated_on_a_wildcard_in_pid1s_network(
    listen: str, warned: bool, tmp_path: Path
) -> None:
    """The real `netmon serve` as PID 1 of a PID namespace of its own (unshare, root), in this
    network namespace: as a container on a node's network sees itself, so it warns where the
    address is not loopback, and only there."""
    config_path = tmp_path / "netmon.yaml"
    config_path.write_text(yaml.safe_dump(fast_config(tmp_path, listen=listen, probes=[])))
    log_path = tmp_path / "netmon.log"
    command = ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child=SIGTERM"]
    command += [sys.executable, "-m", "netmon", "serve", "--config", str(config_path)]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: SERVING.search(log_path.read_text()), 60, "the daemon to listen")
    finally:
        # unshare ignores SIGTERM while it waits; killed, it has the kernel send its child
        # (the daemon, PID 1 of its namespace) SIGTERM, and the namespace ends with it.
        children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children")
        daemon = [int(pid) for pid in children.read_text().split()] if children.exists() else []
        proc.kill()
        proc.wait(timeout=30)
        left = [Path(f"/proc/{pid}") for pid in daemon]
        wait_for(lambda: not any(p.exists() for p in left), 60, "the daemon to end")
    text = log_path.read_text()
    assert ("without authentication" in text) == warned, text
    if warned:
        assert "every address of this node" in text
