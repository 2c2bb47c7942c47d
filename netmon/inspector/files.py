"""Reads the jobs' Inspector files under `inspector.dir`, and removes a job's once it ended.

The files are written by the jobs' users, so nothing in them is trusted: every directory and file
is opened relative to its parent's descriptor without following a symlink (a link out of the
directory is counted, never read), only regular files with one link are read, and their type is
taken from the listing's lstat before any open (a device node or FIFO is never opened). No more
than `max_read_bytes` of a file is read per read, no line over `max_line_bytes`, and no more than
`read_budget_bytes` and `read_budget_seconds` per read as a whole: the jobs are taken in turn,
from where the last read stopped, so one large job cannot starve the others. Textfile dumps are
read whole when they changed (the plugin rewrites them in place, so a read that overlapped a
rewrite is dropped and the next one taken); JSON lines files from where the last read ended,
whole lines only, skipping to the newest `max_read_bytes` when a backlog is larger. What the
reader may remove is decided in netmon.inspector.jobdirs.
"""

from __future__ import annotations

import bisect
import errno
import logging
import os
import shutil
import stat
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from netmon.inspector import jobdirs, jsonlines, promfile
from netmon.inspector.jobdirs import ENDED, JSONL_SUFFIX, PROM_SUFFIX, Ages, Listing
from netmon.inspector.records import Collective, Parsed
from netmon.inspector.settings import InspectorConfig

log = logging.getLogger(__name__)

__all__ = ["ENDED", "JSONL_SUFFIX", "PROM_SUFFIX", "DumpReader", "Reading"]

_OPEN = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC  # a FIFO must not block us
_OPEN_DIR = _OPEN | os.O_DIRECTORY
# The states of a job directory at its last read (netmon_jobs_directories).
DIRECTORY_STATES = ("live", "removable", "foreign")  # as the catalogue lists them


@dataclass
class _Seen:
    """What the last read of one file left: its identity and (JSON lines) where to go on."""

    stamp: tuple[int, int, int] = (0, 0, 0)  # inode, size, mtime_ns
    offset: int = 0
    resync: bool = False  # drop everything up to the next newline first


@dataclass
class Reading:
    collectives: list[Collective] = field(default_factory=list)
    rejected: Counter[str] = field(default_factory=Counter)
    removed: int = 0  # job directories removed
    files: int = 0  # files read
    bytes: int = 0  # bytes read from them
    # Job directories by state, as last read: live, removable (due, not removed), foreign.
    directories: Counter[str] = field(default_factory=Counter)


class _Exhausted(Exception):
    """The read's byte or time budget is spent: the rest waits for the next read."""


class _Budget:
    def __init__(self, settings: InspectorConfig, clock: Callable[[], float]) -> None:
        self._bytes = settings.read_budget_bytes
        self._seconds = settings.read_budget_seconds
        self._clock = clock
        self._started = clock()
        self.used = 0
        # Until a file was read or a job passed, the time is not checked: every read moves on.
        self.moved = False

    def check(self) -> None:
        if self.moved and self._clock() - self._started >= self._seconds:
            raise _Exhausted

    def take(self, n: int) -> None:
        """`n` more bytes are read, or _Exhausted when they would pass the budget."""
        if self.used + n > self._bytes:
            raise _Exhausted
        self.used += n
        self.moved = True


class DumpReader:
    def __init__(
        self,
        settings: InspectorConfig,
        remove: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.remove = remove  # False: read only (netmon selftest)
        self._clock = clock  # the budget's; `now` (read's argument) is on the same clock
        self._seen: dict[str, dict[str, _Seen]] = {}  # job -> file -> what its last read left
        self._ages = Ages()
        self._states: dict[str, str] = {}  # job -> its state at its last read
        self._cursor: tuple[str, str] | None = None  # (job, file) the last read stopped at
        self._budget = _Budget(settings, clock)  # the current read's
        self._warned: set[tuple[str, str]] = set()
        # Files refused as files (a symlink, a FIFO, ...) at the last read: counted once while
        # they stay, not at every read.
        self._refused: set[tuple[str, str, str]] = set()
        self._refused_now: set[tuple[str, str, str]] = set()

    def read(self, now: float) -> Reading:
        """One read; `now` is monotonic (time.monotonic, or the injected clock)."""
        reading = Reading()
        try:
            root = os.open(self.settings.dir, _OPEN_DIR)
        except OSError as exc:
            self._warn(("", "missing_dir"), f"cannot open {self.settings.dir}: {exc.strerror}")
            reading.rejected["missing_dir"] += 1
            return reading
        self._budget = _Budget(self.settings, self._clock)
        self._refused_now = set()
        try:
            marked = jobdirs.marked(root)
            if not marked:
                self._warn(
                    ("", "marker"),
                    f"inspector: {self.settings.dir} lost its {jobdirs.MARKER}: nothing is removed",
                )
            jobs = self._jobs(root, reading)
            reached = self._read_jobs(root, jobs, now, marked, reading)
        finally:
            os.close(root)
        listed = set(jobs)
        for job in set(self._seen) - listed:
            del self._seen[job]
        self._states = {job: s for job, s in self._states.items() if job in listed}
        self._ages.keep(listed)
        # A job the budget left unread keeps what was refused in it: counted once still.
        self._refused = {r for r in self._refused if r[0] in listed - reached}
        self._refused |= self._refused_now
        reading.directories.update(self._states.values())
        reading.bytes = self._budget.used
        if len(self._warned) > 4096:
            self._warned.clear()  # bounded: one warning per file and reason, again after this
        return reading

    def _read_jobs(
        self, root: int, jobs: list[str], now: float, marked: bool, reading: Reading
    ) -> set[str]:
        """Each job in turn from where the last read stopped; returns the jobs reached."""
        reached: set[str] = set()
        cursor, self._cursor = self._cursor, None
        start = bisect.bisect_left(jobs, cursor[0]) if cursor is not None else 0
        for job in jobs[start:] + jobs[:start]:
            first = cursor[1] if cursor is not None and job == cursor[0] else ""
            reached.add(job)
            try:
                self._budget.check()
                self._read_job(root, job, first, now, marked, reading)
                self._budget.moved = True
            except _Exhausted as exhausted:
                # Taken up again here next time: every job and file gets its turn.
                self._cursor = (job, str(exhausted.args[0]) if exhausted.args else "")
                reading.rejected["budget_exhausted"] += 1
                return reached
            except OSError as exc:  # one job's directory changing under the read
                self._refuse(reading, (job, ""), "unreadable")
                log.debug("inspector: %s: %s", job, exc)
            except Exception:  # a defect one job's files found: the other jobs are still read
                self._reject(reading, (job, ""), "internal")
                log.debug("inspector: reading %s failed", job, exc_info=True)
        return reached

    def _jobs(self, root: int, reading: Reading) -> list[str]:
        jobs = []
        with os.scandir(root) as entries:
            for number, entry in enumerate(entries):
                if number >= self.settings.max_files:
                    reading.rejected["too_many_files"] += 1
                    break
                if entry.is_symlink():
                    self._refuse(reading, (entry.name, ""), "symlink")
                elif entry.is_dir(follow_symlinks=False):
                    jobs.append(entry.name)
        return sorted(jobs)

    def _read_job(
        self, root: int, job: str, first: str, now: float, marked: bool, reading: Reading
    ) -> None:
        try:
            fd = os.open(job, _OPEN_DIR, dir_fd=root)
        except OSError as exc:
            self._refuse(
                reading, (job, ""), "symlink" if exc.errno == errno.ELOOP else "unreadable"
            )
            return
        try:
            listing = self._list(fd, reading)
            self._judge(job, listing, now, reading)
            seen = self._seen.setdefault(job, {})
            names = {e[0] for e in listing.entries}
            for name in [n for n in seen if n not in names]:
                del seen[name]
            for entry in listing.entries:
                if entry[0] >= first:
                    self._read_entry(fd, job, entry, reading)
        finally:
            os.close(fd)
        if self._states.get(job) == "removable" and self.remove and marked:
            self._remove(root, job, reading)

    def _list(self, fd: int, reading: Reading) -> Listing:
        entries: list[jobdirs.Entry] = []
        complete = True
        with os.scandir(fd) as listed:
            for number, entry in enumerate(listed):
                if number >= self.settings.max_files:
                    reading.rejected["too_many_files"] += 1
                    complete = False
                    break
                try:
                    info = entry.stat(follow_symlinks=False)
                except OSError:
                    continue  # gone since it was listed: its job removed it, or the epilog
                entries.append(
                    (entry.name, info.st_mode, info.st_nlink, info.st_size, info.st_mtime_ns)
                )
        return Listing(tuple(sorted(entries)), complete)

    def _judge(self, job: str, listing: Listing, now: float, reading: Reading) -> None:
        settings = self.settings
        due = self._ages.due(job, listing, now, settings.grace, settings.stale_after)
        why = jobdirs.foreign(job, listing)
        if why is not None:
            self._states[job] = "foreign"
            if due:
                self._warn((job, "foreign"), f"inspector: kept {job}, not netmon's: {why}")
        else:
            self._states[job] = "removable" if due else "live"

    def _read_entry(self, fd: int, job: str, entry: jobdirs.Entry, reading: Reading) -> None:
        name, mode, links = entry[0], entry[1], entry[2]
        if name == ENDED or not name.endswith((PROM_SUFFIX, JSONL_SUFFIX)):
            return
        key = (job, name)
        # From the listing's lstat, before any open: a device node or FIFO is never opened.
        if stat.S_ISLNK(mode):
            self._refuse(reading, key, "symlink")
        elif not stat.S_ISREG(mode):
            self._refuse(reading, key, "not_a_file")
        elif links != 1:
            self._refuse(reading, key, "hardlink")  # another name for someone's file
        else:
            try:
                self._budget.check()
            except _Exhausted:
                raise _Exhausted(name) from None
            self._read_file(fd, key, reading)

    def _read_file(self, fd: int, key: tuple[str, str], reading: Reading) -> None:
        try:
            file = os.open(key[1], _OPEN, dir_fd=fd)
        except OSError as exc:
            self._refuse(reading, key, "symlink" if exc.errno == errno.ELOOP else "unreadable")
            return
        try:
            info = os.fstat(file)
            # Again on the descriptor: the name may have been swapped since the listing.
            if not stat.S_ISREG(info.st_mode):
                self._refuse(reading, key, "not_a_file")
            elif info.st_nlink != 1:
                self._refuse(reading, key, "hardlink")
            elif key[1].endswith(PROM_SUFFIX):
                self._read_prom(file, key, info, reading)
            else:
                self._read_jsonl(file, key, info, reading)
        except _Exhausted:
            raise _Exhausted(key[1]) from None
        except OSError:
            self._refuse(reading, key, "unreadable")
        finally:
            os.close(file)

    def _seen_of(self, key: tuple[str, str]) -> _Seen:
        return self._seen.setdefault(key[0], {}).setdefault(key[1], _Seen())

    def _read_prom(
        self, file: int, key: tuple[str, str], info: os.stat_result, reading: Reading
    ) -> None:
        seen = self._seen_of(key)
        stamp = _stamp(info)
        if stamp == seen.stamp:
            return  # this dump was read already
        if info.st_size > self.settings.max_read_bytes:
            seen.stamp = stamp  # counted once per dump
            self._reject(reading, key, "too_large")
            return
        self._budget.take(info.st_size)
        data = os.pread(file, self.settings.max_read_bytes + 1, 0)
        if _stamp(os.fstat(file)) != stamp or len(data) != info.st_size:
            reading.rejected["changed_during_read"] += 1  # taken at the next read
            return
        seen.stamp = stamp
        reading.files += 1
        parsed = promfile.parse(data, f"{key[0]}/{key[1]}", self.settings.max_line_bytes)
        self._take(reading, key, parsed, info.st_uid)

    def _read_jsonl(
        self, file: int, key: tuple[str, str], info: os.stat_result, reading: Reading
    ) -> None:
        seen = self._seen_of(key)
        most = self.settings.max_read_bytes
        fresh = info.st_ino != seen.stamp[0] or info.st_size < seen.offset
        offset = 0 if fresh else seen.offset
        self._budget.take(min(info.st_size - offset, most))  # before anything of `seen` changes
        if fresh:
            if seen.stamp != (0, 0, 0):
                reading.rejected["replaced"] += 1  # a new process reused the name: from its start
            seen.offset, seen.resync = 0, False
        seen.stamp = _stamp(info)
        if info.st_size - seen.offset > most:
            reading.rejected["backlog_skipped"] += 1
            seen.offset, seen.resync = info.st_size - most, True
        data = os.pread(file, min(info.st_size - seen.offset, most), seen.offset)
        lines = data.split(b"\n")
        tail = lines.pop()  # after the last newline: a line still being written
        seen.offset += len(data) - len(tail)
        if seen.resync and lines:
            lines.pop(0)
            seen.resync = False
        if len(tail) > self.settings.max_line_bytes:
            reading.rejected["oversized_line"] += 1
            seen.offset += len(tail)
            seen.resync = True
        if lines:
            reading.files += 1
            parsed = jsonlines.parse(lines, f"{key[0]}/{key[1]}", self.settings.max_line_bytes)
            self._take(reading, key, parsed, info.st_uid)

    def _take(self, reading: Reading, key: tuple[str, str], parsed: Parsed, owner: int) -> None:
        # The file's owner is whose word a record is: a user cannot give a file away (chown needs
        # CAP_CHOWN), so two jobs of one user are one witness, never two (docs/INSPECTOR.md).
        reading.collectives.extend(replace(c, owner=owner) for c in parsed.collectives)
        for reason, n in parsed.rejected.items():
            self._reject(reading, key, reason, n)

    def _remove(self, root: int, job: str, reading: Reading) -> None:
        try:
            # With dir_fd, rmtree works on descriptors and follows no symlink (shutil.rmtree's
            # fd-based walk), so a link planted in a job's directory removes nothing outside it.
            shutil.rmtree(job, dir_fd=root)  # type: ignore[call-arg]  # (3.11+; typeshed lags)
        except OSError as exc:
            self._warn((job, "remove"), f"cannot remove inspector directory {job}: {exc}")
            reading.rejected["unremovable"] += 1
            return
        self._ages.forget(job)
        self._states.pop(job, None)
        self._seen.pop(job, None)
        reading.removed += 1
        log.info("inspector: removed the files of ended job %s", job)

    def _refuse(self, reading: Reading, key: tuple[str, str], reason: str) -> None:
        """A file or directory not read as such: counted when it first appears."""
        refused = (*key, reason)
        self._refused_now.add(refused)
        if refused not in self._refused:
            self._reject(reading, key, reason)

    def _reject(self, reading: Reading, key: tuple[str, str], reason: str, n: int = 1) -> None:
        reading.rejected[reason] += n
        self._warn((f"{key[0]}/{key[1]}", reason), f"inspector: {key[0]}/{key[1]}: {n} x {reason}")

    def _warn(self, key: tuple[str, str], message: str) -> None:
        # Once per file and reason while it stays: a hostile file must not flood the log.
        if key not in self._warned:
            self._warned.add(key)
            log.warning("%s", message)


def _stamp(info: os.stat_result) -> tuple[int, int, int]:
    return (info.st_ino, info.st_size, info.st_mtime_ns)
