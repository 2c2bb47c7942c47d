"""The file that keeps the baseline book across restarts: written atomically, read defensively.

A restart must neither forget a baseline nor silently clear a degraded link; a file that is not
ours is set aside, never trusted and never destroyed, and the temporaries a save killed midway
leaves behind are the only files of the state directory netmon removes.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import stat
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from netmon.baseline.book import BaselineBook
from netmon.baseline.document import READABLE_VERSIONS
from netmon.baseline.policy import BaselinePolicy

# A real book is keys x window floats, a few MB at most; a file far larger is not one of ours,
# and reading it whole could take the daemon's memory with it.
MAX_STATE_BYTES = 64 << 20

# Why a state file that is there could not be used; a missing file is a first start, not one.
ProblemReason = Literal["corrupt", "unreadable", "version"]
PROBLEM_REASONS: tuple[ProblemReason, ...] = ("corrupt", "unreadable", "version")

# write_atomic's temporaries: "." + the file's name + "." + mkstemp's 8 random characters (its
# alphabet is lower-case letters, digits and "_") + ".tmp". Only names of exactly this shape are
# ever removed, so a file netmon did not make is never touched.
_TEMP_SUFFIX = ".tmp"
_TEMP_RANDOM = r"[a-z0-9_]{8}"


@dataclass(frozen=True)
class StateProblem:
    """A state file that is there but cannot be used: why, and the one line that says so."""

    reason: ProblemReason
    message: str

    def __str__(self) -> str:  # what the callers that only log it print
        return self.message


def save(path: Path, book: BaselineBook) -> None:
    """Write the book so that `path` holds either the old state or the new, never a torn file.

    OSError (a full disk, a read-only directory) propagates; the caller decides how loud to be.
    """
    data = (json.dumps(book.to_json(), allow_nan=False, separators=(",", ":")) + "\n").encode()
    write_atomic(path, data)


def write_atomic(path: Path, data: bytes) -> None:
    """`path` holds the old bytes or `data`, never a torn file (every state file of the daemon
    is written so); OSError propagates."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=_TEMP_SUFFIX, dir=path.parent)
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


def is_temporary_of(name: str, candidate: str) -> bool:
    """Whether `candidate` is a name write_atomic gives its temporary while it writes `name`."""
    pattern = re.escape(f".{name}.") + _TEMP_RANDOM + re.escape(_TEMP_SUFFIX)
    return re.fullmatch(pattern, candidate) is not None


def remove_stale_temporaries(directory: Path, names: Iterable[str]) -> list[Path]:
    """Remove the temporaries that saves of `names` in `directory` left when they were killed;
    the paths removed. Call it before anything saves: a save under way has one too.

    Only regular files of exactly write_atomic's name pattern and of our own user go, never a
    symbolic link, a directory or another user's file; a directory that cannot be listed
    removes nothing (OSError propagates, the caller logs it).
    """
    wanted = tuple(names)
    removed: list[Path] = []
    for entry in os.scandir(directory):
        if not any(is_temporary_of(name, entry.name) for name in wanted):
            continue
        try:
            info = entry.stat(follow_symlinks=False)
            if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
                continue
            os.unlink(entry.path)
        except FileNotFoundError:  # gone meanwhile: nothing left to do
            continue
        removed.append(Path(entry.path))
    return removed


def load(
    path: Path, policy: BaselinePolicy, keep: bool = False
) -> tuple[BaselineBook, StateProblem | None]:
    """The saved book, or an empty one and what is wrong with the file; never raises over it.

    A missing file is a first start (no problem). A file that is there but not a state document
    this version reads is renamed to "<name>.corrupt-<unix time>" so that the next save cannot
    destroy the learned references (they can be recovered from it by hand); with `keep` it
    stays where it is, for a daemon that refuses to start over it.
    """
    try:
        with path.open("rb") as file:
            raw = file.read(MAX_STATE_BYTES + 1)
    except FileNotFoundError:
        return BaselineBook(policy), None
    except OSError as exc:
        if keep or not _regular(path):  # a directory or a device there is not ours to move
            return BaselineBook(policy), StateProblem(
                "unreadable",
                f"cannot read baseline state {path} ({_one_line(exc)}); starting with no baselines",
            )
        # Set aside too: the next save would otherwise replace what an I/O error hides.
        return BaselineBook(policy), StateProblem(
            "unreadable", _set_aside(path, f"cannot read it: {_one_line(exc)}")
        )
    reason: ProblemReason = "corrupt"
    try:
        if len(raw) > MAX_STATE_BYTES:
            raise ValueError(f"larger than {MAX_STATE_BYTES} bytes")
        doc = json.loads(raw)
        if isinstance(doc, dict) and doc.get("version") not in READABLE_VERSIONS:
            reason = "version"
        return BaselineBook.from_json(doc, policy), None
    except (ValueError, RecursionError) as exc:  # RecursionError: absurdly nested JSON
        what = _one_line(exc)
        if keep:
            return BaselineBook(policy), StateProblem(
                reason, f"baseline state {path} is unusable ({what}); left in place"
            )
        return BaselineBook(policy), StateProblem(reason, _set_aside(path, what))


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


def _regular(path: Path) -> bool:
    try:
        return stat.S_ISREG(path.lstat().st_mode)
    except OSError:
        return False


def _one_line(exc: BaseException, limit: int = 200) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."
