"""What a reload keeps of the scheduler's timetable: a job whose schedule the new configuration
leaves as it was keeps its next run. Re-adding it from now would run every probe a second after
each SIGHUP (a 15-minute large probe, 2 s later) and, with a reload a minute, never let an hourly
one wait its hour. Pure logic: netmon.serve.timetable reads the scheduler and adds the jobs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

from netmon.config import NetmonConfig

When = TypeVar("When")


def of(config: NetmonConfig, telemetry_job: str, inspector_job: str) -> dict[str, object]:
    """Each job's id and what its timetable follows from: a local probe's interval and jitter,
    the link telemetry's and the Inspector reader's intervals."""
    found: dict[str, object] = {
        probe.name: ("probe", probe.interval, probe.effective_jitter)
        for probe in config.probes or ()
        if probe.scope == "local"
    }
    found[telemetry_job] = ("telemetry", config.link_telemetry.interval)
    if config.inspector is not None:
        found[inspector_job] = ("inspector", config.inspector.interval)
    return found


def kept(
    before: Mapping[str, object], after: Mapping[str, object], due: Mapping[str, When | None]
) -> dict[str, When]:
    """The next runs (`due`, by job id) that the jobs of `after` keep: those of jobs whose
    schedule is the same in `before`. A job added, or given another interval or jitter,
    starts afresh, as at start."""
    return {
        job: when
        for job, when in due.items()
        if when is not None and job in after and before.get(job) == after[job]
    }
