"""A probe's working directory (its ranks' stderr files and NCCL logs), held by a lock for as long
as the probe runs, so that the next probe can remove the ones a killed process left behind.

The lock is an flock on a file inside the directory: the kernel drops it when the process that
holds it dies, however it dies, and it works across PID namespaces that share a /tmp, where a
PID in the directory's name would name another namespace's process or none.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import stat
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger(__name__)

PREFIX = "netmon-probe-"
# A directory is made and locked under this name, then renamed to PREFIX: no clean-up ever sees
# a PREFIX directory between its making and its lock (pair probes make theirs at once, in
# threads of one process).
MAKING = ".netmon-probe-new-"
LOCK = ".lock"
# A directory left while being made, or by a netmon from before the lock, has no lock to tell:
# removed only once it is older than any making or probe could take.
UNLOCKED_GRACE_S = 600.0


@contextlib.contextmanager
def probe_workdir(root: Path | None = None) -> Iterator[Path]:
    """A fresh locked directory under `root` (the temp dir), removed on the way out; the ones
    that dead probes left are removed first."""
    base = root if root is not None else Path(tempfile.gettempdir())
    remove_stale(base)
    path, lock = _make_locked(base)
    try:
        yield path
    finally:
        # Removed while still locked, so no other probe's clean-up takes it for a stale one.
        shutil.rmtree(path, ignore_errors=True)
        os.close(lock)


def _make_locked(base: Path) -> tuple[Path, int]:
    making = Path(tempfile.mkdtemp(prefix=MAKING, dir=base))
    lock = -1
    try:
        lock = os.open(making / LOCK, os.O_CREAT | os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        fcntl.flock(lock, fcntl.LOCK_EX)
        path = base / (PREFIX + making.name.removeprefix(MAKING))
        # The random part is mkdtemp's; a live directory of the same name is never empty, and a
        # rename fails rather than replace it.
        os.rename(making, path)
    except BaseException:
        shutil.rmtree(making, ignore_errors=True)
        if lock >= 0:
            os.close(lock)
        raise
    return path, lock


def remove_stale(root: Path, now: float | None = None) -> list[str]:
    """Removes the probe directories under `root` that are this user's and that no live process
    holds; returns their names."""
    removed: list[str] = []
    try:
        entries = list(os.scandir(root))
    except OSError as exc:
        log.debug("cannot list %s for stale probe directories: %s", root, exc)
        return removed
    clock = time.time() if now is None else now
    for entry in entries:
        if entry.name.startswith((PREFIX, MAKING)) and _is_stale(entry, clock):
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(entry.name)
    if removed:
        log.info("removed %d probe directories left by killed probes in %s", len(removed), root)
    return removed


def _is_stale(entry: os.DirEntry[str], now: float) -> bool:
    try:
        info = entry.stat(follow_symlinks=False)
    except OSError:
        return False
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
        return False
    if entry.name.startswith(MAKING) and now - info.st_mtime <= UNLOCKED_GRACE_S:
        return False  # maybe being made: its lock may not be taken yet
    try:
        lock = os.open(Path(entry.path) / LOCK, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except FileNotFoundError:
        return now - info.st_mtime > UNLOCKED_GRACE_S
    except OSError:
        return False
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False  # a live probe's
    except OSError:
        return False
    finally:
        os.close(lock)
    return True
