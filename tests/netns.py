"""Network namespaces joined by veth pairs to a bridge: real links between test 'hosts'.

Each member namespace has `eth0` with 10.<net>.0.1<i>/24; the bridge lives in a namespace of
its own, so the host's networking is never touched. `tc ... tbf` on both ends of a member's veth
shapes that member's link in both directions (netem does not exist on this kernel). A Link's rate
can also be redrawn every second around a nominal one (`Link.noisy`): a cable whose bandwidth
wanders, as one shared with other traffic does.
"""

from __future__ import annotations

import os
import random
import subprocess
import threading
import time
import uuid
from collections.abc import Sequence
from types import TracebackType

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
        self._tbf("replace", rate)

    def _tbf(self, verb: str, rate: str) -> None:
        for name in self.names:
            done = subprocess.run(
                [
                    "tc",
                    "-n",
                    name,
                    "qdisc",
                    verb,
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
                capture_output=True,
                text=True,
                timeout=30,
            )
            if done.returncode != 0:
                raise RuntimeError(f"tc qdisc {verb} in {name} at {rate}: {done.stderr.strip()}")

    def noisy(self, nominal: float, sd: float, seed: int, period: float = 1.0) -> NoisyRate:
        """The cable's rate redrawn every `period` s around `nominal` (bits/s): a context
        manager whose thread stops, and is joined, on exit."""
        return NoisyRate(self, nominal, sd, seed, period)


class NoisyRate:
    """A Link's rate redrawn every `period` seconds from a background thread: nominal x
    (1 + sd z), z standard normal from a generator seeded with `seed`, clipped to
    [CLIP_LOW, CLIP_HIGH] x nominal so that a rare draw neither stalls the cable nor lifts it
    far over its nominal rate.

    Each redraw is a `tc qdisc change` of the tbf already on the cable (shaped at the start),
    so a qdisc that went missing fails loudly instead of being made anew. A change refills the
    bucket (the kernel's tbf_change): at most 256 KB a second passes unshaped, a few ms at the
    rates used here. A probe whose samples straddle a redraw sees two rates, and its own
    spread widens: at 10 % and one redraw a second, about one group round in ten of
    tests/test_group_netns.py came out `noisy`. An error in the thread ends it; `check()` and
    the exit raise it, so a cable that stopped wandering cannot pass for a noisy one."""

    CLIP_LOW, CLIP_HIGH = 0.6, 1.4

    def __init__(self, link: Link, nominal: float, sd: float, seed: int, period: float) -> None:
        self._link = link
        self._nominal = nominal
        self._sd = sd
        self._period = period
        self._random = random.Random(seed)
        # Held across a draw and its `tc` calls: a new nominal rate set from the test must not
        # be overwritten a moment later by a draw around the old one.
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._error: Exception | None = None
        self.factors: list[float] = []  # every factor drawn, in order: the noise applied
        self.rate = nominal  # bits/s set by the latest draw
        self._thread = threading.Thread(target=self._run, name="noisy-rate", daemon=True)

    def __enter__(self) -> NoisyRate:
        with self._lock:
            self._link.shape(self._rate_locked())
        self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.stop(raise_error=kind is None)

    def set_nominal(self, nominal: float) -> None:
        """Redraw around `nominal` now: a cut or a repair takes effect at once, not at the
        next tick."""
        with self._lock:
            self._nominal = nominal
            self._link._tbf("change", self._rate_locked())

    def check(self) -> None:
        """Raise the error that ended the thread, if one did."""
        if self._error is not None:
            raise AssertionError(f"the noisy rate stopped: {self._error!r}") from self._error

    def stop(self, raise_error: bool = True) -> None:
        self._stop.set()
        # A redraw under way may wait on its two `tc` calls (30 s each at most).
        self._thread.join(timeout=2 * 30 + 2 * self._period)
        if self._thread.is_alive():
            raise AssertionError("the noisy-rate thread did not stop")
        if raise_error:
            self.check()

    def _rate_locked(self) -> str:
        factor = 1.0 + self._sd * self._random.gauss(0.0, 1.0)
        factor = min(max(factor, self.CLIP_LOW), self.CLIP_HIGH)
        self.factors.append(factor)
        self.rate = self._nominal * factor
        return f"{round(self.rate)}bit"

    def _run(self) -> None:
        # Ticks on a fixed schedule from the start: a slow `tc` shortens the wait, never
        # shifts every later draw.
        tick = time.monotonic()
        while True:
            tick += self._period
            if self._stop.wait(max(0.0, tick - time.monotonic())):
                return
            try:
                with self._lock:
                    self._link._tbf("change", self._rate_locked())
            except Exception as error:  # handed to the test by check() and the exit
                self._error = error
                return
