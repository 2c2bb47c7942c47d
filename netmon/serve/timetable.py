"""The daemon's timetable: the scheduler and its jobs, one a local probe, the link telemetry
reader and the jobs' NCCL Inspector reader; and what a reload keeps of it (netmon.serve.schedules:
the next run of every job whose schedule is unchanged).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from apscheduler.events import EVENT_JOB_MAX_INSTANCES, JobSubmissionEvent
from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.triggers.interval import IntervalTrigger

from netmon.config import NetmonConfig
from netmon.serve import schedules
from netmon.serve.jobs_traffic import JOB_ID as INSPECTOR_JOB
from netmon.serve.steady import SteadyScheduler

FIRST_RUN_DELAY_S = 1.0
TELEMETRY_JOB = "link-telemetry"  # the scheduler's id of the link telemetry job (no probe name)
READERS = (TELEMETRY_JOB, INSPECTOR_JOB)  # the readers' jobs, beside the probes'


class Timetable:
    """The scheduler (`scheduler`, started and stopped by the daemon) with the jobs of the
    running configuration. `read_telemetry` and `read_inspector` are None where the daemon has
    no such reader; `on_overrun` hears of a probe run dropped as its previous one still ran."""

    def __init__(
        self,
        config: NetmonConfig,
        run_probe: Callable[[str], Any],
        read_telemetry: Callable[[], Any] | None,
        read_inspector: Callable[[], Any] | None,
        on_step: Callable[..., Any],
        on_overrun: Callable[[str], Any],
    ) -> None:
        self._run_probe, self._read_telemetry = run_probe, read_telemetry
        self._read_inspector, self._on_overrun = read_inspector, on_overrun
        # Steady: a step of the wall clock neither stops the jobs nor fires them all at once.
        self.scheduler = SteadyScheduler(
            # Room for probes a reload adds; the device locks keep them from overlapping.
            executors={"default": ThreadPoolExecutor(max(4, len(config.probes or ())))},
            job_defaults={"coalesce": True, "max_instances": 1},
            timezone="UTC",
            on_step=on_step,
        )
        # A run that comes due while the previous one still runs is dropped by APScheduler
        # (max_instances=1); counted, as every skip is.
        self.scheduler.add_listener(self._overrun, EVENT_JOB_MAX_INSTANCES)
        self._add(config, {})

    def replace(self, before: NetmonConfig, after: NetmonConfig) -> None:
        """The jobs of `after` in place of those of `before`; unchanged schedules keep their
        next runs."""
        due = {job.id: job.next_run_time for job in self.scheduler.get_jobs()}
        kept = schedules.kept(schedules.of(before, *READERS), schedules.of(after, *READERS), due)
        self.scheduler.remove_all_jobs()
        self._add(after, kept)

    def _add(self, config: NetmonConfig, due: dict[str, Any]) -> None:
        now = time.time()
        # Group probes are scheduled by the group's leader (netmon.serve.coordinator), not here.
        probes = tuple(p for p in config.probes or () if p.scope == "local")
        for number, probe in enumerate(probes):
            self.scheduler.add_job(
                self._run_probe,
                IntervalTrigger(seconds=probe.interval, jitter=probe.effective_jitter or None),
                args=[probe.name],
                id=probe.name,
                name=f"probe {probe.name}",
                # A late run is still worth doing, but only once (coalesce) and not too late.
                misfire_grace_time=max(1, int(probe.interval)),
                # Staggered first runs, so the node's first numbers arrive within seconds.
                next_run_time=due.get(probe.name) or _utc(now + FIRST_RUN_DELAY_S + number * 0.5),
            )
        every = config.link_telemetry.interval
        if self._read_telemetry is not None and every > 0:
            self.scheduler.add_job(
                self._read_telemetry,
                IntervalTrigger(seconds=every),
                id=TELEMETRY_JOB,
                name="link telemetry",
                misfire_grace_time=max(1, int(every)),
                next_run_time=due.get(TELEMETRY_JOB) or _utc(now),  # at once, before any probe
            )
        if self._read_inspector is not None and config.inspector is not None:
            self.scheduler.add_job(
                self._read_inspector,
                IntervalTrigger(seconds=config.inspector.interval),
                id=INSPECTOR_JOB,
                name="jobs' NCCL Inspector files",
                misfire_grace_time=max(1, int(config.inspector.interval)),
                next_run_time=due.get(INSPECTOR_JOB) or _utc(now + FIRST_RUN_DELAY_S),
            )

    def _overrun(self, submission: JobSubmissionEvent) -> None:
        if submission.job_id not in READERS:
            self._on_overrun(str(submission.job_id))


def _utc(timestamp: float) -> datetime:
    """A unix time as the aware datetime APScheduler's next_run_time takes."""
    return datetime.fromtimestamp(timestamp, tz=timezone.utc)
