"""The daemon's schedule, steady across steps of the wall clock.

APScheduler 3.x keeps each job's next run as a wall-clock time, while it sleeps on the monotonic
clock: after a step back of an hour (a VM resumed, a bad NTP source, `date -s`) every job would
wait that hour, and after a step forward every job would be due at once. SteadyScheduler looks
at the clock each time it wakes and moves every next run by the step, so that each job's
remaining wait is the one it had on the monotonic clock.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import Any

from apscheduler.jobstores.base import JobLookupError
from apscheduler.schedulers.background import BackgroundScheduler

log = logging.getLogger(__name__)

# The wall clock moving against the monotonic one by this much between two looks is a step.
# NTP slews at most 0.5 ms/s, so between looks seconds to minutes apart a slew stays far below;
# a step that small would move a run by less than its jitter anyway.
STEP_S = 1.0


def clock_step(before: float, now: float, threshold: float = STEP_S) -> float | None:
    """The step between two offsets of the wall clock from the monotonic clock (wall minus
    monotonic), in seconds; None when it moved by less than `threshold`."""
    step = now - before
    return step if abs(step) >= threshold else None


def shifted(next_runs: Mapping[str, datetime | None], step: float) -> dict[str, datetime]:
    """Every scheduled next run moved by `step` seconds; paused jobs (None) stay as they are."""
    by = timedelta(seconds=step)
    return {job: when + by for job, when in next_runs.items() if when is not None}


class ClockWatch:
    """The wall clock's offset from the monotonic clock, and its step since the last look."""

    def __init__(
        self,
        wall: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        threshold: float = STEP_S,
    ) -> None:
        self._wall = wall
        self._monotonic = monotonic
        self._threshold = threshold
        self._offset = self._now()

    def _now(self) -> float:
        return self._wall() - self._monotonic()

    def step(self) -> float | None:
        """The step since the last look, if any; each look starts afresh, so a slow slew never
        adds up to a step."""
        offset = self._now()
        step = clock_step(self._offset, offset, self._threshold)
        self._offset = offset
        return step


class SteadyScheduler(BackgroundScheduler):  # type: ignore[misc]  # APScheduler is untyped
    """A BackgroundScheduler that follows steps of the wall clock (module docstring)."""

    def __init__(
        self,
        *args: Any,
        watch: ClockWatch | None = None,
        on_step: Callable[[float], None] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.watch = watch or ClockWatch()
        self.on_step = on_step  # told of every step followed, after the jobs moved
        self.steps = 0

    def _process_jobs(self) -> float | None:
        # APScheduler 3.x's loop (pyproject pins <4) calls this at every wake, before it looks
        # for due jobs: the one place where a step is seen before any job is run or dropped as
        # missed on account of it. The loop sleeps on the monotonic clock, so it wakes when the
        # first job is due by that clock, however the wall clock moved meanwhile.
        step = self.watch.step()
        if step is not None:
            self.follow(step)
        wait: float | None = super()._process_jobs()
        return wait

    def follow(self, step: float) -> None:
        """Move every job's next run by the wall clock's `step`."""
        jobs = self.get_jobs()
        for job_id, when in shifted({job.id: job.next_run_time for job in jobs}, step).items():
            try:
                self.modify_job(job_id, next_run_time=when)
            except JobLookupError:  # removed meanwhile (a reload): nothing to move
                continue
        self.steps += 1
        if self.on_step is not None:
            self.on_step(step)
        log.warning(
            "the wall clock stepped by %+.1f s: %d scheduled job(s) keep their wait",
            step,
            len(jobs),
        )
