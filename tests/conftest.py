"""Shared test helpers: waiting on conditions with deadlines, checks that nothing leaked, and the
suite's tiers (tests/tiers.py: each test marked pure, process or system from what it starts)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import pytest

from tests import tiers

if TYPE_CHECKING:  # the harness imports this module
    from netmon.probe.forking import Zygote
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


@pytest.fixture
def zygotes() -> Iterator[list[Zygote]]:
    """Rank zygotes a test makes (in the test itself: see tests/test_zygote.py), closed after."""
    made: list[Zygote] = []
    yield made
    for zygote in made:
        zygote.close()


def pytest_configure(config: pytest.Config) -> None:
    for tier in tiers.TIERS:
        config.addinivalue_line("markers", f"{tier}: the {tier} tier, set by tests/tiers.py")
    config.addinivalue_line(
        "markers", "alone: a test that measures, run alone by make test (tests/tiers.py ALONE)"
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test with its tier, from what its code and its fixtures call."""
    for item in items:
        function = getattr(item, "function", None)
        info = getattr(item, "_fixtureinfo", None)
        fixtures = {
            name: [definition.func for definition in definitions]
            for name, definitions in (info.name2fixturedefs.items() if info else ())
        }
        tier = tiers.of_test(function, fixtures)
        item.add_marker(getattr(pytest.mark, tier))
        module = getattr(getattr(item, "module", None), "__name__", None)
        if tiers.alone(module, getattr(item, "originalname", None)):
            item.add_marker(pytest.mark.alone)
        # Carried by every report of the test, so the tiers' figures add up in the process
        # that reports them (with pytest-xdist, not the one that collected the test).
        item.user_properties.append(("tier", tier))


# The seconds each tier's tests took (setup, call, teardown), and how many ran.
_TIER_SECONDS: dict[str, list[float]] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    tier = dict(report.user_properties).get("tier")
    if isinstance(tier, str):
        spent = _TIER_SECONDS.setdefault(tier, [0.0, 0.0])
        spent[0] += report.duration
        spent[1] += report.when == "call"


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Tests run and seconds taken per tier: the figures tests/README.md quotes."""
    if not _TIER_SECONDS:
        return
    terminalreporter.section("tiers")
    for tier in tiers.TIERS:
        seconds, count = _TIER_SECONDS.get(tier, [0.0, 0.0])
        if count:
            terminalreporter.write_line(f"{tier}: {count:.0f} tests, {seconds:.0f} s")


@pytest.fixture(autouse=True)
def _pure_starts_nothing(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test of the pure tier that starts a process fails, naming it: the tier rules are wrong
    for it (tests/tiers.py), and `make test-fast` would run it as cheap when it is not."""
    if request.node.get_closest_marker("pure") is None:
        yield
        return
    started: list[str] = []
    with pytest.MonkeyPatch.context() as patch:
        _record_starts(patch, started)
        yield
    if started:
        pytest.fail(f"a pure-tier test started a process ({started[0]}): see tests/tiers.py")


def _record_starts(patch: pytest.MonkeyPatch, started: list[str]) -> None:
    """Record, and let happen, every way the test's code could start a process."""
    import subprocess

    execute = subprocess.Popen._execute_child  # type: ignore[attr-defined]

    def execute_child(self: subprocess.Popen[Any], args: Any, *rest: Any, **kw: Any) -> Any:
        started.append(f"subprocess {args!r:.80}")
        return execute(self, args, *rest, **kw)

    patch.setattr(subprocess.Popen, "_execute_child", execute_child)
    for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "execv", "execve", "system"):
        original = getattr(os, name, None)
        if original is not None:
            patch.setattr(os, name, _recording(original, f"os.{name}", started))


def _recording(original: Callable[..., T], what: str, started: list[str]) -> Callable[..., T]:
    def call(*args: Any, **kwargs: Any) -> T:
        started.append(what)
        return original(*args, **kwargs)

    return call
