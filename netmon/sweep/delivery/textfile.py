"""The whole sweep's verdicts on the sweep host, in node_exporter's textfile format
(`netmon sweep --textfile PATH`): a node whose daemon is down, often the broken one, receives
no report and exports nothing, but it is still named here, as are the path, uplink and switch
suspects no node's daemon exports, and what the sweep left undecided.

Series (docs/METRICS.md, "The sweep host's textfile"): one per suspect and rail, one per
undecided subject, the pairs by outcome, the rounds, the exit code and when the sweep ended.
Bounded by what one sweep can name, and replaced whole by the next sweep (written to a
temporary file and renamed, as node_exporter's collector expects). The daemon's own families
are netmon.exposition.catalogue's; these are the sweep host's, never a daemon's.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

from prometheus_client import CollectorRegistry, Gauge, write_to_textfile


class TextfileFamily(NamedTuple):
    name: str
    help: str
    labels: tuple[str, ...] = ()


SUSPECT = TextfileFamily(
    "netmon_sweep_report_suspect",
    "A suspect the last sweep named: 1 per subject and rail (kind node, path, uplink or "
    "switch; peer: a path's other node, a switch's level).",
    ("kind", "subject", "peer", "rail"),
)
UNDECIDED = TextfileFamily(
    "netmon_sweep_report_undecided",
    "A node or an uplink of a failure the last sweep could neither name nor clear.",
    ("kind", "subject"),
)
PAIRS = TextfileFamily(
    "netmon_sweep_report_pairs", "The last sweep's pairs by outcome.", ("outcome",)
)
ROUNDS = TextfileFamily("netmon_sweep_report_rounds", "The last sweep's rounds.")
EXIT_CODE = TextfileFamily(
    "netmon_sweep_report_exit_code",
    "How the last sweep ended: 0 no suspect, 1 suspects, 3 could not run, 4 undecided.",
)
TIMESTAMP = TextfileFamily(
    "netmon_sweep_report_timestamp_seconds", "When the last sweep ended (Unix time)."
)
FAMILIES = (SUSPECT, UNDECIDED, PAIRS, ROUNDS, EXIT_CODE, TIMESTAMP)


def _subject(suspect: Mapping[str, Any]) -> tuple[str, str]:
    """(subject, peer) of a suspect entry (netmon.sweep.report.suspect_entry)."""
    kind = suspect["kind"]
    if kind == "uplink":
        return suspect["uplink"], ""
    if kind == "switch":
        return suspect["switch"], suspect.get("level") or ""
    return suspect["node"], suspect.get("peer", "")


def registry_of(whole: Mapping[str, Any], exit_code: int, finished_at: float) -> CollectorRegistry:
    registry = CollectorRegistry()
    gauges = {f.name: Gauge(f.name, f.help, f.labels, registry=registry) for f in FAMILIES}
    for entry in whole.get("suspects", []):
        subject, peer = _subject(entry)
        for rail in entry.get("rails", []):
            gauges[SUSPECT.name].labels(entry["kind"], subject, peer, str(rail)).set(1)
    for node in whole.get("undecided", []):
        gauges[UNDECIDED.name].labels("node", node).set(1)
    for link in whole.get("undecided_uplinks", []):
        gauges[UNDECIDED.name].labels("uplink", link).set(1)
    for pair in whole.get("pairs", []):
        gauges[PAIRS.name].labels(pair["outcome"]).inc()
    gauges[ROUNDS.name].set(whole.get("rounds", 0))
    gauges[EXIT_CODE.name].set(exit_code)
    gauges[TIMESTAMP.name].set(finished_at)
    return registry


def write(path: Path, whole: Mapping[str, Any], exit_code: int, finished_at: float) -> None:
    """Atomically (prometheus_client writes beside it and renames)."""
    write_to_textfile(str(path), registry_of(whole, exit_code, finished_at))
