"""The sweep families: this node's share of the last cluster sweep delivered to it (netmon
sweep, POST /sweep). Only the last report is exported, so the series are bounded by one
sweep's rails x peers, and a pair the next sweep does not measure leaves /metrics with it."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import Metric

from netmon.exposition.catalogue import SWEEP_REPORT_OUTCOMES
from netmon.exposition.families import add_known, family
from netmon.exposition.snapshot import Snapshot
from netmon.sweep.delivery.node_report import NodeReport, PeerResult


def sweep_families(snapshot: Snapshot) -> Iterator[Metric]:
    """Nothing without a sweep secret; the counts from the start; results once one arrived."""
    view = snapshot.sweep
    if view is None:
        return
    reports = family("netmon_sweep_reports", snapshot)
    for outcome in sorted(set(SWEEP_REPORT_OUTCOMES) | set(view.reports)):
        reports.add_metric([outcome], float(view.reports.get(outcome, 0)))
    in_a_row = family("netmon_sweep_suspect_sweeps", snapshot)
    in_a_row.add_metric([], float(view.suspect_sweeps))
    onsets = family("netmon_sweep_suspect_onsets", snapshot)
    onsets.add_metric([], float(view.suspect_onsets))
    yield from (reports, in_a_row, onsets)
    if view.report is not None:
        yield from _result_families(view.report, snapshot)
        yield from _verdict_families(view.report, snapshot)


def latest(results: tuple[PeerResult, ...], judged: bool) -> dict[tuple[str, int], PeerResult]:
    """Each (peer, rail)'s last result (by round, then time), only judged ones if `judged`: a
    pair measured in one round and skipped in a later one keeps its measurement."""
    found: dict[tuple[str, int], PeerResult] = {}
    for result in sorted(results, key=lambda r: (r.round, r.measured_at)):
        if not judged or result.outcome in ("pass", "fail"):
            found[(result.peer, result.rail)] = result
    return found


def _result_families(report: NodeReport, snapshot: Snapshot) -> Iterator[Metric]:
    busbw = family("netmon_sweep_busbw_bytes_per_second", snapshot)
    ratio = family("netmon_sweep_busbw_ratio", snapshot)
    measured = family("netmon_sweep_measurement_timestamp_seconds", snapshot)
    for (peer, rail), result in sorted(latest(report.results, judged=True).items()):
        labels = [peer, str(rail)]
        add_known(labels, ((busbw, result.busbw), (ratio, result.ratio)))
        measured.add_metric(labels, result.measured_at)
    outcome = family("netmon_sweep_pair_result", snapshot)
    for (peer, rail), result in sorted(latest(report.results, judged=False).items()):
        outcome.add_metric([peer, str(rail), result.outcome], 1.0)
    yield from (busbw, ratio, measured, outcome)


def _verdict_families(report: NodeReport, snapshot: Snapshot) -> Iterator[Metric]:
    suspect = family("netmon_sweep_suspect", snapshot)
    if report.suspect:
        # Named as one end of a path: one series per other end; named alone: peer "".
        for peer in dict.fromkeys(report.suspect_peers or ("",)):
            suspect.add_metric([peer], 1.0)
    else:
        suspect.add_metric([""], 0.0)
    finished = family("netmon_sweep_last_timestamp_seconds", snapshot)
    finished.add_metric([], report.finished_at)
    yield from (suspect, finished)
