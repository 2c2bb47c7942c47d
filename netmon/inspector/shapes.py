"""The jobs' collectives of one read, grouped into shapes and summed up per shape: a bounded set
of series however many communicators, ranks and jobs come and go. Pure: no clock, no I/O.

A shape is (op, size bucket, ranks, path): the largest power of two not over the message size,
the communicator's size, and `node` for a communicator within this node or `nodes` for one
across nodes. At most `cap` shapes are kept, and no job (its owner, where known) holds more than
its fair share of them while others want one; a collective of a shape past the cap is counted,
never exported, and a shape idle for `idle_s` leaves, making room. A record whose figures
cannot be a measurement (a rate beyond any link, a time out of line with its size and rate) is
counted by reason and taken no further.

A shape's sample (a Window) is taken over `window_s`, several dumps (the plugin keeps only each
communicator's latest collective per dump): for each job, the upper quartile of one value per
communicator and dump; then the lower median of the jobs' levels. A collective that met a slow
step of its job (a straggler, a stall, compute sharing the GPU) runs slower, never faster: a fact
about the job, outvoted unless most of the window met one, while a link that lost bandwidth slows
them all. The files are the jobs' own, so no job's figures can lift a window above the others':
one job may lower a window's value, never its verdict alone (serve/jobs_record.py).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from netmon.baseline import robust
from netmon.inspector.records import Collective, implausible

PATHS = ("node", "nodes")
MAX_PENDING = 4096
MAX_PENDING_PER_JOB = MAX_PENDING // 8
WINDOW_QUANTILE = 0.75  # a shape's collectives kept for one window: the rest of it is not needed


@dataclass(frozen=True, order=True)
class Shape:
    op: str
    size_bytes: int
    ranks: int
    path: str

    def key(self, probe: str) -> tuple[str, str, int, str, int]:
        """Its series' key (probe, op, size_bytes, path, ranks), as the baseline book keeps it."""
        return (probe, self.op, self.size_bytes, self.path, self.ranks)


def shape_of(collective: Collective) -> Shape:
    bucket = 1 << (collective.size_bytes.bit_length() - 1)
    path = "node" if collective.nodes <= 1 else "nodes"
    return Shape(collective.op, bucket, collective.ranks, path)


@dataclass(frozen=True)
class Window:
    """One shape's sample: its busbw (the window's upper quartile), the medians of algbw and
    time, the spread of the values over the median as a cv, and how many values."""

    shape: Shape
    busbw: float
    algbw: float
    seconds: float
    cv: float
    collectives: int
    # Each job's (owner's) own level, the upper quartile of its values: (witness, busbw).
    levels: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True)
class Round:
    windows: tuple[Window, ...]
    collectives: dict[str, int]  # by path
    dropped: int  # collectives of shapes past the cap
    covered: float | None  # share of the collectives' time in kept shapes (None: none seen)
    expired: tuple[Shape, ...]  # shapes that left for being idle
    rejected: Counter[str] = field(default_factory=Counter)  # implausible records, by reason


@dataclass
class Shapes:
    cap: int
    idle_s: float
    window_s: float  # a shape's sample spans this long: several dumps (netmon.inspector.settings)
    last_seen: dict[Shape, float] = field(default_factory=dict)
    pending: dict[Shape, list[Collective]] = field(default_factory=dict)
    window_start: float | None = None
    holder: dict[Shape, str] = field(default_factory=dict)  # whose slot each kept shape is

    def take(self, collectives: Iterable[Collective], now: float) -> Round:
        grouped: dict[Shape, list[Collective]] = {}
        rejected: Counter[str] = Counter()
        for collective in collectives:
            reason = implausible(collective)
            if reason is not None:
                rejected[reason] += 1
            else:
                grouped.setdefault(shape_of(collective), []).append(collective)
        expired = self._expire(now, grouped)
        expired += self._admit(grouped)
        kept = {s: c for s, c in grouped.items() if s in self.last_seen}
        for shape, group in kept.items():
            self.last_seen[shape] = now
            waiting = self.pending.setdefault(shape, [])
            # A job's share of a window too: one with thousands of communicators must not
            # crowd the others' values out of it.
            per_job = Counter(c.witness for c in waiting)
            for collective in _least_waited(group):
                if len(waiting) >= MAX_PENDING:
                    break
                if per_job[collective.witness] < MAX_PENDING_PER_JOB:
                    per_job[collective.witness] += 1
                    waiting.append(collective)
        seen = [c for group in grouped.values() for c in group]
        total = sum(c.seconds for c in seen)
        covered = sum(c.seconds for group in kept.values() for c in group)
        return Round(
            windows=self._close(now),
            collectives={p: sum(1 for c in seen if shape_of(c).path == p) for p in PATHS},
            dropped=len(seen) - sum(len(group) for group in kept.values()),
            covered=covered / total if total > 0 else None,
            expired=expired,
            rejected=rejected,
        )

    def _close(self, now: float) -> tuple[Window, ...]:
        """The windows of every shape once `window_s` has passed since the last closed."""
        if self.window_start is None:
            self.window_start = now
        # A read's clock wanders by a little: a window closes on the read nearest its end.
        if now - self.window_start < self.window_s * 0.9:
            return ()
        windows = tuple(
            _window(s, self.pending[s]) for s in sorted(self.pending) if self.pending[s]
        )
        self.pending = {}
        self.window_start = now
        return windows

    def _expire(self, now: float, grouped: dict[Shape, list[Collective]]) -> tuple[Shape, ...]:
        gone = tuple(
            s for s, at in self.last_seen.items() if now - at > self.idle_s and s not in grouped
        )
        for shape in gone:
            del self.last_seen[shape]
            self.pending.pop(shape, None)
            self.holder.pop(shape, None)
        return gone

    def _admit(self, grouped: dict[Shape, list[Collective]]) -> tuple[Shape, ...]:
        """Room for new shapes, the ones that take the most time first: they are where a slow
        link costs most. Each is held by the job (owner) that spent the most time in it, and no
        one holds more than its share of the slots while others want one: a job that fills its
        files with shapes cannot keep the others' out. Returns the shapes evicted for room."""
        new = sorted(
            (s for s in grouped if s not in self.last_seen),
            key=lambda s: (-sum(c.seconds for c in grouped[s]), s),
        )
        holders = {shape: _holder(grouped[shape]) for shape in new}
        held = Counter(self.holder.values())
        share = fair_shares(held + Counter(holders.values()), self.cap)
        evicted: list[Shape] = []
        for shape in new:
            holder = holders[shape]
            if held[holder] >= share[holder]:
                continue
            if len(self.last_seen) >= self.cap:
                over = [s for s, h in self.holder.items() if held[h] > share[h]]
                if not over:
                    continue
                # Of a holder over its share, the shape that took the least time in this read.
                victim = min(over, key=lambda s: (sum(c.seconds for c in grouped.get(s, ())), s))
                held[self.holder.pop(victim)] -= 1
                del self.last_seen[victim]
                self.pending.pop(victim, None)
                evicted.append(victim)
            held[holder] += 1
            self.holder[shape] = holder
            self.last_seen[shape] = 0.0
        return tuple(evicted)


def fair_shares(demand: Counter[str], cap: int) -> dict[str, int]:
    """Max-min fair shares of `cap` slots: each gets what it asks up to an even split, and what
    the modest leave goes to the rest, so one job alone may use every slot and never keeps a
    newcomer from its share."""
    share = dict.fromkeys(demand, 0)
    left = cap
    wanting = sorted((w for w in demand if demand[w] > 0), key=lambda w: (demand[w], w))
    while left > 0 and wanting:
        each = max(1, left // len(wanting))
        for witness in list(wanting):
            give = min(each, demand[witness] - share[witness], left)
            share[witness] += give
            left -= give
            if share[witness] >= demand[witness]:
                wanting.remove(witness)
            if left == 0:
                break
    return share


def _holder(collectives: list[Collective]) -> str:
    """The witness that spent the most time in these collectives (ties: the first by name)."""
    spent: dict[str, float] = {}
    for c in collectives:
        spent[c.witness] = spent.get(c.witness, 0.0) + c.seconds
    return min(spent, key=lambda w: (-spent[w], w))


def _window(shape: Shape, collectives: list[Collective]) -> Window:
    by_job: dict[str, list[Collective]] = {}
    for c in collectives:
        by_job.setdefault(c.witness, []).append(c)
    levels = {job: _level([c.busbw for c in group]) for job, group in sorted(by_job.items())}
    return Window(
        shape=shape,
        busbw=lower_median([level for level, _ in levels.values()]),
        algbw=lower_median([robust.median([c.algbw for c in g]) for g in by_job.values()]),
        seconds=robust.median([c.seconds for c in collectives]),
        # One job's noise must not make every window inconclusive (a cut hidden as noise).
        cv=lower_median([cv for _, cv in levels.values()]),
        collectives=len(collectives),
        levels=tuple((job, level) for job, (level, _) in levels.items()),
    )


def _level(busbw: list[float]) -> tuple[float, float]:
    """One job's level (the upper quartile of its values) and their spread over it as a cv."""
    level = robust.quantile(busbw, WINDOW_QUANTILE)
    centre = robust.median(busbw)
    # The spread of the values over the median: a slow step of the job (a low outlier) says
    # nothing of the link, the jitter of the transfers themselves does.
    upper = [b for b in busbw if b >= centre]
    spread = robust.MAD_TO_SIGMA * robust.median([abs(b - level) for b in upper])
    return level, spread / level if len(busbw) >= 3 and level > 0 else 0.0


def lower_median(values: Sequence[float]) -> float:
    """The median, the lower of the middle two of an even count: of two jobs, the lower one."""
    return sorted(values)[(len(values) - 1) // 2]


def _least_waited(collectives: list[Collective]) -> list[Collective]:
    """One record per communicator in one read: of its ranks' on this node, the fastest. A
    rank's time runs from its own kernel's start, so a rank that came early also waited for the
    last one; the last to come waited least, and its time is the transfer's. Each rank's record
    is its own latest collective (each process dumps on its own clock), so the fastest of them
    is also the least likely to be one that met a slow step of the job."""
    best: dict[str, Collective] = {}
    for c in collectives:
        if c.comm not in best or c.busbw > best[c.comm].busbw:
            best[c.comm] = c
    return list(best.values())
