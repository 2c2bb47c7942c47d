"""How much CPU other processes used while a probe measured: the sign that its run was disturbed;
and how much interrupts and the hypervisor took meanwhile, shown apart and never judged.

On CPU ranks (gloo) a collective's time is the link's time plus whatever other work took the
cores from the ranks. Each rank reads, around its measured loop, the CPUs it may run on (its
affinity, so a pod's cpuset rather than the whole host) from the per-CPU lines of /proc/stat
(proc(5)), its own process's CPU time (getrusage RUSAGE_SELF, all its threads), and the CPU time
(utime + stime of /proc/PID/stat) of netmon's own processes on its machine: the process that
launched it (the daemon, or `netmon probe`) and the rank zygote, which the launcher names in
OWN_PIDS. Foreign time is the user + nice + system time of those CPUs beyond the ranks' and
netmon's own. irq, softirq and steal are not foreign: an interrupt storm from a sick NIC would
otherwise mark every run disturbed and hide the very fault it causes, and steal is the
hypervisor's. They are measured over the same interval as shares of the same CPUs (MODES).
netmon's own time is subtracted whole: the ranks inherit its affinity, and where a rank wrapper
pins them to fewer CPUs, no more than netmon's own (small) use can go unseen as other work.

Ranks are grouped by machine (the kernel's boot_id), since a group's ranks run on several, and
the worst machine counts. /proc/stat counts in clock ticks (100 per second), so a measurement
shorter than MIN_TICKS ticks gives no figure rather than a coarse one.

The row a rank gathers (Reading.since(), READING_FIELDS floats, in seconds unless said):
  0 busy      user + nice + system of the ranks' CPUs (guest time is inside user and nice)
  1 own       this rank's CPU time
  2 elapsed   wall time of the interval
  3 cpus      CPUs in the rank's affinity
  4 machine   the boot_id's first 48 bits (exact in a float64, one per running kernel)
  5 infra     CPU time of netmon's own processes named in OWN_PIDS (0 when none)
  6 launcher  the PID of the launching process among them (0 when none): ranks that name the
              same one read the same processes, whose time counts once per machine
  7 irq       8 softirq       9 steal      (of the ranks' CPUs)

The run-queue wait of the ranks' own threads (schedstat) was tried first: on two cores with two
ranks of several threads each it reads 0.4-0.9 s per second on an idle machine, the ranks
waiting for each other, and so cannot tell a disturbed run from a quiet one.
"""

from __future__ import annotations

import os
import resource
import statistics
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

# proc(5): the "cpu" line's fields are user nice system idle iowait irq softirq steal ...
_BUSY_FIELDS = (0, 1, 2)
_MODE_FIELDS = (5, 6, 7)
MODES = ("irq", "softirq", "steal")  # the `mode` label values, in _MODE_FIELDS order
READING_FIELDS = 10  # the row's length: see the module docstring
_BUSY, _OWN, _ELAPSED, _CPUS, _MACHINE, _INFRA, _LAUNCHER = range(7)
_MODE_COLUMNS = (7, 8, 9)
# One tick of error per CPU at each end: over 10 ticks of wall time the share is within 0.1.
MIN_TICKS = 10
# Set by the launcher in each rank's environment: "BOOT PID:START PID:START...", BOOT the
# boot_id's first 12 hex digits, START the process's start time in ticks (/proc/PID/stat field 22).
OWN_PIDS = "NETMON_OWN_PIDS"


@dataclass(frozen=True)
class Reading:
    busy_s: float  # user + nice + system of the CPUs so far
    modes_s: tuple[float, float, float]  # irq, softirq, steal of the CPUs so far
    own_s: float  # this process's CPU time so far, all threads
    infra_s: float  # netmon's own processes' CPU time so far
    launcher: float  # the launching process's PID, 0 when none was named
    at: float  # time.monotonic()
    cpus: int
    machine: float

    def since(self, before: Reading) -> list[float]:
        """The row a rank gathers (the module docstring has its layout)."""
        return [
            self.busy_s - before.busy_s,
            self.own_s - before.own_s,
            self.at - before.at,
            float(self.cpus),
            self.machine,
            # A named process that ended meanwhile took its time with it: never below 0.
            max(0.0, self.infra_s - before.infra_s),
            self.launcher,
            *(now - then for now, then in zip(self.modes_s, before.modes_s, strict=True)),
        ]


def read(environ: Mapping[str, str] = os.environ) -> Reading | None:
    """This moment's reading, or None where /proc is not Linux's (never raises). netmon's own
    processes are those `environ` names (OWN_PIDS)."""
    try:
        with open("/proc/stat") as stat:
            lines = stat.read().splitlines()
        machine = _machine()
        allowed = os.sched_getaffinity(0)
        cpus = [_mode_ticks(line) for line in lines if _cpu_number(line) in allowed]
        ticks = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None
    if not cpus:
        return None
    own = _own_processes(environ.get(OWN_PIDS, ""), machine)
    busy, irq, softirq, steal = (sum(column) / ticks for column in zip(*cpus, strict=True))
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return Reading(
        busy_s=busy,
        modes_s=(irq, softirq, steal),
        own_s=usage.ru_utime + usage.ru_stime,
        infra_s=sum(_process_ticks(pid, start) for pid, start in own) / ticks,
        launcher=float(own[0][0]) if own else 0.0,
        at=time.monotonic(),
        cpus=len(cpus),
        machine=machine,
    )


def own_pids(pids: Iterable[int | None]) -> str:
    """OWN_PIDS' value naming `pids` (None skipped), for ranks on this machine; "" where /proc
    cannot say."""
    try:
        boot = _boot_id()
    except (OSError, ValueError):
        return ""
    named = []
    for pid in pids:
        fields = _stat_fields(pid) if pid is not None else None
        if fields is not None:
            named.append(f"{pid}:{fields[19]}")  # field 22, starttime
    return " ".join([boot, *named]) if named else ""


def _own_processes(value: str, machine: float) -> list[tuple[int, int]]:
    """(PID, start time) of each process OWN_PIDS names, if it was set on this machine: a PID
    means nothing on another kernel. A malformed value names none."""
    boot, *named = value.split() or [""]
    try:
        if float(int(boot, 16)) != machine:
            return []
        return [(int(pid), int(start)) for pid, start in (item.split(":") for item in named)]
    except ValueError:
        return []


def _process_ticks(pid: int, start: int) -> int:
    """utime + stime (fields 14 and 15) of a process, in ticks; 0 if it is gone, unreadable, or
    another process now (its start time differs: a reused PID, or another PID namespace)."""
    fields = _stat_fields(pid)
    try:
        return int(fields[11]) + int(fields[12]) if fields and int(fields[19]) == start else 0
    except (ValueError, IndexError):
        return 0


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/PID/stat from field 3 on (after the command, which may hold spaces and parens)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields if len(fields) > 19 else None


def _boot_id() -> str:
    with open("/proc/sys/kernel/random/boot_id") as boot:
        return boot.read().strip().replace("-", "")[:12]


def _machine() -> float:
    return float(int(_boot_id(), 16))


def _cpu_number(line: str) -> int | None:
    """N for a "cpuN ..." line of /proc/stat, None for any other line."""
    name = line.split(maxsplit=1)[0] if line.strip() else ""
    return int(name[3:]) if name.startswith("cpu") and name[3:].isdigit() else None


def _mode_ticks(line: str) -> tuple[int, int, int, int]:
    """busy (user + nice + system), irq, softirq and steal ticks of one cpuN line."""
    fields = [int(v) for v in line.split()[1:]]
    busy = sum(fields[i] for i in _BUSY_FIELDS if i < len(fields))
    irq, softirq, steal = (fields[i] if i < len(fields) else 0 for i in _MODE_FIELDS)
    return busy, irq, softirq, steal


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


def _machines(rows: Sequence[Sequence[float]]) -> list[list[Sequence[float]]]:
    """The well-formed rows long enough to count, by machine; each machine's ranks view it alike."""
    by_machine: dict[float, list[Sequence[float]]] = {}
    for row in rows:
        long_enough = len(row) == READING_FIELDS and row[_ELAPSED] * _ticks_per_s() >= MIN_TICKS
        if long_enough and row[_CPUS] >= 1:
            by_machine.setdefault(row[_MACHINE], []).append(row)
    return list(by_machine.values())


def _capacity(ranks: Sequence[Sequence[float]]) -> float:
    """CPU seconds the machine's ranks' CPUs had over the measurement."""
    return max(r[_ELAPSED] for r in ranks) * ranks[0][_CPUS]


def _infrastructure(ranks: Sequence[Sequence[float]]) -> float:
    """netmon's own CPU seconds on one machine: the ranks one process launched all read the same
    processes, so each launcher counts once (its ranks' median), and two daemons on one machine
    (a group tried out on one host) both count."""
    by_launcher: dict[float, list[float]] = {}
    for r in ranks:
        by_launcher.setdefault(r[_LAUNCHER], []).append(r[_INFRA])
    return sum(statistics.median(seconds) for seconds in by_launcher.values())


def foreign_share(rows: Sequence[Sequence[float]]) -> float | None:
    """Other processes' user + nice + system CPU seconds per second per CPU during the
    measurement (0 quiet, 1 every core taken), on the worst machine; None without readings.
    `rows` are Reading.since() rows, one per rank."""
    shares = [
        max(0.0, _median(ranks, _BUSY) - sum(r[_OWN] for r in ranks) - _infrastructure(ranks))
        / _capacity(ranks)
        for ranks in _machines(rows)
    ]
    return min(1.0, max(shares)) if shares else None


def mode_shares(rows: Sequence[Sequence[float]]) -> dict[str, float]:
    """The share of the ranks' CPUs each of MODES took during the measurement, on the machine
    where it was highest; empty without readings."""
    machines = _machines(rows)
    if not machines:
        return {}
    shares = {}
    for mode, column in zip(MODES, _MODE_COLUMNS, strict=True):
        highest = max(_median(ranks, column) / _capacity(ranks) for ranks in machines)
        shares[mode] = min(1.0, max(0.0, highest))
    return shares


def _median(ranks: Sequence[Sequence[float]], column: int) -> float:
    return statistics.median(r[column] for r in ranks)  # each rank's view of the same machine
