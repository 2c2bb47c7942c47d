"""The daemon's per-series path, offline: a recorded stream of results through the baseline
book exactly as the daemon feeds it (settling after a start or a pause, inconclusive results,
the verdict, the state file saved and loaded across a restart). `netmon replay` prints what it
gives; the tests drive the rule with it (docs/SIGNAL.md, "Replay").

A stream is JSON lines, one result each:
    {"t": unix_s, "probe": ..., "op": ..., "size": bytes, "ranks": n, "path": ...,
     "busbw": bytes_per_s, "cpu": share (optional), "cv": ... (optional), "restart": true
     (optional: the daemon restarts before this result)}
or a Prometheus query_range answer for netmon_busbw_bytes_per_second (netmon.serve.promstream).
"""

from __future__ import annotations

import itertools
import math
import statistics
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, NamedTuple, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from netmon import bandwidth, baseline
from netmon.errors import describe_validation_error
from netmon.serve.pausing import after_pause

Finite = Annotated[float, Field(allow_inf_nan=False)]


class StreamResult(BaseModel):
    """One result of a recorded stream. Keys beyond these are ignored (an export may carry
    its own labels)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    t: Finite
    probe: str = Field(min_length=1)
    op: str = Field(min_length=1)
    size: int = Field(ge=0)
    ranks: int = Field(ge=0)
    path: str = Field(min_length=1)
    # One of the two: the busbw (bytes/s), or the seconds per op (a latency-bound size is
    # often exported and read as a time), which the busbw is computed from as nccl-tests does.
    busbw: Finite = Field(ge=0)
    time_s: Finite | None = Field(None, gt=0)
    cpu: Finite | None = Field(None, ge=0, le=1)
    cv: Finite = Field(0.0, ge=0)
    restart: bool = False

    @model_validator(mode="before")
    @classmethod
    def _busbw_from_time(cls, data: object) -> object:
        if not isinstance(data, dict) or data.get("time_s") is None:
            return data
        if data.get("busbw") is not None:
            raise ValueError("give busbw or time_s, not both")
        return {**data, "busbw": _busbw_of(data)}

    @property
    def key(self) -> baseline.BaselineKey:
        return (self.probe, self.op, self.size, self.path, self.ranks)

    @property
    def series(self) -> str:
        return "/".join(map(str, self.key))


def _busbw_of(data: dict[str, Any]) -> float:
    """The busbw of a result given as seconds per op: algbw x nccl-tests' bus factor for a
    known op (the plain algbw for another), so that it reads on the same scale as a result
    given as busbw."""
    seconds, size, ranks, op = (data.get(k) for k in ("time_s", "size", "ranks", "op"))
    if type(seconds) not in (int, float) or not 0 < seconds < math.inf:  # type: ignore[operator]
        raise ValueError(f"time_s must be a positive number of seconds per op, not {seconds!r}")
    if type(size) is not int or type(ranks) is not int or size < 0:
        raise ValueError("time_s needs size (bytes, >= 0) and ranks (an integer) beside it")
    if op in bandwidth.OPS and ranks >= 1:  # type: ignore[operator]
        return bandwidth.busbw(op, int(ranks), int(size), float(seconds))  # type: ignore[arg-type]
    return bandwidth.algbw(int(size), float(seconds))  # type: ignore[arg-type]


class Timed(Protocol):
    """What intervals_of() reads of a result."""

    @property
    def probe(self) -> str: ...

    @property
    def t(self) -> float: ...


class Seen(NamedTuple):
    """A result's probe and time, where nothing more of it is read (a stream's first pass)."""

    probe: str
    t: float


def plain(document: dict[str, Any]) -> bool:
    """Whether StreamResult takes `document` as it is: every field of the JSON type a stream's
    writer gives it and within its range, no time_s to turn into a busbw. A stream is read
    twice (once to check it, once to replay it), and checking a result this way costs a
    fraction of building a model; anything else is for parse_result(), its errors included."""
    get = document.get
    t, busbw, size, ranks = get("t"), get("busbw"), get("size"), get("ranks")
    cpu, cv = get("cpu"), get("cv", 0.0)
    return (
        type(t) is float
        and type(busbw) is float
        and type(size) is int
        and type(ranks) is int
        and type(cv) is float
        and (cpu is None or type(cpu) is float)
        and math.isfinite(t)
        and 0 <= busbw < math.inf
        and size >= 0
        and ranks >= 0
        and 0 <= cv < math.inf
        and (cpu is None or 0 <= cpu <= 1)
        and _text(get("probe"))
        and _text(get("op"))
        and _text(get("path"))
        and type(get("restart", False)) is bool
        and "time_s" not in document
    )


def _text(value: object) -> bool:
    return type(value) is str and value != ""


def parse_result(document: object, where: str) -> StreamResult:
    """One stream line's object; ValueError naming `where` and the field otherwise."""
    if not isinstance(document, dict):
        raise ValueError(f"{where}: a result must be a JSON object, not {type(document).__name__}")
    try:
        return StreamResult.model_validate(document)
    except ValidationError as exc:
        raise ValueError(f"{where}: {describe_validation_error(exc)}") from None


@dataclass(frozen=True)
class Replayed:
    """What the daemon would have said after one result."""

    result: StreamResult
    verdict: baseline.Verdict

    @property
    def state(self) -> str:
        """degraded, inconclusive, learning, young (a baseline, but fewer than a window of
        results, checked for a cut among them), healthy; unjudged for a size only shown."""
        verdict = self.verdict
        if verdict.degraded:
            return "degraded"
        if verdict.inconclusive:
            return "inconclusive"
        if verdict.expected is None or (verdict.low_bound is None and verdict.judged):
            return "learning"
        if verdict.young and verdict.judged:
            return "young"
        return "healthy" if verdict.judged else "unjudged"

    def record(self) -> dict[str, Any]:
        """The JSON line `netmon replay --json` prints for it."""
        verdict = self.verdict
        reason = verdict.reason if verdict.degraded else verdict.inconclusive
        return {
            "t": self.result.t,
            "series": self.result.series,
            "verdict": self.state,
            "reason": reason,
            "expected": verdict.expected,
            "reference": verdict.reference,
            "low_line": verdict.low_bound,
            "busbw": self.result.busbw,
            "time_s": self.result.time_s,
            "ratio": verdict.ratio,
            "level": verdict.level,
            "long_level": verdict.long_level,
            "reference_line": verdict.reference_line,
            "reference_mature": verdict.reference_mature,
            "flaps": verdict.flaps,
        }


def intervals_of(results: Iterable[Timed]) -> dict[str, float]:
    """Each probe's interval as the stream shows it: the median gap between its runs (the
    results of one run share a time)."""
    runs: dict[str, list[float]] = {}
    for result in results:
        times = runs.setdefault(result.probe, [])
        if not times or result.t != times[-1]:
            times.append(result.t)
    return {
        probe: statistics.median(b - a for a, b in itertools.pairwise(times))
        for probe, times in runs.items()
        if len(times) > 1
    }


class Replayer:
    """The daemon's baseline book and its state file, fed one result at a time.

    `schedules` gives each probe's (interval, jitter) in seconds: a run more than 2 intervals
    plus the jitter after the probe's previous one came after a pause, and its series settle
    again, as in the daemon (netmon.serve.pausing.after_pause)."""

    def __init__(
        self,
        policy: baseline.BaselinePolicy,
        schedules: Mapping[str, tuple[float, float]],
        state_dir: Path,
    ) -> None:
        self.policy = policy
        self.schedules = dict(schedules)
        self.state_path = state_dir / "baselines.json"
        self.book = baseline.BaselineBook(policy)
        self._runs: dict[str, tuple[float | None, float]] = {}  # probe: (previous, current)

    def feed(self, result: StreamResult) -> Replayed:
        if result.restart:
            self.restart()
        paused = self._paused(result)
        verdict = self.book.observe(
            result.key, result.busbw, result.cv, result.cpu, at=result.t, resettle=paused
        )
        return Replayed(result, verdict)

    def restart(self) -> None:
        """What a daemon's restart does to the book: saved, then loaded from the file (every
        series settles again; what was not saved is gone)."""
        baseline.save(self.state_path, self.book)
        self.book, warning = baseline.load(self.state_path, self.policy)
        if warning:
            raise ValueError(f"the state file did not load again: {warning}")
        self._runs.clear()  # the daemon's tallies do not survive it either

    def _paused(self, result: StreamResult) -> bool:
        """Whether this result's run came after a pause: the results of one run share a time,
        and every series of the run settles again with it."""
        previous, current = self._runs.get(result.probe, (None, None))
        if result.t != current:
            previous, current = current, result.t
            self._runs[result.probe] = (previous, current)
        return self._came_after_pause(result.probe, previous, result.t)

    def _came_after_pause(self, probe: str, previous: float | None, current: float) -> bool:
        schedule = self.schedules.get(probe)
        if schedule is None or previous is None:
            return False
        interval, jitter = schedule
        return after_pause(previous, current, interval, jitter)


def replay(
    results: Iterable[StreamResult],
    policy: baseline.BaselinePolicy,
    schedules: Mapping[str, tuple[float, float]] | None = None,
    intervals: Mapping[str, float] | None = None,
) -> Iterator[Replayed]:
    """Every result of `results` through a fresh Replayer, in input order. Probes without a
    schedule get the interval the stream shows (`intervals`, its intervals_of(), when the
    caller has read them already: `results` is then iterated once, and may be read as it is
    replayed) and a jitter of a tenth of it (the daemon's default)."""
    if intervals is None:
        results = list(results)  # iterated twice: the intervals, then the replay
        intervals = intervals_of(results)
    known = dict(schedules or {})
    for probe, interval in intervals.items():
        known.setdefault(probe, (interval, round(interval * 0.1, 3)))
    with tempfile.TemporaryDirectory(prefix="netmon-replay-") as state_dir:
        replayer = Replayer(policy, known, Path(state_dir))
        for result in results:
            yield replayer.feed(result)
