"""Network namespaces joined by veth pairs to a bridge: real links between test 'hosts'.

Each member namespace has `eth0` with 10.<net>.0.1<i>/24; the bridge lives in a namespace of
its own, so the host's networking is never touched. `tc ... tbf` on both ends of a member's veth
shapes that member's link in both directions (netem does not exist on this kernel).
"""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Sequence

import pytest


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


def require_root() -> None:
    if os.geteuid() != 0:
        pytest.fail("network namespace tests need root (CI and the dev machines run as root)")


class _Spaces:
    """Namespaces this test made, each with a tag, and their removal."""

    def __init__(self) -> None:
        require_root()
        self.tag = uuid.uuid4().hex[:6]
        self._created: list[str] = []

    def _add(self, name: str) -> None:
        _ip("netns", "add", name)
        self._created.append(name)

    def remove(self) -> None:
        for name in reversed(self._created):
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)
        self._created.clear()

    def pids(self, name: str) -> list[int]:
        """Processes whose network namespace is `name`: what must be gone before it is deleted."""
        listed = subprocess.run(
            ["ip", "netns", "pids", name], capture_output=True, text=True, timeout=30
        ).stdout
        return [int(pid) for pid in listed.split()]

    def existing(self) -> list[str]:
        listed = subprocess.run(
            ["ip", "netns", "list"], capture_output=True, text=True, timeout=30
        ).stdout
        return [
            line.split()[0]
            for line in listed.splitlines()
            if line.split() and self.tag in line.split()[0]
        ]


class Namespaces(_Spaces):
    """`members` namespaces on one bridge; member i is named nm<tag>-<labels[i]> (default: i)."""

    def __init__(self, members: int, net: int = 231, labels: Sequence[str] | None = None) -> None:
        super().__init__()
        self.net = net
        self.bridge_ns = f"nmb{self.tag}"
        labels = [str(i) for i in range(members)] if labels is None else list(labels)
        if len(labels) != members:
            raise ValueError(f"{members} members but {len(labels)} labels")
        self.names = [f"nm{self.tag}-{label}" for label in labels]
        try:
            self._build()
        except BaseException:
            self.remove()
            raise

    def address(self, member: int) -> str:
        return f"10.{self.net}.0.1{member}"

    def _build(self) -> None:
        self._add(self.bridge_ns)
        _ip("-n", self.bridge_ns, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.bridge_ns, "link", "set", "br0", "up")
        for member, name in enumerate(self.names):
            _ip("netns", "add", name)
            self._created.append(name)
            _ip(
                "-n",
                self.bridge_ns,
                "link",
                "add",
                f"v{member}",
                "type",
                "veth",
                "peer",
                "name",
                "eth0",
                "netns",
                name,
            )
            _ip("-n", self.bridge_ns, "link", "set", f"v{member}", "master", "br0", "up")
            _ip("-n", name, "addr", "add", f"{self.address(member)}/24", "dev", "eth0")
            _ip("-n", name, "link", "set", "eth0", "up")
            _ip("-n", name, "link", "set", "lo", "up")

    def wrapper(self, placeholder: str = "{gpu}") -> str:
        return f"ip netns exec nm{self.tag}-{placeholder}"

    def host_template(self) -> str:
        return f"10.{self.net}.0.1{{gpu}}"

    def shape(self, member: int, rate: str = "1gbit") -> None:
        for namespace, device in ((self.names[member], "eth0"), (self.bridge_ns, f"v{member}")):
            subprocess.run(
                [
                    "tc",
                    "-n",
                    namespace,
                    "qdisc",
                    "replace",
                    "dev",
                    device,
                    "root",
                    "tbf",
                    "rate",
                    rate,
                    "burst",
                    "256kb",
                    "latency",
                    "100ms",
                ],
                check=True,
                capture_output=True,
                timeout=30,
            )

    def unshape(self, member: int) -> None:
        for namespace, device in ((self.names[member], "eth0"), (self.bridge_ns, f"v{member}")):
            subprocess.run(
                ["tc", "-n", namespace, "qdisc", "del", "dev", device, "root"],
                check=True,
                capture_output=True,
                timeout=30,
            )


class Link(_Spaces):
    """Two namespaces joined by one veth pair: two hosts and the cable between them."""

    def __init__(self, net: int = 233) -> None:
        super().__init__()
        self.names = [f"nl{self.tag}-a", f"nl{self.tag}-b"]
        self.addresses = [f"10.{net}.0.1", f"10.{net}.0.2"]
        try:
            for name in self.names:
                self._add(name)
            _ip(
                "-n",
                self.names[0],
                "link",
                "add",
                "eth0",
                "type",
                "veth",
                "peer",
                "name",
                "eth0",
                "netns",
                self.names[1],
            )
            for name, address in zip(self.names, self.addresses, strict=True):
                _ip("-n", name, "addr", "add", f"{address}/24", "dev", "eth0")
                _ip("-n", name, "link", "set", "eth0", "up")
                _ip("-n", name, "link", "set", "lo", "up")
        except BaseException:
            self.remove()
            raise

    def shape(self, rate: str) -> None:
        """The cable's rate, both directions (tbf on each end's egress)."""
        for name in self.names:
            subprocess.run(
                [
                    "tc",
                    "-n",
                    name,
                    "qdisc",
                    "replace",
                    "dev",
                    "eth0",
                    "root",
                    "tbf",
                    "rate",
                    rate,
                    "burst",
                    "256kb",
                    "latency",
                    "200ms",
                ],
                check=True,
                capture_output=True,
                timeout=30,
            )
