"""The verdict families: how each series' verdict was reached (its noise, its lines, its
reference, why it pages), when it was last judged, and the state that keeps it (docs/SIGNAL.md).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import Metric

from netmon.baseline.state import PROBLEM_REASONS
from netmon.baseline.verdict import DEGRADED_REASONS
from netmon.exposition.families import add_known, family
from netmon.exposition.snapshot import SeriesPoint, Snapshot, VerdictPoint


def verdict_families(snapshot: Snapshot) -> Iterator[Metric]:
    """How each series' verdict was reached: its noise, its lines, its counts, whether it pages."""
    names = (
        "netmon_busbw_baseline_spread_bytes_per_second",
        "netmon_busbw_low_bound_bytes_per_second",
        "netmon_busbw_decline_bound_bytes_per_second",
        "netmon_low_results",
        "netmon_flapping_results",
        "netmon_judged",
        "netmon_foreign_cpu_ratio",
        "netmon_judged_at_floor",
    )
    families = [family(name, snapshot) for name in names]
    spread, bound, decline, lows, flaps, judged, foreign, at_floor = families
    for point in snapshot.series:
        labels = point.labels()
        if point.judged is not None:  # a daemon's series (a textfile's has no book)
            judged.add_metric(labels, 1.0 if point.judged else 0.0)
            lows.add_metric(labels, float(point.low_recent))
            if point.judged:
                at_floor.add_metric(labels, 1.0 if point.at_floor else 0.0)
                flaps.add_metric(labels, float(point.flaps))
        add_known(
            labels,
            (
                (spread, point.spread),
                (bound, point.low_bound),
                (decline, point.reference_line),
                (foreign, point.foreign_cpu),
            ),
        )
    yield from families
    yield from _reference_families(snapshot)


def _reference_families(snapshot: Snapshot) -> Iterator[Metric]:
    """Per judged series, measured since the start or restored: the long-term reference,
    whether it is fixed yet and whether the series has outgrown it, the long level, why and
    since when it pages and how often it turned, and when it was last judged (the daemon's
    start until its first conclusive result: silence ages from the start)."""
    names = (
        "netmon_busbw_reference_bytes_per_second",
        "netmon_reference_mature",
        "netmon_reference_stale",
        "netmon_busbw_level_bytes_per_second",
        "netmon_degraded_reason",
        "netmon_degraded_since_timestamp_seconds",
        "netmon_degraded_episodes",
        "netmon_last_judged_timestamp_seconds",
    )
    families = [family(name, snapshot) for name in names]
    reference, mature, stale, level, reason, since, episodes, judged_at = families
    points: list[SeriesPoint | VerdictPoint] = [*snapshot.series, *snapshot.restored]
    for point in points:
        if not point.judged:
            continue
        labels = point.labels()
        add_known(labels, ((reference, point.reference), (level, point.long_level)))
        if point.degraded:
            # A verdict restored from a state file that did not say since when (an older
            # netmon's) is degraded since the start at least: NetmonBusbwDegraded must see it.
            turned = point.degraded_since
            since.add_metric(labels, turned if turned is not None else snapshot.started_at)
        mature.add_metric(labels, 1.0 if point.reference_mature else 0.0)
        stale.add_metric(labels, 1.0 if point.reference_stale else 0.0)
        for known in DEGRADED_REASONS:
            reason.add_metric([*labels, known], 1.0 if point.reason == known else 0.0)
        # A counter: 0 from the first verdict, so that increase() sees the first episode.
        episodes.add_metric(labels, float(point.episodes))
        at = point.judged_at if isinstance(point, SeriesPoint) else None
        judged_at.add_metric(labels, at if at is not None else snapshot.started_at)
    yield from families


def result_families(snapshot: Snapshot) -> Iterator[Metric]:
    """Per probe: results of judged series, and series forgotten by reason."""
    results = family("netmon_series_results", snapshot)
    for probe, count in sorted(snapshot.series_results.items()):
        results.add_metric([probe], float(count))
    resets = family("netmon_reference_resets", snapshot)
    for (probe, why), count in sorted(snapshot.reference_resets.items()):
        resets.add_metric([probe, why], float(count))
    yield from (results, resets)


def state_families(snapshot: Snapshot) -> Iterator[Metric]:
    """Whether this start restored its baselines, why the state file it found was unusable,
    and saves that failed since."""
    restored = family("netmon_baseline_restored", snapshot)
    restored.add_metric([], 1.0 if snapshot.baseline_restored else 0.0)
    unusable = family("netmon_state_errors", snapshot)
    for reason in sorted({*PROBLEM_REASONS, *snapshot.state_errors}):  # 0 from the start
        unusable.add_metric([reason], float(snapshot.state_errors.get(reason, 0)))
    errors = family("netmon_state_write_errors", snapshot)
    errors.add_metric([], float(snapshot.state_write_errors))
    yield from (restored, unusable, errors)
