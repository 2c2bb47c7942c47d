"""Shared test helpers: waiting on conditions with deadlines, and checks that nothing leaked."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import pytest

if TYPE_CHECKING:  # the harness imports this module
    from tests.daemon_harness import DaemonProcess

T = TypeVar("T")


def wait_for(condition: Callable[[], T | None], timeout: float, what: str, poll: float = 0.05) -> T:
    """Poll until `condition` returns something truthy; fail naming `what` at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(poll)


def live_processes(pids: Iterable[int]) -> list[int]:
    """PIDs that still exist, or any process still in one of their process groups."""
    wanted = set(pids)
    alive = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid, pgid = int(entry.name), int(fields[2])
        if pid in wanted or pgid in wanted:
            alive.append(pid)
    return alive


def shm_entries() -> set[str]:
    try:
        return set(os.listdir("/dev/shm"))
    except OSError:
        return set()


def listening_ports() -> set[int]:
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == "0A":  # LISTEN
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


@pytest.fixture
def daemons() -> Iterator[list[DaemonProcess]]:
    """Daemons a test starts (tests.daemon_harness), killed with their ranks if still running."""
    started: list[DaemonProcess] = []
    yield started
    for daemon in started:
        if daemon.proc.poll() is None:
            daemon.kill_all()
