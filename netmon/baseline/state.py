"""The file that keeps the baseline book across restarts: written atomically, read defensively.

A restart must neither forget a baseline nor silently clear a degraded link; a file that is not
ours is set aside, never trusted and never destroyed.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import tempfile
import time
from pathlib import Path

from netmon.baseline.book import BaselineBook
from netmon.baseline.policy import BaselinePolicy

# A real book is keys x window floats, a few MB at most; a file far larger is not one of ours,
# and reading it whole could take the daemon's memory with it.
MAX_STATE_BYTES = 64 << 20


def save(path: Path, book: BaselineBook) -> None:
    """Write the book so that `path` holds either the old state or the new, never a torn file.

    OSError (a full disk, a read-only directory) propagates; the caller decides how loud to be.
    """
    data = (json.dumps(book.to_json(), allow_nan=False, separators=(",", ":")) + "\n").encode()
    write_atomic(path, data)


def write_atomic(path: Path, data: bytes) -> None:
    """`path` holds the old bytes or `data`, never a torn file (every state file of the daemon
    is written so); OSError propagates."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with open(fd, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)


def _fsync_dir(directory: Path) -> None:
    """Make the rename itself durable."""
    fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    except OSError as exc:
        # Some filesystems (certain FUSE and network mounts) cannot fsync a directory; the
        # file's own data is already synced, so this only narrows a crash window.
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP):
            raise
    finally:
        os.close(fd)


def load(path: Path, policy: BaselinePolicy) -> tuple[BaselineBook, str | None]:
    """The saved book, or an empty one and a one-line warning; never raises over the file.

    A missing file is a first start (no warning). A file that is not a valid state document is
    renamed to "<name>.corrupt-<unix time>" so that the next save cannot destroy the evidence.
    """
    try:
        with path.open("rb") as file:
            raw = file.read(MAX_STATE_BYTES + 1)
    except FileNotFoundError:
        return BaselineBook(policy), None
    except OSError as exc:
        return BaselineBook(policy), (
            f"cannot read baseline state {path} ({_one_line(exc)}); starting with no baselines"
        )
    try:
        if len(raw) > MAX_STATE_BYTES:
            raise ValueError(f"larger than {MAX_STATE_BYTES} bytes")
        return BaselineBook.from_json(json.loads(raw), policy), None
    except (ValueError, RecursionError) as exc:  # RecursionError: absurdly nested JSON
        return BaselineBook(policy), _set_aside(path, _one_line(exc))


def set_aside(path: Path) -> Path:
    """Renames a state file that is not ours to "<name>.corrupt-<unix time>", where the next save
    cannot destroy the evidence; the new path. OSError propagates."""
    stamp = int(time.time())
    aside = path.with_name(f"{path.name}.corrupt-{stamp}")
    serial = 1
    while aside.exists():  # two bad files in one second: keep both
        aside = path.with_name(f"{path.name}.corrupt-{stamp}-{serial}")
        serial += 1
    os.replace(path, aside)
    return aside


def _set_aside(path: Path, reason: str) -> str:
    try:
        aside = set_aside(path)
    except OSError as exc:
        return (
            f"baseline state {path} is unusable ({reason}) and could not be moved aside "
            f"({_one_line(exc)}); starting with no baselines"
        )
    return f"baseline state {path} is unusable ({reason}); moved to {aside.name}, starting afresh"


def _one_line(exc: BaseException, limit: int = 200) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."
