"""The jobs families: what the daemon read of the jobs' own collectives (NCCL Inspector files
under `inspector.dir`). The shapes themselves are exported as series with probe="jobs" (the
series collector); these are the reading's counts, its coverage and the yardstick ratios."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import Metric

from netmon.exposition.catalogue import INSPECTOR_DIRECTORY_STATES, INSPECTOR_REJECT_REASONS
from netmon.exposition.families import add_known, family
from netmon.exposition.snapshot import Snapshot

JOBS_PATHS = ("node", "nodes")


def jobs_families(snapshot: Snapshot) -> Iterator[Metric]:
    """Nothing without `inspector:`; the counts from the start."""
    view = snapshot.jobs
    if view is None:
        return
    collectives = family("netmon_jobs_collectives", snapshot)
    for path in JOBS_PATHS:
        collectives.add_metric([path], float(view.collectives.get(path, 0)))
    rejected = family("netmon_jobs_rejected", snapshot)
    for reason in sorted(set(INSPECTOR_REJECT_REASONS) | set(view.rejected)):
        rejected.add_metric([reason], float(view.rejected.get(reason, 0)))
    overflow = family("netmon_jobs_shape_overflow", snapshot)
    overflow.add_metric([], float(view.overflow))
    shapes = family("netmon_jobs_shapes", snapshot)
    shapes.add_metric([], float(view.shapes))
    removed = family("netmon_jobs_directories_removed", snapshot)
    removed.add_metric([], float(view.removed))
    directories = family("netmon_jobs_directories", snapshot)
    for state in INSPECTOR_DIRECTORY_STATES:
        directories.add_metric([state], float(view.directories.get(state, 0)))
    unconfirmed = family("netmon_jobs_unconfirmed", snapshot)
    unconfirmed.add_metric([], float(view.unconfirmed))
    covered = family("netmon_jobs_time_covered_ratio", snapshot)
    read_at = family("netmon_jobs_last_read_timestamp_seconds", snapshot)
    add_known([], ((covered, view.covered), (read_at, view.read_at)))
    ratios = family("netmon_jobs_probe_ratio", snapshot)
    for (op, size, ranks), ratio in sorted(view.probe_ratios.items()):
        ratios.add_metric([op, str(size), str(ranks)], ratio)
    yield from (
        collectives,
        rejected,
        overflow,
        shapes,
        removed,
        directories,
        unconfirmed,
        covered,
        read_at,
    )
    yield ratios
