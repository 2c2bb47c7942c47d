"""`netmon replay`: what the daemon would have said on a recorded stream of results.

The stream goes through the daemon's own per-series path (netmon.serve.replay): settling,
inconclusive results, the verdict, the state file across restarts, with the policy of
`--config`. With --json, one JSON line per result in input order; without, a summary per series.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from netmon.cli import EXIT_OK
from netmon.errors import UsageError

if TYPE_CHECKING:
    from netmon.serve.replay import Replayed


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
    results = read_stream(args.stream)
    summary = Summary()
    out = sys.stdout
    for replayed in replay.replay(results, config.baseline, schedules):
        if args.json:
            out.write(json.dumps(replayed.record(), allow_nan=False) + "\n")
        else:
            summary.add(replayed)
    if not args.json:
        summary.print(out)
    return EXIT_OK


def read_stream(name: str) -> list[Any]:
    """The stream's results, in input order; UsageError naming the line and field. A line (or
    the whole file) that is a Prometheus query_range answer gives its results; those are put
    in time order, as chunks of a long range appended one after another would not be."""
    from netmon.serve import replay

    try:
        text = sys.stdin.read() if name == "-" else Path(name).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"STREAM {name}: cannot read it ({exc})") from None
    documents, from_prometheus = _documents(name, text)
    try:
        results = [replay.parse_result(document, where) for where, document in documents]
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if not results:
        raise UsageError(f"STREAM {name}: no results in it")
    return sorted(results, key=lambda r: r.t) if from_prometheus else results


def _documents(name: str, text: str) -> tuple[list[tuple[str, object]], bool]:
    """(where, object) of every result in `text`, and whether any came from Prometheus."""
    from netmon.serve import promstream

    try:
        whole = json.loads(text)  # one answer, maybe pretty-printed over many lines
    except json.JSONDecodeError:
        whole = None
    lines = [(name, whole)] if promstream.is_query_range(whole) else list(_lines(name, text))
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


def _lines(name: str, text: str) -> Iterator[tuple[str, object]]:
    for number, line in enumerate(text.splitlines(), 1):
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
        row.judged += replayed.state in ("healthy", "degraded") and not verdict.inconclusive
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
