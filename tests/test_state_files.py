"""The baseline state file never lies: saves killed midway leave nothing once a daemon starts
again (and nothing but their own temporaries is removed), and a file that is there but unusable
is counted by reason, set aside with its references intact, or refused, never a first start."""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import signal
import subprocess
import sys
import time
from multiprocessing.synchronize import Event as EventType
from pathlib import Path

import pytest

from netmon import baseline
from netmon.baseline.state import is_temporary_of, remove_stale_temporaries, write_atomic
from netmon.errors import UsageError
from netmon.serve.keeper import BaselineKeeper
from tests.daemon_harness import DaemonProcess, fast_config

STATE = "baselines.json"
NO_REASONS = {"corrupt": 0, "unreadable": 0, "version": 0}
PROBES = [{"name": "small", "sizes": [8], "interval": "1s", "iters": 3, "warmup": 1}]


def _save_forever(path: Path, data: bytes, saving: EventType) -> None:
    """A large saved book written as fast as it can be, the way every save writes (save() is
    its encoding, then write_atomic); killed at random points."""
    saving.set()
    while True:
        write_atomic(path, data)


def large_state(series: int) -> bytes:
    """A saved book of `series` learned series (one learned, its entry repeated over sizes:
    learning thousands one result at a time would take the test longer than the kills)."""
    book = baseline.BaselineBook(baseline.BaselinePolicy(min_samples=2, window=20))
    for n in range(20):
        book.observe(("small", "all_reduce", 8, "default", 2), 1e9 + n, at=1e9 + n)
    doc = book.to_json()
    entries = doc["baselines"]
    assert isinstance(entries, list) and len(entries) == 1
    doc["baselines"] = [{**entries[0], "size_bytes": 8 + size} for size in range(series)]
    return json.dumps(doc).encode()


def temporaries(state: Path) -> list[str]:
    return sorted(p.name for p in state.iterdir() if is_temporary_of(STATE, p.name))


def test_only_write_atomics_own_temporaries_are_removed(tmp_path: Path) -> None:
    ours = [".baselines.json.k2_x9abc.tmp", ".sweep.json.00000000.tmp"]
    for name in ours:
        (tmp_path / name).write_bytes(b"{")
    # Near misses of the pattern, a link and a directory of exactly the pattern, the state
    # itself: none of them made by a save, none removed.
    kept = [
        ".baselines.json.k2_x9abcd.tmp",
        ".baselines.json.K2_X9ABC.tmp",
        "baselines.json.k2_x9abc.tmp",
        ".baselines.json.k2_x9abc.tmp.bak",
        ".other.json.k2_x9abc.tmp",
        STATE,
    ]
    for name in kept:
        (tmp_path / name).write_bytes(b"{}")
    (tmp_path / "elsewhere").write_bytes(b"precious")
    (tmp_path / ".baselines.json.linkedxx.tmp").symlink_to(tmp_path / "elsewhere")
    (tmp_path / ".baselines.json.adirecto.tmp").mkdir()
    others = []
    if os.geteuid() == 0:  # only root can give a file to another user
        other = tmp_path / ".baselines.json.nobodys_.tmp"
        other.write_bytes(b"{")
        os.chown(other, 65534, 65534)
        others.append(other.name)
    removed = remove_stale_temporaries(tmp_path, (STATE, "sweep.json"))
    assert sorted(p.name for p in removed) == sorted(ours)
    left = {p.name for p in tmp_path.iterdir()}
    assert left == {
        *kept,
        "elsewhere",
        ".baselines.json.linkedxx.tmp",
        ".baselines.json.adirecto.tmp",
        *others,
    }
    assert (tmp_path / "elsewhere").read_bytes() == b"precious"


def test_thirty_saves_killed_midway_leave_nothing_once_the_daemon_starts(
    daemons: list[DaemonProcess], tmp_path: Path
) -> None:
    state = tmp_path / "state"
    state.mkdir()
    data = large_state(4000)
    chooser = random.Random(44)
    # Forked, not spawned: 30 interpreter starts would take most of the test's time.
    forked = multiprocessing.get_context("fork")
    for _ in range(30):
        saving = forked.Event()
        saver = forked.Process(target=_save_forever, args=(state / STATE, data, saving))
        saver.start()
        try:
            assert saving.wait(30), "the saver did not start"
            time.sleep(chooser.uniform(0, 0.05))  # a random point of some save, not a wait
        finally:
            saver.kill()
            saver.join(30)
        assert saver.exitcode == -signal.SIGKILL
    left = temporaries(state)
    assert left, "the kills were meant to land inside saves"
    assert sum((state / name).stat().st_size for name in left) > 0
    # Not ours, though in the state directory: stays.
    (state / "notes.tmp").write_text("the operator's")

    config = fast_config(tmp_path, probes=PROBES)
    (tmp_path / "pause").touch()  # nothing is measured: the book is the one saved
    daemon = DaemonProcess(tmp_path, config)
    daemons.append(daemon)
    assert temporaries(state) == []
    assert (state / "notes.tmp").read_text() == "the operator's"
    assert f"removed {len(left)} temporary file(s) left by interrupted saves" in daemon.log()
    samples = daemon.scrape()
    assert samples[("netmon_baseline_restored", frozenset())] == 1.0
    for reason in NO_REASONS:
        assert samples[("netmon_state_errors_total", frozenset({("reason", reason)}))] == 0.0
    assert daemon.stop() == 0


# --- a file that is there but unusable


def _keeper(state: Path, refuse: bool = False) -> BaselineKeeper:
    return BaselineKeeper.open(state / STATE, baseline.BaselinePolicy(), {}, refuse)


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b'{"version": 3, "baselines": [{"probe": ', "corrupt"),
        (b"\xff\xfe not even text", "corrupt"),
        (b'{"version": 99, "baselines": []}', "version"),
    ],
)
def test_an_unusable_file_is_counted_and_set_aside_whole(
    tmp_path: Path, content: bytes, reason: str
) -> None:
    (tmp_path / STATE).write_bytes(content)
    keeper = _keeper(tmp_path)
    assert not keeper.restored
    assert keeper.state_errors() == {**NO_REASONS, reason: 1}
    aside = list(tmp_path.glob(f"{STATE}.corrupt-*"))
    assert len(aside) == 1 and aside[0].read_bytes() == content
    assert not (tmp_path / STATE).exists()


def test_a_first_start_and_an_unreadable_file_are_told_apart(tmp_path: Path) -> None:
    first = _keeper(tmp_path)
    assert not first.restored and first.state_errors() == NO_REASONS
    (tmp_path / STATE).mkdir()  # there, but cannot be read as a file
    unreadable = _keeper(tmp_path)
    assert unreadable.state_errors() == {**NO_REASONS, "unreadable": 1}
    assert (tmp_path / STATE).is_dir()  # not ours to move


def test_refuse_leaves_the_file_in_place_and_names_the_setting(tmp_path: Path) -> None:
    content = b'{"version": 3, "baselines": [{"probe": '
    (tmp_path / STATE).write_bytes(content)
    with pytest.raises(
        UsageError, match=r"state_on_corrupt is refuse: .*state_on_corrupt: continue"
    ):
        _keeper(tmp_path, refuse=True)
    assert (tmp_path / STATE).read_bytes() == content
    assert list(tmp_path.glob(f"{STATE}.corrupt-*")) == []


def test_a_daemon_counts_a_corrupt_state_or_refuses_to_start_over_it(
    daemons: list[DaemonProcess], tmp_path: Path
) -> None:
    state = tmp_path / "state"
    state.mkdir()
    good = baseline.BaselineBook(baseline.BaselinePolicy(min_samples=2))
    for n in range(3):
        good.observe(("small", "all_reduce", 8, "default", 2), 5e9, at=1e9 + n)
    baseline.save(state / STATE, good)
    torn = (state / STATE).read_bytes()[:-40]  # what a torn file would be
    (state / STATE).write_bytes(torn)
    (tmp_path / "pause").touch()

    refusing = fast_config(tmp_path, probes=PROBES, state_on_corrupt="refuse")
    (tmp_path / "refusing.yaml").write_text(json.dumps(refusing))
    done = subprocess.run(
        [sys.executable, "-m", "netmon", "serve", "--config", str(tmp_path / "refusing.yaml")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "state_on_corrupt" in lines[0] and STATE in lines[0], lines
    assert (state / STATE).read_bytes() == torn

    daemon = DaemonProcess(tmp_path, fast_config(tmp_path, probes=PROBES))
    daemons.append(daemon)
    samples = daemon.scrape()
    assert samples[("netmon_baseline_restored", frozenset())] == 0.0
    errors = {
        reason: samples[("netmon_state_errors_total", frozenset({("reason", reason)}))]
        for reason in NO_REASONS
    }
    assert errors == {**NO_REASONS, "corrupt": 1.0}
    assert "starting without usable baseline state (corrupt)" in daemon.log()
    # The learned references are recoverable from the file set aside.
    (aside,) = state.glob(f"{STATE}.corrupt-*")
    assert aside.read_bytes() == torn
    assert daemon.stop() == 0
