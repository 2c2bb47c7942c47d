"""Each node's sweep history: a BaselineBook of its rails' passing results, kept in the sweep's
state directory across sweeps (the same file format and atomic writes as the daemon's), and the
lock that keeps two sweeps from running at once from one place."""

from __future__ import annotations

import fcntl
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from netmon import dirs
from netmon.baseline import state
from netmon.baseline.book import BaselineBook
from netmon.baseline.policy import BaselinePolicy
from netmon.errors import UsageError

log = logging.getLogger(__name__)
HISTORY_FILE = "history.json"
LOCK_FILE = "sweep.lock"


def load(directory: Path, policy: BaselinePolicy) -> BaselineBook:
    book, problem = state.load(directory / HISTORY_FILE, policy)
    if problem:
        log.warning("sweep: history %s: %s; starting afresh", directory / HISTORY_FILE, problem)
    return book


def save(directory: Path, book: BaselineBook) -> None:
    try:
        state.save(directory / HISTORY_FILE, book)
    except OSError as exc:
        log.error("sweep: cannot save the history in %s: %s", directory, exc)


@contextmanager
def exclusive(directory: Path) -> Iterator[None]:
    """Hold the sweep lock of `directory`; UsageError when another sweep holds it. A directory
    it made is taken back after a sweep that wrote nothing there (one that could not run)."""
    made = dirs.missing(directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(directory / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise UsageError(f"sweep.state_dir {directory}: {exc.strerror or exc}") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise Busy(f"another sweep holds {directory / LOCK_FILE}") from None
        yield
    finally:
        if made:  # still holding the lock: no other sweep can be starting in it
            dirs.remove_empty(made, leftovers=(LOCK_FILE,))
        os.close(fd)


class Busy(Exception):
    """Another sweep is running."""
