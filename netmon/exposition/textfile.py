"""`netmon probe --textfile`: one-shot results in Prometheus text format for node_exporter.

Sites that run checks from cron or a Slurm health check rather than the daemon get the same
metric names as `/metrics`, written atomically (node_exporter must never read half a file).
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from prometheus_client import generate_latest

import netmon
from netmon.exposition.collector import make_registry
from netmon.exposition.snapshot import ProbeStats, SeriesPoint, Snapshot, series_points
from netmon.probe.rankcpu import summed
from netmon.probe.spec import ProbeOutcome


def snapshot_of(
    outcomes: Sequence[ProbeOutcome], probe: str, min_busbw: float | None = None
) -> Snapshot:
    """The outcomes of one `netmon probe` call as the daemon would export them, each result under
    the path its outcome ran on."""
    now = time.time()
    series: list[SeriesPoint] = []
    failures: dict[str, int] = {}
    for outcome in outcomes:
        if outcome.failure is not None:
            failures[outcome.failure.reason] = failures.get(outcome.failure.reason, 0) + 1
        series.extend(series_points(outcome, probe, now, min_busbw=min_busbw))
    stats = ProbeStats(
        runs=len(outcomes),
        failures=failures,
        skips={},
        last_success=now if outcomes and not failures else None,
        last_run=now,
        duration_s=sum(o.wall_s for o in outcomes),
        busy_seconds=sum(o.wall_s * max(len(o.spec.devices), o.spec.ranks) for o in outcomes),
        interval_s=0.0,
        rank_cpu_seconds=summed(o.rank_cpu_s for o in outcomes),
    )
    build = {
        "version": netmon.__version__,
        "nccl": next(
            (o.environment.nccl for o in outcomes if o.environment and o.environment.nccl), ""
        )
        or "",
        "torch": next(
            (o.environment.torch for o in outcomes if o.environment and o.environment.torch), ""
        )
        or "",
    }
    return Snapshot(series=tuple(series), probes={probe: stats}, build=build, started_at=now)


def write(
    path: Path, outcomes: Sequence[ProbeOutcome], probe: str, min_busbw: float | None = None
) -> None:
    """Render and replace `path` atomically: a temporary file in the same directory, renamed."""
    text = generate_latest(make_registry(lambda: snapshot_of(outcomes, probe, min_busbw)))
    directory = path.parent if str(path.parent) else Path(".")
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=directory)
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(text)
            file.flush()
            os.fsync(file.fileno())
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
