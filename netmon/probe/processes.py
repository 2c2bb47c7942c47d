"""The rank processes: what the launcher follows of each, their state as the kernel sees it, exit
status without reaping, and the last words a rank wrote to stderr. No probe logic."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Protocol

from netmon.probe.rankcpu import CpuMarks
from netmon.probe.spec import Phase

STDERR_TAIL = 1500
# The variable that gives a rank the number of its channel to the launcher: a pipe of its own for
# the JSON lines, apart from stdout, where libraries write too (NCCL's log without a file of its
# own), fully buffered into a pipe and so flushed in the middle of a line.
CHANNEL_FD = "NETMON_CHANNEL_FD"


class RankHandle(Protocol):
    """A started rank as the launcher holds it, however it was started: its PID (also its process
    group's, as every rank leads its own session), its stdin and the reading end of its channel
    (CHANNEL_FD), its exit status without reaping it, and the reaping itself once its group has
    been killed."""

    pid: int
    stdin: IO[bytes] | None
    channel: IO[bytes] | None

    def exit_status(self) -> int | None: ...

    def reap(self) -> None: ...

    def cpu_s(self) -> float | None:
        """Its whole CPU time (user + system, every thread), once reaped; None if unknown."""
        ...


class SpawnedRank:
    """A rank started as a new interpreter (subprocess): the launcher is its parent."""

    def __init__(self, proc: subprocess.Popen[bytes], channel: IO[bytes]) -> None:
        self.proc = proc
        self.pid = proc.pid
        self.stdin = proc.stdin
        self.channel: IO[bytes] | None = channel
        self._cpu_s: float | None = None

    def exit_status(self) -> int | None:
        return exit_status(self.pid)

    def reap(self) -> None:
        try:
            _, status, usage = os.wait4(self.pid, 0)
        except ChildProcessError:  # reaped already
            self.proc.wait()
            return
        self.proc.returncode = os.waitstatus_to_exitcode(status)
        self._cpu_s = usage.ru_utime + usage.ru_stime

    def cpu_s(self) -> float | None:
        return self._cpu_s


@dataclass
class RankProcess:
    """One rank process as the launcher follows it: its phase, what it said, how it ended."""

    rank: int
    proc: RankHandle
    stderr_path: Path
    phase: Phase = "spawn"
    phase_since: float = 0.0
    # Seconds from the launch to the first report of each phase.
    phase_entered: dict[str, float] = field(default_factory=dict)
    size: int | None = None
    sizes_done: int = 0
    last_heard: float = 0.0
    hello: bool = False
    done: bool = False
    exit_status: int | None = None  # >= 0 exit code, < 0 minus the signal number
    error: dict[str, Any] | None = None
    buffer: bytes = b""
    eof: bool = False
    reaped: bool = False
    cpu: CpuMarks = field(default_factory=CpuMarks)  # what each phase cost it (probe.rankcpu)


def is_loopback(host: str) -> bool:
    return host in ("localhost", "::1") or host.startswith("127.")


def process_state(pid: int) -> str | None:
    """The state letter of /proc/PID/stat (R, S, D, T, Z...), or None if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[0]


def exit_status(pid: int) -> int | None:
    """Exit status of a finished child without reaping it, or None while it runs."""
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return None
    if info is None or info.si_pid == 0:
        return None
    if info.si_code == os.CLD_EXITED:
        return int(info.si_status)
    return -int(info.si_status)


def describe_status(status: int) -> str:
    if status < 0:
        try:
            return f"killed by {signal.Signals(-status).name}"
        except ValueError:
            return f"killed by signal {-status}"
    return f"exited with status {status}"


def stderr_tail(path: Path) -> str:
    """The last lines a rank wrote to stderr, on one line."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "no stderr"
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return " | ".join(lines[-5:])[-STDERR_TAIL:] or "no stderr"


def descendants_of(pid: int) -> list[int]:
    """Children, their children and so on: with the rank zygote, the ranks are grandchildren.
    One pass over /proc, so a process that forks while it is read is seen or not, never half."""
    children: dict[int, list[int]] = {}
    for child, parent in _parents().items():
        children.setdefault(parent, []).append(child)
    found: list[int] = []
    parents = [pid]
    while parents:
        level = [c for parent in parents for c in children.get(parent, ())]
        found += level
        parents = level
    return found


def start_time(pid: int) -> int | None:
    """The process's start time (clock ticks since boot), which tells it from a later PID reuse;
    None once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[19])


def running_as(pid: int, start: int | None) -> bool:
    """Whether the process that started at `start` still runs: not gone, not reused, not a
    zombie (which holds no GPU any more)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return False
    return fields[0] != "Z" and int(fields[19]) == start


def descends_from(pid: int, ancestor: int) -> bool:
    """Whether `ancestor` is `pid`'s parent, its parent's parent, and so on (False once a
    process on the way is gone)."""
    seen = set()
    while pid > 1 and pid not in seen:
        seen.add(pid)
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return False
        pid = int(fields[1])
        if pid == ancestor:
            return True
    return False


def _parents() -> dict[int, int]:
    """Every process's parent, from /proc/PID/stat (a process gone while read is left out)."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(entry.name)] = int(fields[1])
    return parents


def children_of(pid: int) -> list[int]:
    """The processes whose parent is `pid` (from /proc; a rank in its own session still counts)."""
    return [child for child, parent in _parents().items() if parent == pid]


def slowest_span(ranks: list[RankProcess], since: str | None, until: str) -> float | None:
    """The longest any rank took from entering `since` (its launch: None) to entering `until`."""
    spans = [
        e.phase_entered[until] - (e.phase_entered[since] if since else 0.0)
        for e in ranks
        if until in e.phase_entered and (since is None or since in e.phase_entered)
    ]
    return max(spans) if spans else None


def signal_group(pid: int, signum: int) -> None:
    """Signal the process group a rank leads; a forked rank caught before its setsid() leads no
    group yet, and then the process alone (unreaped, so still the rank) is all there is of it."""
    try:
        os.killpg(pid, signum)
    except ProcessLookupError:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signum)
    except PermissionError:
        pass
