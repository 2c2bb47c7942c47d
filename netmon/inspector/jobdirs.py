"""Which job directories under `inspector.dir` netmon may remove, and when (docs/INSPECTOR.md,
"What netmon removes"). A directory is netmon's only when all of these hold: the root carries
the marker that the site's setup wrote (MARKER), its name is one the layout makes (a Slurm job
id, as the prolog makes it, or a Kubernetes pod UID) and it holds nothing but the files the
plugin and the epilog write. Anything else is someone's data: counted, never removed.

Its age is measured on netmon's monotonic clock, from when netmon last saw its content change
(names, sizes, mtimes) or first saw its `.ended` mark, never as wall-now minus an mtime: a step
of the wall clock, or a volume of old files, makes nothing old. Pure apart from check_root.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass

from netmon.errors import ConfigError

# Written by the site's setup (docs/INSPECTOR.md; the Slurm prolog writes it too): the root is
# a directory made for netmon's Inspector, not a data volume named by mistake.
MARKER = ".netmon-inspector"
ENDED = ".ended"  # the Slurm Epilog's mark: the job is over (deploy/slurm/epilog.sh)
PROM_SUFFIX = ".prom"
JSONL_SUFFIX = ".log"

# $SLURM_JOB_ID as the prolog makes it (digits: an array task has a job id of its own), with
# the array form 123_4 some sites use; a pod UID as the kubelet prints it.
_SLURM_JOB = re.compile(r"[0-9]{1,20}(?:_[0-9]{1,10})?")
_POD_UID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
# The plugin's names: nccl_inspector_metrics_<GPU UUID>.prom, <hostname>-pid<pid>.log.
_PROM = re.compile(r"[A-Za-z0-9_.-]{1,240}\.prom")
_JSONL = re.compile(r"[A-Za-z0-9_.-]{1,240}-pid[0-9]{1,10}\.log")

# One listed entry: (name, st_mode, st_nlink, st_size, st_mtime_ns), from lstat.
Entry = tuple[str, int, int, int, int]


@dataclass(frozen=True)
class Listing:
    """What one read saw in a job directory, from lstat alone."""

    entries: tuple[Entry, ...]  # sorted by name
    complete: bool = True  # False: more entries than max_files, the rest unseen

    @property
    def ended(self) -> bool:
        return any(e[0] == ENDED for e in self.entries)

    def stamp(self) -> tuple[tuple[str, int, int], ...]:
        """What changes when the job writes: names, sizes and mtimes."""
        return tuple((name, size, mtime) for name, _, _, size, mtime in self.entries)


def job_name(name: str) -> bool:
    """A name the documented layout gives a job's directory."""
    return _SLURM_JOB.fullmatch(name) is not None or _POD_UID.fullmatch(name) is not None


def inspector_file(name: str) -> bool:
    """A name the plugin writes, or the epilog's mark."""
    return name == ENDED or _PROM.fullmatch(name) is not None or _JSONL.fullmatch(name) is not None


def foreign(job: str, listing: Listing) -> str | None:
    """Why the directory `job` is not netmon's to remove, or None when it is."""
    if not job_name(job):
        return "its name is no Slurm job id or pod UID"
    if not listing.complete:
        return "it holds more entries than inspector.max_files"
    for name, mode, links, _, _ in listing.entries:
        if not inspector_file(name):
            return f"it holds {name[:60]!r}, which NCCL Inspector does not write"
        if not stat.S_ISREG(mode) or links != 1:
            return f"{name[:60]!r} in it is no regular file of one link"
    return None


@dataclass
class _Watch:
    stamp: tuple[tuple[str, int, int], ...]
    changed_at: float  # monotonic: when netmon last saw the stamp change
    ended_at: float | None  # monotonic: when netmon first saw `.ended`


class Ages:
    """How long each job directory has been unchanged, or ended, on netmon's monotonic clock."""

    def __init__(self) -> None:
        self._watch: dict[str, _Watch] = {}

    def due(self, job: str, listing: Listing, now: float, grace: float, stale_after: float) -> bool:
        """True when the job ended `grace` ago, or (no mark) nothing in it changed for
        `stale_after`; never on the read that first sees it."""
        stamp, ended = listing.stamp(), listing.ended
        watch = self._watch.get(job)
        if watch is None:
            self._watch[job] = _Watch(stamp, now, now if ended else None)
            return False
        if stamp != watch.stamp:
            watch.stamp, watch.changed_at = stamp, now
        if not ended:
            watch.ended_at = None  # a requeued job: its prolog took the mark away
        elif watch.ended_at is None:
            watch.ended_at = now
        if watch.ended_at is not None:
            return now - watch.ended_at > grace
        return now - watch.changed_at > stale_after

    def forget(self, job: str) -> None:
        self._watch.pop(job, None)

    def keep(self, jobs: set[str]) -> None:
        """Directories no longer listed are forgotten: one seen again starts afresh."""
        for job in set(self._watch) - jobs:
            del self._watch[job]


def marked(root: int) -> bool:
    """The root (a descriptor) holds the marker, a regular file (a symlink is not followed)."""
    try:
        return stat.S_ISREG(os.stat(MARKER, dir_fd=root, follow_symlinks=False).st_mode)
    except OSError:
        return False


def check_root(directory: os.PathLike[str] | str) -> None:
    """At start and in check-config: `inspector.dir` exists and is marked as netmon's."""
    path = os.fspath(directory)
    fix = f"(install -d -m 0755 {path} && touch {path}/{MARKER})"
    try:
        root = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise ConfigError(
            f"inspector.dir: cannot open {path} ({exc.strerror}): make it {fix} or fix the path"
        ) from None
    try:
        if not marked(root):
            raise ConfigError(
                f"inspector.dir: {path} has no {MARKER} file, so it may not be the directory made "
                f"for NCCL Inspector; if it is, mark it {fix}, else fix the path"
            )
    finally:
        os.close(root)
