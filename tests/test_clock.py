"""The schedule on a steady clock: a step of the wall clock, back or forward, moves every job's
next run by the step (pure, with injected clocks) and a real daemon whose wall clock steps an
hour back and then forward (libfaketime at the process boundary) keeps probing on its interval."""

from __future__ import annotations

import shutil
import time
from datetime import datetime, timedelta, timezone
from functools import partial
from pathlib import Path

import pytest

from netmon.baseline.state import is_temporary_of
from netmon.serve.runner import STATE_FILE
from netmon.serve.steady import ClockWatch, SteadyScheduler, clock_step, shifted
from netmon.serve.sweep_inbox import STATE_FILE as SWEEP_FILE
from tests.conftest import wait_for
from tests.daemon_harness import DaemonProcess, fast_config

HOUR = 3600.0
T0 = datetime(2026, 12, 1, 21, 0, tzinfo=timezone.utc)


def test_a_step_is_a_jump_of_the_offset_not_a_slew() -> None:
    assert clock_step(100.0, 100.0004) is None  # NTP's slew between two looks
    assert clock_step(100.0, 100.0 - HOUR) == -HOUR
    assert clock_step(100.0, 100.0 + HOUR) == HOUR
    assert clock_step(100.0, 100.9, threshold=1.0) is None


def test_every_next_run_moves_by_the_step_and_paused_jobs_stay() -> None:
    runs = {"small": T0, "large": T0 + timedelta(seconds=2), "paused": None}
    assert shifted(runs, -HOUR) == {
        "small": T0 - timedelta(hours=1),
        "large": T0 + timedelta(seconds=2) - timedelta(hours=1),
    }


def test_the_watch_sees_each_step_once_and_never_adds_up_slews() -> None:
    wall, mono = [1000.0], [5.0]
    watch = ClockWatch(lambda: wall[0], lambda: mono[0])
    mono[0] += 3.0
    wall[0] += 3.0
    assert watch.step() is None
    wall[0] -= HOUR
    assert watch.step() == -HOUR
    assert watch.step() is None  # the same step is not seen again
    for _ in range(10):  # ten slews of 0.5 s: each below the threshold, never one step
        wall[0] += 0.5
        assert watch.step() is None


def test_a_running_scheduler_moves_its_jobs_when_it_wakes_after_a_step() -> None:
    offset = [0.0]
    watch = ClockWatch(lambda: time.time() + offset[0])
    told: list[float] = []
    scheduler = SteadyScheduler(watch=watch, on_step=told.append, timezone="UTC")
    scheduler.start(paused=True)  # nothing runs: only the next run times matter here
    try:
        soon = datetime.now(timezone.utc) + timedelta(seconds=30)
        for number, name in enumerate(("small", "large")):
            when = soon + timedelta(seconds=number)
            scheduler.add_job(print, "interval", seconds=2, id=name, next_run_time=when)
        offset[0] = -HOUR  # what the watch will see at the scheduler's next wake
        scheduler.wakeup()

        def moved() -> bool:
            # By the step the watch measured: an hour, give or take the microseconds between
            # its reads of the two clocks.
            runs = {job.id: job.next_run_time for job in scheduler.get_jobs()}
            due = {"small": soon - timedelta(hours=1), "large": soon - timedelta(seconds=3599)}
            return runs.keys() == due.keys() and all(
                abs((runs[job] - due[job]).total_seconds()) < 0.5 for job in due
            )

        wait_for(moved, 30, "the next runs moved back by the hour")
        assert scheduler.steps == 1
        assert len(told) == 1 and abs(told[0] + HOUR) < 0.5
    finally:
        scheduler.shutdown(wait=False)


# --- a real daemon whose wall clock steps

# libfaketime 0.9.10, leaving the monotonic clock alone, fails clock_nanosleep on that clock with
# EINVAL, and Python's time.sleep sleeps so (3.11). A wait with a timeout sleeps on the same
# clock through pthread_cond_timedwait, which it passes through: the daemon and its ranks sleep
# on that instead. Test-side, at the process boundary (sitecustomize); netmon is not changed.
_SITECUSTOMIZE = """
import threading
import time

_never = threading.Event()


def _sleep(seconds):
    if seconds < 0:
        raise ValueError("sleep length must be non-negative")
    _never.wait(seconds)


time.sleep = _sleep
"""


def _libfaketime() -> Path:
    for directory in ("/usr/lib/x86_64-linux-gnu/faketime", "/usr/lib/aarch64-linux-gnu/faketime"):
        path = Path(directory) / "libfaketime.so.1"
        if path.exists():
            return path
    pytest.fail("libfaketime is missing: scripts/test-deps installs it (Debian's faketime)")


def _persisting(state: Path) -> set[str]:
    """The names in `state` that outlive a save: a save under way has a write_atomic temporary
    there that its rename takes away, which is no file of the directory deleted."""
    names = {p.name for p in state.iterdir()}
    return {n for n in names if not any(is_temporary_of(f, n) for f in (STATE_FILE, SWEEP_FILE))}


def test_probes_keep_their_interval_across_an_hour_back_and_an_hour_forward(
    daemons: list[DaemonProcess], tmp_path: Path
) -> None:
    assert shutil.which("faketime"), "scripts/test-deps installs faketime"
    offset = tmp_path / "faketime"
    offset.write_text("+0\n")
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(_SITECUSTOMIZE)
    env = {
        "PYTHONPATH": str(site),
        "LD_PRELOAD": str(_libfaketime()),
        # Read at every call, so the test steps the daemon's wall clock while it runs; the
        # monotonic clock is left alone, as a real step leaves it.
        "FAKETIME_TIMESTAMP_FILE": str(offset),
        "FAKETIME_NO_CACHE": "1",
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
    }
    probes = [{"name": "small", "sizes": [8], "interval": "2s", "iters": 3, "warmup": 1}]
    daemon = DaemonProcess(tmp_path, fast_config(tmp_path, probes=probes), env=env)
    daemons.append(daemon)

    def runs() -> float:
        return daemon.value("netmon_probe_runs_total", probe="small") or 0.0

    def runs_at_least(count: float) -> float | None:
        now = runs()
        return now if now >= count else None

    wait_for(lambda: runs_at_least(2), 120, "two probe runs before any step")
    state = tmp_path / "state"
    # A result is saved after it is counted: the book's first save may still be under way.
    wait_for((state / STATE_FILE).exists, 30, "the baseline book saved")
    kept = _persisting(state)
    for step, written in ((-HOUR, "-3600\n"), (HOUR, "+0\n")):
        # Whole or not at all: libfaketime reads the file at every call, and a write_text
        # truncates before it writes; a read between saw no offset, a step back to the real
        # clock and forward again, and the daemon counted 4 steps for 2 (a CI run).
        staged = offset.with_suffix(".new")
        staged.write_text(written)
        staged.replace(offset)
        before = runs()
        # Two runs at a 2 s interval: seconds, however busy the machine; an hour without.
        wait_for(partial(runs_at_least, before + 2), 90, f"probes after a {step:+} s step")
        assert f"the wall clock stepped by {step:+.1f} s" in daemon.log()
    assert STATE_FILE in kept and kept <= _persisting(state), "nothing in state_dir was deleted"
    assert daemon.value("netmon_clock_steps_total") == 2.0
    assert daemon.stop() == 0
    assert "Traceback" not in daemon.log()
