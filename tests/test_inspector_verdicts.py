"""The jobs' own collectives judged like probes: a node shape cut to 70 % in the files is flagged
within 10 samples and clears after; a healthy day with the noise jobs' collectives have (a daily
swing, shared jitter, ranks that came early and waited, hiccups) gives no verdict; the shapes and
the daemon's memory stay bounded whatever comes and goes."""

from __future__ import annotations

import gc
import math
import os
import random
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from netmon.baseline import BaselineBook, BaselinePolicy
from netmon.inspector.files import DumpReader, Reading
from netmon.inspector.records import Collective
from netmon.inspector.settings import InspectorConfig
from netmon.inspector.shapes import Shapes, shape_of
from netmon.serve.jobs_record import JobsRecord
from tests.inspector_files import Comm, json_dump, prom_dump, training_comms

START = 1_790_000_000.0
EVERY = 30.0  # the plugin's textfile interval
DAY = int(24 * 3600 / EVERY)
# The intra-node AllReduce of the tensor-parallel group: the shape the tests cut.
CUT = ("jobs", "all_reduce", 64 << 20, "node", 8)


@dataclass(frozen=True)
class Level:
    """How noisy the jobs' collectives are: the daily swing, the jitter shared by one
    collective's ranks (lognormal sigma), the share of collectives that meet a slow step of the
    job and how much slower they run then, and the mean wait of a rank that came early."""

    swing: float = 0.06
    jitter: float = 0.03
    hiccups: float = 0.03
    hiccup: float = 1.6
    wait: float = 0.1


QUIET = Level()
BUSY = Level(swing=0.10, jitter=0.05, hiccups=0.10, hiccup=1.6, wait=0.2)
ROUGH = Level(swing=0.10, jitter=0.08, hiccups=0.15, hiccup=2.0, wait=0.3)


class Noise:
    """busbw per (comm, gpu) at one dump: a level per communicator, a daily swing, jitter shared
    by the collective's ranks, hiccups (a slow step), and each rank's wait for the last."""

    def __init__(self, seed: int, level: Level = QUIET) -> None:
        self.random = random.Random(seed)
        self.level = level
        self.shared: dict[int, float] = {}
        self.skew: dict[tuple[int, int], float] = {}

    def dump(
        self, at: float, cut: Callable[[Comm], float] = lambda _c: 1.0
    ) -> Callable[[Comm, int], float]:
        rng, noise = self.random, self.level
        daily = 1.0 + noise.swing * math.sin(2 * math.pi * (at - START) / 86400.0)
        self.shared = {}
        self.skew = {}

        def busbw_of(comm: Comm, gpu: int) -> float:
            if comm.comm_id not in self.shared:
                hiccup = 1 / noise.hiccup if rng.random() < noise.hiccups else 1.0
                self.shared[comm.comm_id] = daily * rng.lognormvariate(0, noise.jitter) * hiccup
                last = rng.choice(comm.gpus)  # the rank that came last waited for no one
                for g in comm.gpus:
                    wait = rng.expovariate(1 / noise.wait)
                    self.skew[(comm.comm_id, g)] = 0.0 if g == last else wait
            level = 330.0 if comm.nnodes == 1 else 45.0
            shared = self.shared[comm.comm_id] * cut(comm)
            return level * shared / (1.0 + self.skew[(comm.comm_id, gpu)])

        return busbw_of


def _record(settings: InspectorConfig) -> tuple[JobsRecord, Shapes]:
    book = BaselineBook(BaselinePolicy())
    return JobsRecord(settings, book), Shapes(
        settings.max_shapes, settings.shape_idle, settings.window
    )


def _cut_tp(comm: Comm) -> float:
    return 0.7 if comm.coll == "AllReduce" and comm.message_bytes == 64 << 20 else 1.0


@pytest.mark.parametrize(("mode", "seed"), [("prom", 3603), ("json", 3602)])
def test_a_node_shape_cut_to_70_percent_in_the_files_is_flagged_within_10_samples_and_clears(
    tmp_path: Path, mode: str, seed: int
) -> None:
    settings = InspectorConfig(dir=tmp_path)
    reader = DumpReader(settings)
    record, shapes = _record(settings)
    noise = Noise(seed)
    comms = training_comms()
    # In dumps (reads): a sample is a window of four.
    per_sample = int(settings.window / EVERY)
    healthy, cut, after = 60, 20 * per_sample, 50 * per_sample
    flagged_at: int | None = None
    cleared_at: int | None = None
    others_flagged = []
    for n in range(healthy + cut + after):
        at = START + n * EVERY
        busbw_of = noise.dump(at, _cut_tp if healthy <= n < healthy + cut else lambda _c: 1.0)
        if mode == "prom":
            prom_dump(tmp_path / "4242", comms, busbw_of, at, n + 1)
        else:
            json_dump(tmp_path / "4242", comms, busbw_of, at, n + 1)
        reading = reader.read(at + 1)
        assert reading.rejected == {}
        record.took(shapes.take(reading.collectives, at + 1), reading, at + 1, {})
        degraded = {k for k, p in record.points.items() if p.degraded}
        others_flagged += sorted(degraded - {CUT})
        if CUT in degraded and flagged_at is None:
            flagged_at = n
        if flagged_at is not None and CUT not in degraded and cleared_at is None:
            cleared_at = n
    assert not others_flagged, others_flagged
    assert flagged_at is not None and healthy <= flagged_at < healthy + 10 * per_sample, flagged_at
    assert cleared_at is not None and cleared_at < healthy + cut + after, "never cleared"


def _collectives(
    noise: Noise,
    at: float,
    comms: list[Comm],
    serial: int,
    cut: Callable[[Comm], float] = lambda _c: 1.0,
) -> list[Collective]:
    """One dump's collectives as the parsers give them, without the files (a day is 2,880)."""
    busbw_of = noise.dump(at, cut)
    found = []
    for comm in comms:
        if comm.nranks == 1:
            continue
        # Each rank's process dumps on its own clock: half the time a rank's latest collective
        # is not the one its peers' files show.
        apart = noise.random.random() < 0.5
        for index, gpu in enumerate(comm.gpus):
            exec_us, algbw, busbw = comm.timing(busbw_of(comm, gpu))
            found.append(
                Collective(
                    op=shape_op(comm.coll),
                    size_bytes=comm.traffic() if comm.coll != "AllReduce" else comm.message_bytes,
                    ranks=comm.nranks,
                    nodes=comm.nnodes,
                    busbw=busbw * 1e9,
                    algbw=algbw * 1e9,
                    seconds=exec_us / 1e6,
                    comm=f"4242/{comm.comm_id:x}",
                    serial=serial + (index if apart else 0),
                )
            )
    return found


def shape_op(coll: str) -> str:
    return {
        "AllReduce": "all_reduce",
        "AllGather": "all_gather",
        "ReduceScatter": "reduce_scatter",
        "Broadcast": "broadcast",
    }[coll]


@pytest.mark.parametrize(
    ("seed", "level"), [(3611, QUIET), (3612, QUIET), (3613, BUSY), (3614, ROUGH)]
)
def test_a_healthy_day_of_the_jobs_collectives_gives_no_verdict(seed: int, level: Level) -> None:
    settings = InspectorConfig(dir=Path("/nonexistent"))
    record, shapes = _record(settings)
    noise = Noise(seed, level)
    comms = training_comms()
    judged = 0
    for n in range(DAY):
        at = START + n * EVERY
        round_ = shapes.take(_collectives(noise, at, comms, n * 16), at)
        verdicts = record.took(round_, Reading(), at, {})
        judged += sum(1 for _, v in verdicts if v.judged and not v.inconclusive)
        flagged = sorted(k for k, p in record.points.items() if p.degraded)
        assert not flagged, f"window {n}: {flagged}"
    # The four node shapes were judged, a sample each per window (four dumps), not skipped; a
    # window far noisier than the shape's usual is inconclusive, a few in a rough day.
    assert judged > 0.75 * 4 * DAY * EVERY / settings.window
    node_shapes = {k for k in record.points if k[3] == "node"}
    assert len(node_shapes) == 4


def test_shapes_are_capped_the_overflow_counted_and_an_idle_shape_leaves() -> None:
    shapes = Shapes(cap=3, idle_s=600, window_s=EVERY)
    comms = training_comms()
    noise = Noise(1)
    first = shapes.take(_collectives(noise, START, comms, 0), START)
    assert first.windows == () and first.dropped > 0  # the first window has just opened
    second = shapes.take(_collectives(noise, START + EVERY, comms, 16), START + EVERY)
    assert len(second.windows) == 3
    # The three that took the most time were kept: the large ones.
    kept = {w.shape.size_bytes for w in second.windows}
    assert kept == {64 << 20, 512 << 20, 16 << 20}
    assert second.covered is not None and 0.9 < second.covered < 1.0
    only_small = [c for c in _collectives(noise, START + 700, comms, 32) if c.size_bytes == 1 << 20]
    later = shapes.take(only_small, START + 700)
    assert len(later.expired) == 3  # idle past idle_s: gone, making room
    assert [w.shape.size_bytes for w in later.windows] == [1 << 20]
    assert {shape_of(c) for c in only_small} == {w.shape for w in later.windows}


def test_memory_stays_flat_over_hours_of_files_as_jobs_come_and_go(tmp_path: Path) -> None:
    settings = InspectorConfig(dir=tmp_path, grace=60)
    reader = DumpReader(settings)
    record, shapes = _record(settings)
    noise = Noise(7)
    # A new job every 45 minutes, each with new communicator ids (bench/inspector_bench.py
    # runs 24 hours of it; three keep the test short).
    hours, per_job = 3, 90
    sizes: list[int] = []
    try:
        for n in range(int(hours * 3600 / EVERY)):
            at = START + n * EVERY
            job = n // per_job
            comms = [
                Comm(c.comm_id + job * 0x1000, c.coll, c.message_bytes, c.nranks, c.nnodes, c.gpus)
                for c in training_comms()
            ]
            directory = tmp_path / str(job)
            prom_dump(directory, comms, noise.dump(at), at, n + 1, job=str(job))
            if n % per_job == per_job - 1:
                (directory / ".ended").touch()  # the epilog's mark; removed after the grace
                os.utime(directory / ".ended", (at, at))
            reading = reader.read(at + 1)
            record.took(shapes.take(reading.collectives, at + 1), reading, at + 1, {})
            if n == 119:
                tracemalloc.start()  # after the first hour: caches, the book's windows filled
            if n % 120 == 119:
                gc.collect()  # also empties the interpreter's free lists: what is really kept
                sizes.append(tracemalloc.get_traced_memory()[0])
    finally:
        tracemalloc.stop()
    assert len(list(tmp_path.iterdir())) <= 2  # ended jobs' directories removed
    assert record.view().removed >= 3
    # What is kept grows only while the book's windows fill (its long level holds 120 samples,
    # four hours of two-minute windows; its reference a day of hours): some 8 KiB an hour for
    # four shapes, and nothing for the jobs, files and communicators that came and went.
    assert sizes[2] - sizes[1] < 16 << 10, sizes
    assert sizes[2] < 128 << 10, sizes


@pytest.mark.parametrize(("seed", "level"), [(3621, BUSY), (3622, ROUGH), (3623, ROUGH)])
def test_a_cut_under_a_busy_jobs_noise_is_flagged_within_10_samples_and_nothing_else(
    seed: int, level: Level
) -> None:
    settings = InspectorConfig(dir=Path("/nonexistent"))
    record, shapes = _record(settings)
    noise = Noise(seed, level)
    comms = training_comms()
    per_sample = int(settings.window / EVERY)
    healthy, cut = 240, 20 * per_sample
    flagged_at = None
    for n in range(healthy + cut):
        at = START + n * EVERY
        now_cut = _cut_tp if n >= healthy else (lambda _c: 1.0)
        round_ = shapes.take(_collectives(noise, at, comms, n * 16, now_cut), at)
        record.took(round_, Reading(), at, {})
        degraded = {k for k, p in record.points.items() if p.degraded}
        assert degraded <= {CUT}, (n, degraded)
        if CUT in degraded and flagged_at is None:
            flagged_at = n
    assert flagged_at is not None and flagged_at < healthy + 10 * per_sample, flagged_at
