"""`netmon replay`: what the daemon would have said on a recorded stream of results.

The stream goes through the daemon's own per-series path (netmon.serve.replay): settling,
inconclusive results, the verdict, the state file across restarts, with the policy of
`--config`. With --json, one JSON line per result in input order; without, a summary per series.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from netmon.cli import EXIT_OK
from netmon.errors import UsageError

if TYPE_CHECKING:
    from netmon.serve.replay import Replayed


# json.dumps(..., allow_nan=False), its encoder made once rather than for every line.
_encode = json.JSONEncoder(allow_nan=False).encode


def add_parser(commands: Any) -> None:
    replay = commands.add_parser(
        "replay",
        help="what the daemon would have said on a recorded stream of results",
        description="Feed a recorded stream of results (JSON lines, or a Prometheus query_range "
        "answer for netmon_busbw_bytes_per_second) through the daemon's own baselines and "
        'verdicts, and print what it would have said (docs/SIGNAL.md, "Replay").',
    )
    replay.add_argument("stream", metavar="STREAM", help="the stream's file, or - for stdin")
    replay.add_argument("--json", action="store_true", help="one JSON line per result")
    replay.add_argument(
        "--config",
        type=Path,
        default=os.environ.get("NETMON_CONFIG") or None,
        help="the daemon's YAML configuration: its baseline policy and its probes' intervals "
        "(default: $NETMON_CONFIG, else the default policy and the intervals the stream shows)",
    )
    replay.set_defaults(handler=_cmd_replay)


def _cmd_replay(args: argparse.Namespace) -> int:
    from netmon import config as cfg
    from netmon.serve import replay

    config = cfg.load_config(args.config)
    schedules = {p.name: (p.interval, p.effective_jitter) for p in config.probes or ()}
    if args.config is None:
        schedules = {}  # the embedded default's probes are not the stream's
    summary = Summary()
    out = sys.stdout
    with read_stream(args.stream) as stream:
        for replayed in replay.replay(stream, config.baseline, schedules, stream.intervals):
            if args.json:
                out.write(_encode(replayed.record()) + "\n")
            else:
                summary.add(replayed)
    if not args.json:
        summary.print(out)
    return EXIT_OK


class Stream:
    """A stream's results in replay order, and each probe's interval as the whole stream shows
    it. JSON lines are read from the file again, one result at a time, on every iteration: a
    month of results is never held in memory. A Prometheus answer is held whole: its results
    must be put in time order first."""

    def __init__(
        self, name: str, file: IO[str], results: list[Any] | None, intervals: dict[str, float]
    ) -> None:
        self.name, self._file, self._results, self.intervals = name, file, results, intervals

    def __iter__(self) -> Iterator[Any]:
        if self._results is not None:
            yield from self._results
            return
        self._file.seek(0)
        try:
            yield from _results(self.name, self._file)
        except (OSError, UnicodeDecodeError) as exc:  # the file changed since it was checked
            raise UsageError(f"STREAM {self.name}: cannot read it ({exc})") from None
        except ValueError as exc:
            raise UsageError(str(exc)) from None

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *_exc: object) -> None:
        self._file.close()


def read_stream(name: str) -> Stream:
    """The stream's results, in input order; UsageError naming the line and field. Every result
    is checked before the first is replayed, so an error comes before any output. A line (or
    the whole file) that is a Prometheus query_range answer gives its results; those are put
    in time order, as chunks of a long range appended one after another would not be."""
    from netmon.serve import replay

    try:
        file = _open(name)
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"STREAM {name}: cannot read it ({exc})") from None
    try:
        try:
            intervals = replay.intervals_of(_checked(name, file))
        except _Whole:
            return _whole(name, file)
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"STREAM {name}: cannot read it ({exc})") from None
    except BaseException:
        file.close()
        raise
    return Stream(name, file, None, intervals)


def _open(name: str) -> IO[str]:
    """The stream's file; stdin is copied to a temporary file first, to be read twice."""
    if name != "-":
        return open(name)
    spool = tempfile.TemporaryFile("w+")  # noqa: SIM115 - the Stream closes it
    try:
        shutil.copyfileobj(sys.stdin, spool)
        spool.seek(0)
    except BaseException:
        spool.close()
        raise
    return spool


class _Whole(Exception):
    """The stream holds a Prometheus answer, or is not JSON lines: it is read whole."""


def _checked(name: str, file: IO[str]) -> Iterator[Any]:
    """Every result of a stream of JSON lines, validated (of a plain one, only its probe and
    time: all the intervals need); _Whole where it turns out to hold a Prometheus answer (on a
    line, or pretty-printed over many: its first line is not JSON). As when the file was read
    whole, a line that is not JSON is named before a wrong result."""
    from netmon.serve import promstream, replay

    wrong: str | None = None
    seen = 0
    try:
        for where, document in _lines(name, _split(file)):
            if promstream.is_query_range(document):
                raise _Whole
            seen += 1
            if isinstance(document, dict) and replay.plain(document):
                yield replay.Seen(document["probe"], document["t"])  # read again to replay
                continue
            try:
                yield replay.parse_result(document, where)
            except ValueError as exc:
                wrong = wrong or str(exc)
    except UsageError:
        if seen == 0:  # the first line is not JSON: the file may be one document
            raise _Whole from None
        raise
    if wrong is not None:
        raise UsageError(wrong)
    if seen == 0:
        raise UsageError(f"STREAM {name}: no results in it")


def _results(name: str, file: IO[str]) -> Iterator[Any]:
    """The results of a stream of JSON lines that _checked() has passed."""
    from netmon.serve import replay

    for where, document in _lines(name, _split(file)):
        yield replay.parse_result(document, where)


def _split(file: IO[str]) -> Iterator[str]:
    """The file's lines as str.splitlines() numbers them (it breaks at a form feed, U+2028
    and a few more besides a newline), so a line is named as when the file was read whole."""
    for physical in file:
        yield from physical.splitlines()


def _whole(name: str, file: IO[str]) -> Stream:
    """The stream read whole, as one document or lines of them (Prometheus answers)."""
    from netmon.serve import replay

    file.seek(0)
    text = file.read()
    file.close()
    documents, from_prometheus = _documents(name, text)
    try:
        results = [replay.parse_result(document, where) for where, document in documents]
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if not results:
        raise UsageError(f"STREAM {name}: no results in it")
    ordered = sorted(results, key=lambda r: r.t) if from_prometheus else results
    return Stream(name, file, ordered, replay.intervals_of(ordered))


def _documents(name: str, text: str) -> tuple[list[tuple[str, object]], bool]:
    """(where, object) of every result in `text`, and whether any came from Prometheus."""
    from netmon.serve import promstream

    try:
        whole = json.loads(text)  # one answer, maybe pretty-printed over many lines
    except json.JSONDecodeError:
        whole = None
    if promstream.is_query_range(whole):
        lines = [(name, whole)]
    else:
        lines = list(_lines(name, text.splitlines()))
    documents: list[tuple[str, object]] = []
    from_prometheus = False
    for where, document in lines:
        if not promstream.is_query_range(document):
            documents.append((where, document))
            continue
        from_prometheus = True
        assert isinstance(document, dict)  # is_query_range: a mapping
        try:
            documents += [
                (f"{where}: series {r['probe']}/{r['size']}", r)
                for r in promstream.results_of(document)
            ]
        except ValueError as exc:
            raise UsageError(f"{where}: {exc}") from None
    return documents, from_prometheus


def _lines(name: str, lines: Iterable[str]) -> Iterator[tuple[str, object]]:
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            yield f"{name}:{number}", json.loads(line)
        except json.JSONDecodeError as exc:
            raise UsageError(f"{name}:{number}: not JSON ({exc.msg})") from None


@dataclass
class _Row:
    results: int = 0
    judged: int = 0
    degraded: int = 0
    episodes: int = 0
    reasons: set[str] = field(default_factory=set)
    last: Replayed | None = None


class Summary:
    """Per series: results, judged, degraded share and episodes, the reference, how it ends."""

    def __init__(self) -> None:
        self.rows: dict[str, _Row] = {}

    def add(self, replayed: Replayed) -> None:
        row = self.rows.setdefault(replayed.result.series, _Row())
        verdict = replayed.verdict
        was = row.last is not None and row.last.verdict.degraded
        row.results += 1
        judged = replayed.state in ("healthy", "young", "degraded")
        row.judged += judged and not verdict.inconclusive
        row.degraded += verdict.degraded
        row.episodes += verdict.degraded and not was
        if verdict.degraded and verdict.reason:
            row.reasons.add(verdict.reason)
        row.last = replayed

    def print(self, out: IO[str]) -> None:
        for series, row in sorted(self.rows.items()):
            assert row.last is not None
            verdict = row.last.verdict
            reference = "none"
            if verdict.reference is not None:
                age = "a day's" if verdict.reference_mature else "young"
                reference = f"{verdict.reference / 1e9:.4g} GB/s ({age})"
            reasons = f" [{', '.join(sorted(row.reasons))}]" if row.reasons else ""
            out.write(
                f"{series}: {row.results} results, {row.judged} judged; degraded "
                f"{100 * row.degraded / row.results:.2f} % of them in {row.episodes} "
                f"episode(s){reasons}; reference {reference}; ends {row.last.state}\n"
            )
