"""The daemon's record of the jobs' own collectives: each shape's latest window as a series with
probe="jobs", a node shape judged by the baseline book like a probe's series, and the reading's
counts. Called under Results' lock; pure apart from the book it is given.

A shape within the node (path "node") runs over the node's NVLink/PCIe fabric whoever's job it
is, so the book judges it; a shape across nodes (path "nodes") also depends on the job's other
nodes, so it is exported for the fleet comparison (recording rules rank the nodes) and not judged
here. The book keeps the tracks of node shapes that went idle, up to KEEP_PER_SHAPE x max_shapes
of them (the least recently seen healthy ones go first), so a shape a daily job brings back is
judged against what it learned before.

The files are the jobs' own, so the book's verdict is not the last word: a node shape is shown
degraded only while the evidence agrees, in the window at hand, across at least two witnesses
(distinct owners, else job directories) whose own levels are under the series' healthy line,
or while an idle probe's series of the same op, size and ranks is degraded too. A degradation
that one job alone says is counted (netmon_jobs_unconfirmed_total) and shown healthy
(docs/INSPECTOR.md, "What a job can and cannot make netmon say").
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Mapping

from netmon import baseline
from netmon.exposition.snapshot import JobsView, SeriesKey, SeriesPoint, verdict_fields
from netmon.inspector.files import Reading
from netmon.inspector.settings import InspectorConfig
from netmon.inspector.shapes import Round, Shape, Window

PROBE = "jobs"
KEEP_PER_SHAPE = 4
# An idle probe's series of the same shape runs on these paths (NCCL's choice, as the jobs').
YARDSTICK_PATHS = ("default", "nvlink")
WITNESSES = 2  # distinct owners (or jobs) that must agree before a jobs series is degraded


class JobsRecord:
    def __init__(self, settings: InspectorConfig, book: baseline.BaselineBook) -> None:
        self.settings = settings
        self._book = book
        self.points: dict[SeriesKey, SeriesPoint] = {}
        self._collectives: Counter[str] = Counter()
        self._rejected: Counter[str] = Counter()
        self._overflow = 0
        self._removed = 0
        self._directories: dict[str, int] = {}
        self._unconfirmed = 0
        self._covered: float | None = None
        self._read_at: float | None = None
        self._ratios: dict[tuple[str, int, int], float] = {}
        self._judged_at: dict[SeriesKey, float] = {}  # node shapes in the book, last judged
        self._keys: dict[Shape, SeriesKey] = {}  # the exported shapes' series keys

    def took(
        self, round_: Round, reading: Reading, now: float, probes: Mapping[SeriesKey, SeriesPoint]
    ) -> list[tuple[SeriesKey, baseline.Verdict]]:
        """One read: its windows judged and exported, expired shapes gone, counts added; returns
        the verdicts reached."""
        self._collectives.update(round_.collectives)
        self._rejected.update(reading.rejected)
        self._rejected.update(round_.rejected)
        self._overflow += round_.dropped
        self._removed += reading.removed
        self._directories = dict(reading.directories)
        self._covered = round_.covered if round_.covered is not None else self._covered
        self._read_at = now
        for shape in round_.expired:
            key = self._keys.pop(shape, None)
            if key is not None:
                self.points.pop(key, None)
        verdicts = [
            found for w in round_.windows if (found := self._export(w, now, probes)) is not None
        ]
        self._ratios = _yardsticks(self.points, probes)
        self._keep_bounded()
        return verdicts

    def _export(
        self, window: Window, now: float, probes: Mapping[SeriesKey, SeriesPoint]
    ) -> tuple[SeriesKey, baseline.Verdict] | None:
        shape = window.shape
        # One key object per shape, made once: a new tuple each window, let go at once, piles
        # up in the interpreter's tuple free list (tracemalloc saw 30 a hour for days).
        key = self._keys.get(shape)
        if key is None:
            key = self._keys[shape] = shape.key(PROBE)
        before = self.points.get(key)
        was = before is not None and before.degraded
        verdict = None
        judged: dict[str, object] = {"judged": False}
        if shape.path == "node" and window.collectives >= self.settings.min_collectives:
            observed = self._book.observe(key, window.busbw, window.cv, None, at=now)
            verdict = self._shown(key, window, observed, probes, was)
            self._judged_at[key] = now
            judged = verdict_fields(verdict)
        elif before is not None and before.judged:
            # Too few to judge: the last verdict, as it was shown.
            last = self._book.verdict(key)
            judged = verdict_fields(last if last is None or was else _healthy(last, was))
        self.points[key] = SeriesPoint(
            probe=PROBE,
            op=shape.op,
            size_bytes=shape.size_bytes,
            path=shape.path,
            busbw=window.busbw,
            algbw=window.algbw,
            latency_s=window.seconds,
            cv=window.cv,
            measured_at=now,
            ranks=shape.ranks,
            **judged,  # type: ignore[arg-type]
        )
        return (key, verdict) if verdict is not None else None

    def _shown(
        self,
        key: SeriesKey,
        window: Window,
        verdict: baseline.Verdict,
        probes: Mapping[SeriesKey, SeriesPoint],
        was: bool,
    ) -> baseline.Verdict:
        """The book's verdict as it may be shown: degraded only where it is confirmed."""
        if verdict.degraded:
            line = (verdict.expected or 0.0) * self._book.policy.ratio_for(key[2])
            agree = {job for job, level in window.levels if level < line}
            if len(agree) >= WITNESSES or _probe_degraded(key, probes):
                return dataclasses.replace(verdict, changed=not was)
            self._unconfirmed += 1
        return _healthy(verdict, was)

    def _keep_bounded(self) -> None:
        most = KEEP_PER_SHAPE * self.settings.max_shapes
        if len(self._judged_at) <= most:
            return
        verdicts = self._book.verdicts()
        idle = sorted(
            (at, key)
            for key, at in self._judged_at.items()
            if key not in self.points and not (verdicts.get(key) and verdicts[key].degraded)
        )
        gone = [key for _, key in idle[: len(self._judged_at) - most]]
        self._book.drop(gone)
        for key in gone:
            del self._judged_at[key]

    def adopt(self, keys: list[SeriesKey]) -> None:
        """The book's jobs series from the state file: kept within the same bound."""
        self._judged_at.update((key, 0.0) for key in keys if key[0] == PROBE)

    def view(self) -> JobsView:
        return JobsView(
            collectives=dict(self._collectives),
            overflow=self._overflow,
            shapes=len(self.points),
            covered=self._covered,
            rejected=dict(self._rejected),
            removed=self._removed,
            directories=dict(self._directories),
            unconfirmed=self._unconfirmed,
            read_at=self._read_at,
            window_s=self.settings.window,
            probe_ratios=dict(self._ratios),
        )


def _healthy(verdict: baseline.Verdict, was: bool) -> baseline.Verdict:
    """A verdict shown healthy: what the book says but no one confirms."""
    if not verdict.degraded:
        return dataclasses.replace(verdict, changed=was)
    return dataclasses.replace(
        verdict, degraded=False, reason=None, degraded_since=None, changed=was
    )


def _probe_degraded(key: SeriesKey, probes: Mapping[SeriesKey, SeriesPoint]) -> bool:
    """An idle probe's series of the jobs shape's op, size and ranks is degraded."""
    _, op, size, _, ranks = key
    return any(
        point.degraded
        for (probe, p_op, p_size, path, p_ranks), point in probes.items()
        if probe != PROBE
        and path in YARDSTICK_PATHS
        and (p_op, p_size, p_ranks) == (op, size, ranks)
    )


def _yardsticks(
    jobs: Mapping[SeriesKey, SeriesPoint], probes: Mapping[SeriesKey, SeriesPoint]
) -> dict[tuple[str, int, int], float]:
    """Each node shape's busbw over the reference (else the baseline) of an idle probe's series
    of the same op, size and ranks, where the daemon has one."""
    expected: dict[tuple[str, int, int], float] = {}
    for (probe, op, size, path, ranks), point in probes.items():
        level = point.reference or point.baseline
        if probe != PROBE and path in YARDSTICK_PATHS and level:
            expected.setdefault((op, size, ranks), level)
    return {
        (op, size, ranks): point.busbw / expected[(op, size, ranks)]
        for (_, op, size, path, ranks), point in jobs.items()
        if path == "node" and (op, size, ranks) in expected
    }
