"""How much CPU other processes used while a probe measured: the sign that its run was disturbed.

On CPU ranks (gloo) a collective's time is the link's time plus whatever other work took the
cores from the ranks. Each rank reads, around its measured loop, the busy time of the CPUs it
may run on (its affinity, so a pod's cpuset rather than the whole host; the per-CPU lines of
/proc/stat: user, nice, system, irq, softirq, steal; proc(5)) and its own process's CPU time
(getrusage RUSAGE_SELF, all its threads). What those CPUs spent beyond the ranks on that machine
is other work. Ranks are grouped by machine (the kernel's boot_id), since a group's ranks run on
several, and the worst machine counts. /proc/stat counts in clock ticks (100 per second), so a
measurement shorter than MIN_TICKS ticks gives no figure rather than a coarse one.

The run-queue wait of the ranks' own threads (schedstat) was tried first: on two cores with two
ranks of several threads each it reads 0.4-0.9 s per second on an idle machine, the ranks
waiting for each other, and so cannot tell a disturbed run from a quiet one.
"""

from __future__ import annotations

import os
import resource
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass

# proc(5): the "cpu" line's fields are user nice system idle iowait irq softirq steal ...
_BUSY_FIELDS = (0, 1, 2, 5, 6, 7)
READING_FIELDS = 5  # what a rank appends to its gathered row: see Reading.since()
# One tick of error per CPU at each end: over 10 ticks of wall time the share is within 0.1.
MIN_TICKS = 10


@dataclass(frozen=True)
class Reading:
    busy_s: float  # the whole machine's busy CPU time so far
    own_s: float  # this process's CPU time so far, all threads
    at: float  # time.monotonic()
    cpus: int
    machine: float  # the boot_id's first 48 bits: exact in a float64, one per running kernel

    def since(self, before: Reading) -> list[float]:
        """The row a rank gathers: busy and own CPU seconds over the interval, its length, the
        machine's CPUs and its id."""
        return [
            self.busy_s - before.busy_s,
            self.own_s - before.own_s,
            self.at - before.at,
            float(self.cpus),
            self.machine,
        ]


def read() -> Reading | None:
    """This moment's reading, or None where /proc is not Linux's (never raises)."""
    try:
        with open("/proc/stat") as stat:
            lines = stat.read().splitlines()
        with open("/proc/sys/kernel/random/boot_id") as boot:
            machine = float(int(boot.read().strip().replace("-", "")[:12], 16))
        allowed = os.sched_getaffinity(0)
        busy = [_busy_ticks(line) for line in lines if _cpu_number(line) in allowed]
        ticks = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None
    if not busy:
        return None
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return Reading(
        busy_s=sum(busy) / ticks,
        own_s=usage.ru_utime + usage.ru_stime,
        at=time.monotonic(),
        cpus=len(busy),
        machine=machine,
    )


def _cpu_number(line: str) -> int | None:
    """N for a "cpuN ..." line of /proc/stat, None for any other line."""
    name = line.split(maxsplit=1)[0] if line.strip() else ""
    return int(name[3:]) if name.startswith("cpu") and name[3:].isdigit() else None


def _busy_ticks(line: str) -> int:
    fields = [int(v) for v in line.split()[1:]]
    return sum(fields[i] for i in _BUSY_FIELDS if i < len(fields))


def rows_of(value: object) -> list[list[float]]:
    """The ranks' readings from a rank's JSON event; a malformed one costs only the figure."""
    try:
        return [[float(v) for v in row] for row in value or ()]  # type: ignore[attr-defined]
    except (TypeError, ValueError):
        return []


def _ticks_per_s() -> int:
    try:
        return os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError):
        return 100  # Linux's USER_HZ everywhere it runs


def foreign_share(rows: Sequence[Sequence[float]]) -> float | None:
    """Other processes' CPU seconds per second per CPU during the measurement (0 quiet, 1 every
    core taken), on the worst machine; None without readings. `rows` are Reading.since() rows,
    one per rank."""
    by_machine: dict[float, list[Sequence[float]]] = {}
    for row in rows:
        if len(row) == READING_FIELDS and row[2] * _ticks_per_s() >= MIN_TICKS and row[3] >= 1:
            by_machine.setdefault(row[4], []).append(row)
    shares = []
    for ranks in by_machine.values():
        busy = statistics.median(r[0] for r in ranks)  # each rank's view of the same machine
        own = sum(r[1] for r in ranks)
        elapsed = max(r[2] for r in ranks)
        shares.append(max(0.0, busy - own) / (elapsed * ranks[0][3]))
    return min(1.0, max(shares)) if shares else None
