"""Reads the jobs' Inspector files under `inspector.dir`, and removes a job's once it ended.

The files are written by the jobs' users, so nothing in them is trusted: every directory and file
is opened relative to its parent's descriptor without following a symlink (a link out of the
directory is counted, never read), only regular files with one link are read, no more than
`max_read_bytes` of a file per read and no line over `max_line_bytes`. Textfile dumps are read
whole when they changed (the plugin rewrites them in place, so a read that overlapped a rewrite
is dropped and the next one taken); JSON lines files from where the last read ended, whole lines
only, skipping to the newest `max_read_bytes` when a backlog is larger.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import stat
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

from netmon.inspector import jsonlines, promfile
from netmon.inspector.records import Collective, Parsed
from netmon.inspector.settings import InspectorConfig

log = logging.getLogger(__name__)

ENDED = ".ended"  # the Slurm Epilog's mark: the job is over (deploy/slurm/epilog.sh)
PROM_SUFFIX = ".prom"
JSONL_SUFFIX = ".log"
_OPEN = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC  # a FIFO must not block us
_OPEN_DIR = _OPEN | os.O_DIRECTORY


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


class DumpReader:
    def __init__(self, settings: InspectorConfig, remove: bool = True) -> None:
        self.settings = settings
        self.remove = remove  # False: read only (netmon selftest)
        self._seen: dict[tuple[str, str], _Seen] = {}
        self._warned: set[tuple[str, str]] = set()
        # Files refused as files (a symlink, a FIFO, ...) at the last read: counted once while
        # they stay, not at every read.
        self._refused: set[tuple[str, str, str]] = set()
        self._refused_now: set[tuple[str, str, str]] = set()

    def read(self, now: float) -> Reading:
        reading = Reading()
        try:
            root = os.open(self.settings.dir, _OPEN_DIR)
        except OSError as exc:
            self._warn(("", "missing_dir"), f"cannot open {self.settings.dir}: {exc.strerror}")
            reading.rejected["missing_dir"] += 1
            return reading
        visited: set[tuple[str, str]] = set()
        self._refused_now = set()
        try:
            for job in self._jobs(root, reading):
                try:
                    self._read_job(root, job, now, reading, visited)
                except OSError as exc:  # one job's directory changing under the read
                    self._refuse(reading, (job, ""), "unreadable")
                    log.debug("inspector: %s: %s", job, exc)
        finally:
            os.close(root)
        for key in set(self._seen) - visited:
            del self._seen[key]
        self._refused = self._refused_now
        if len(self._warned) > 4096:
            self._warned.clear()  # bounded: one warning per file and reason, again after this
        return reading

    def _jobs(self, root: int, reading: Reading) -> Iterator[str]:
        with os.scandir(root) as entries:
            for number, entry in enumerate(entries):
                if number >= self.settings.max_files:
                    reading.rejected["too_many_files"] += 1
                    return
                if entry.is_symlink():
                    self._refuse(reading, (entry.name, ""), "symlink")
                elif entry.is_dir(follow_symlinks=False):
                    yield entry.name

    def _read_job(
        self, root: int, job: str, now: float, reading: Reading, visited: set[tuple[str, str]]
    ) -> None:
        try:
            fd = os.open(job, _OPEN_DIR, dir_fd=root)
        except OSError as exc:
            self._refuse(
                reading, (job, ""), "symlink" if exc.errno == errno.ELOOP else "unreadable"
            )
            return
        try:
            newest, ended = self._read_files(fd, job, reading, visited)
        finally:
            os.close(fd)
        if self.remove and self._over(now, newest, ended):
            self._remove(root, job, reading)

    def _read_files(
        self, fd: int, job: str, reading: Reading, visited: set[tuple[str, str]]
    ) -> tuple[float, float | None]:
        newest = os.fstat(fd).st_mtime
        ended: float | None = None
        with os.scandir(fd) as entries:
            for number, entry in enumerate(entries):
                if number >= self.settings.max_files:
                    reading.rejected["too_many_files"] += 1
                    break
                key = (job, entry.name)
                if entry.is_symlink():
                    self._refuse(reading, key, "symlink")
                    continue
                try:
                    info = entry.stat(follow_symlinks=False)
                except OSError:
                    continue  # gone since it was listed: its job removed it, or the epilog
                newest = max(newest, info.st_mtime)
                if entry.name == ENDED:
                    ended = info.st_mtime
                elif entry.name.endswith((PROM_SUFFIX, JSONL_SUFFIX)):
                    visited.add(key)
                    self._read_file(fd, key, reading)
        return newest, ended

    def _read_file(self, fd: int, key: tuple[str, str], reading: Reading) -> None:
        try:
            file = os.open(key[1], _OPEN, dir_fd=fd)
        except OSError as exc:
            self._refuse(reading, key, "symlink" if exc.errno == errno.ELOOP else "unreadable")
            return
        try:
            info = os.fstat(file)
            if not stat.S_ISREG(info.st_mode):
                self._refuse(reading, key, "not_a_file")
            elif info.st_nlink != 1:
                self._refuse(reading, key, "hardlink")  # another name for someone's file
            elif key[1].endswith(PROM_SUFFIX):
                self._read_prom(file, key, info, reading)
            else:
                self._read_jsonl(file, key, info, reading)
        except OSError:
            self._refuse(reading, key, "unreadable")
        finally:
            os.close(file)

    def _read_prom(
        self, file: int, key: tuple[str, str], info: os.stat_result, reading: Reading
    ) -> None:
        seen = self._seen.setdefault(key, _Seen())
        stamp = _stamp(info)
        if stamp == seen.stamp:
            return  # this dump was read already
        if info.st_size > self.settings.max_read_bytes:
            seen.stamp = stamp  # counted once per dump
            self._reject(reading, key, "too_large")
            return
        data = os.pread(file, self.settings.max_read_bytes + 1, 0)
        if _stamp(os.fstat(file)) != stamp or len(data) != info.st_size:
            reading.rejected["changed_during_read"] += 1  # taken at the next read
            return
        seen.stamp = stamp
        reading.files += 1
        self._take(
            reading, key, promfile.parse(data, f"{key[0]}/{key[1]}", self.settings.max_line_bytes)
        )

    def _read_jsonl(
        self, file: int, key: tuple[str, str], info: os.stat_result, reading: Reading
    ) -> None:
        seen = self._seen.setdefault(key, _Seen())
        if info.st_ino != seen.stamp[0] or info.st_size < seen.offset:
            if seen.stamp != (0, 0, 0):
                reading.rejected["replaced"] += 1  # a new process reused the name: from its start
            seen.offset, seen.resync = 0, False
        seen.stamp = _stamp(info)
        if info.st_size - seen.offset > self.settings.max_read_bytes:
            reading.rejected["backlog_skipped"] += 1
            seen.offset, seen.resync = info.st_size - self.settings.max_read_bytes, True
        data = os.pread(
            file, min(info.st_size - seen.offset, self.settings.max_read_bytes), seen.offset
        )
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
            self._take(
                reading,
                key,
                jsonlines.parse(lines, f"{key[0]}/{key[1]}", self.settings.max_line_bytes),
            )

    def _take(self, reading: Reading, key: tuple[str, str], parsed: Parsed) -> None:
        reading.collectives.extend(parsed.collectives)
        for reason, n in parsed.rejected.items():
            self._reject(reading, key, reason, n)

    def _over(self, now: float, newest: float, ended: float | None) -> bool:
        if ended is not None:
            return now - ended > self.settings.grace
        return now - newest > self.settings.stale_after

    def _remove(self, root: int, job: str, reading: Reading) -> None:
        try:
            # With dir_fd, rmtree works on descriptors and follows no symlink (shutil.rmtree's
            # fd-based walk), so a link planted in a job's directory removes nothing outside it.
            shutil.rmtree(job, dir_fd=root)  # type: ignore[call-arg]  # (3.11+; typeshed lags)
        except OSError as exc:
            self._warn((job, "remove"), f"cannot remove inspector directory {job}: {exc}")
            reading.rejected["unremovable"] += 1
            return
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
