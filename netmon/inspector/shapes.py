"""The jobs' collectives of one read, grouped into shapes and summed up per shape: a bounded set
of series however many communicators, ranks and jobs come and go. Pure: no clock, no I/O.

A shape is (op, size bucket, ranks, path): the largest power of two not over the message size,
the communicator's size, and `node` for a communicator within this node or `nodes` for one
across nodes. At most `cap` shapes are kept; a collective of a shape past the cap is counted,
never exported, and a shape idle for `idle_s` leaves, making room.

A shape's sample (a Window) is taken over `window_s`, several dumps (the plugin keeps only each
communicator's latest collective per dump): the upper quartile of one value per communicator and
dump. A collective that met a slow step of its job (a straggler, a stall, compute sharing the
GPU) runs slower, never faster: a fact about the job, outvoted unless most of the window met one,
while a link that lost bandwidth slows them all.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from netmon.baseline import robust
from netmon.inspector.records import Collective

PATHS = ("node", "nodes")
MAX_PENDING = 4096
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


@dataclass(frozen=True)
class Round:
    windows: tuple[Window, ...]
    collectives: dict[str, int]  # by path
    dropped: int  # collectives of shapes past the cap
    covered: float | None  # share of the collectives' time in kept shapes (None: none seen)
    expired: tuple[Shape, ...]  # shapes that left for being idle


@dataclass
class Shapes:
    cap: int
    idle_s: float
    window_s: float  # a shape's sample spans this long: several dumps (netmon.inspector.settings)
    last_seen: dict[Shape, float] = field(default_factory=dict)
    pending: dict[Shape, list[Collective]] = field(default_factory=dict)
    window_start: float | None = None

    def take(self, collectives: Iterable[Collective], now: float) -> Round:
        grouped: dict[Shape, list[Collective]] = {}
        for collective in collectives:
            grouped.setdefault(shape_of(collective), []).append(collective)
        expired = self._expire(now, grouped)
        self._admit(grouped)
        kept = {s: c for s, c in grouped.items() if s in self.last_seen}
        for shape, group in kept.items():
            self.last_seen[shape] = now
            waiting = self.pending.setdefault(shape, [])
            waiting.extend(_least_waited(group)[: MAX_PENDING - len(waiting)])
        seen = [c for group in grouped.values() for c in group]
        total = sum(c.seconds for c in seen)
        covered = sum(c.seconds for group in kept.values() for c in group)
        return Round(
            windows=self._close(now),
            collectives={p: sum(1 for c in seen if shape_of(c).path == p) for p in PATHS},
            dropped=len(seen) - sum(len(group) for group in kept.values()),
            covered=covered / total if total > 0 else None,
            expired=expired,
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
        return gone

    def _admit(self, grouped: dict[Shape, list[Collective]]) -> None:
        # The shapes that take the most time first: they are where a slow link costs most.
        new = sorted(
            (s for s in grouped if s not in self.last_seen),
            key=lambda s: (-sum(c.seconds for c in grouped[s]), s),
        )
        for shape in new[: max(0, self.cap - len(self.last_seen))]:
            self.last_seen[shape] = 0.0


def _window(shape: Shape, collectives: list[Collective]) -> Window:
    busbw = [c.busbw for c in collectives]
    level = robust.quantile(busbw, WINDOW_QUANTILE)
    centre = robust.median(busbw)
    # The spread of the values over the median: a slow step of the job (a low outlier) says
    # nothing of the link, the jitter of the transfers themselves does.
    upper = [b for b in busbw if b >= centre]
    spread = robust.MAD_TO_SIGMA * robust.median([abs(b - level) for b in upper])
    return Window(
        shape=shape,
        busbw=level,
        algbw=robust.median([c.algbw for c in collectives]),
        seconds=robust.median([c.seconds for c in collectives]),
        cv=spread / level if len(busbw) >= 3 and level > 0 else 0.0,
        collectives=len(collectives),
    )


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
