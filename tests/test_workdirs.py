"""Probe directories: a live probe's is kept, a killed one's is removed by the next probe."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from netmon.probe.workdirs import (
    LOCK,
    MAKING,
    PREFIX,
    UNLOCKED_GRACE_S,
    probe_workdir,
    remove_stale,
)

HOLDER = """
import sys, time
from pathlib import Path
from netmon.probe.workdirs import probe_workdir
with probe_workdir(Path(sys.argv[1])) as path:
    (path / "rank0.stderr").write_text("a rank's last words")
    print(path, flush=True)
    time.sleep(600)
"""


def _holder(root: Path) -> tuple[subprocess.Popen[str], Path]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(root)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    return proc, Path(proc.stdout.readline().strip())


def test_a_killed_probes_directory_goes_and_a_live_ones_stays(tmp_path: Path) -> None:
    killed, killed_dir = _holder(tmp_path)
    live, live_dir = _holder(tmp_path)
    try:
        os.kill(killed.pid, signal.SIGKILL)  # its lock goes with it, its directory stays
        killed.wait(10)
        assert (killed_dir / "rank0.stderr").exists()
        with probe_workdir(tmp_path) as mine:
            assert not killed_dir.exists()
            assert (live_dir / "rank0.stderr").exists()
            assert remove_stale(tmp_path) == []  # neither the live one nor this one
            assert mine.is_dir()
        assert not mine.exists()
    finally:
        live.kill()
        live.wait(10)
    assert remove_stale(tmp_path) == [live_dir.name]
    assert list(tmp_path.iterdir()) == []


def test_only_old_unlocked_directories_of_ours_are_removed(tmp_path: Path) -> None:
    # (Another user's directory is skipped by its owner; that needs a second user to show.)
    making = tmp_path / f"{PREFIX}making"  # mkdtemp done, lock not yet made
    making.mkdir()
    old = tmp_path / f"{PREFIX}old"  # left by a netmon from before the lock
    old.mkdir()
    (old / "rank1.stderr").write_text("")
    past = time.time() - UNLOCKED_GRACE_S - 5
    os.utime(old, (past, past))
    plain_file = tmp_path / f"{PREFIX}file"
    plain_file.write_text("not a directory")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / LOCK).write_text("")
    link = tmp_path / f"{PREFIX}link"
    link.symlink_to(elsewhere, target_is_directory=True)
    other = tmp_path / "other-probe"
    other.mkdir()
    assert remove_stale(tmp_path) == [old.name]
    assert {p.name for p in tmp_path.iterdir()} == {
        making.name,
        plain_file.name,
        elsewhere.name,
        link.name,
        other.name,
    }
    assert (elsewhere / LOCK).exists()  # a link is never followed


def test_a_missing_root_removes_nothing(tmp_path: Path) -> None:
    assert remove_stale(tmp_path / "missing") == []


def test_probes_made_at_once_never_remove_each_others_directories(tmp_path: Path) -> None:
    """A pair sweep makes every pair's directory at the same moment, in threads: each probe's
    clean-up runs while the others make and lock theirs."""
    lost: list[str] = []
    made = [0]

    def probe_again_and_again() -> None:
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            with probe_workdir(tmp_path) as path:
                try:
                    (path / "rank0.stderr").write_text("")
                except OSError as exc:
                    lost.append(str(exc))
                made[0] += 1

    threads = [threading.Thread(target=probe_again_and_again) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert made[0] > 100 and lost == []
    assert list(tmp_path.iterdir()) == []


def test_a_directory_left_while_being_made_goes_once_old(tmp_path: Path) -> None:
    making = tmp_path / f"{MAKING}abc"
    making.mkdir()
    (making / LOCK).write_text("")  # made, its lock not yet taken: kept while young
    assert remove_stale(tmp_path) == []
    assert remove_stale(tmp_path, now=time.time() + UNLOCKED_GRACE_S + 5) == [making.name]
