"""The one interface a sweep needs from a scheduler; Slurm (netmon.sweep.slurm.scheduler) is the
first.

A scheduler lists the nodes a sweep may use, tells whether another sweep is running, and runs
one round of pairs, each as its own small preemptible job, returning how each came out. It
judges nothing: the planner and the judge are pure (netmon.sweep.locate.plan,
netmon.sweep.locate.localise).
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from types import FrameType
from typing import Literal, Protocol

from netmon.sweep.locate.plan import PairPlan, SweepNode

# How a pair's job ended: measured ("ok"), or skipped for a reason that says nothing about
# the link: a job took a node ("preempted"), a node was not free ("busy"), the job or its
# ranks failed ("error"), it ran out of time ("timeout"), or its NCCL log showed another
# network than the pair's own ("transport_mismatch").
RunOutcome = Literal["ok", "preempted", "busy", "error", "timeout", "transport_mismatch"]
SKIP_OUTCOMES: tuple[RunOutcome, ...] = (
    "preempted",
    "busy",
    "error",
    "timeout",
    "transport_mismatch",
)


class SchedulerError(Exception):
    """The scheduler cannot be asked or used (controller down, partition unknown)."""


@dataclass(frozen=True)
class PairRun:
    plan: PairPlan
    outcome: RunOutcome
    busbw: tuple[float, ...] = ()  # per rail, when ok
    detail: str = ""  # why it was skipped, in one line
    job: str | None = None
    submitted_at: float = 0.0
    ranks_started_at: float | None = None  # the first rank's process start
    finished_at: float = 0.0

    @property
    def overhead_s(self) -> float | None:
        """Submission to the first rank's start: what the scheduler costs a pair."""
        if self.ranks_started_at is None:
            return None
        return max(0.0, self.ranks_started_at - self.submitted_at)


class Scheduler(Protocol):
    def nodes(self, partition: str, nodelist: str | None) -> list[SweepNode]:
        """The partition's idle nodes (of `nodelist`, where given)."""

    def taken(self, nodes: Sequence[str]) -> set[str]:
        """Of `nodes`, those no longer free for a pair: a job holds them, or they are drained,
        down or not answering."""

    def other_sweeps(self) -> list[str]:
        """Jobs of a sweep other than this one still pending or running."""

    def run_round(self, pairs: Sequence[PairPlan], deadline: float) -> list[PairRun]:
        """Every pair at once, each its own job; returns when all have ended or by `deadline`
        (time.time()), having cancelled what was left."""

    def cleanup(self) -> None:
        """Cancel every job this sweep submitted that may still be known to the scheduler."""

    def topology(self) -> str | None:
        """The scheduler's own record of the fabric, in topology.conf's syntax (Slurm's
        `scontrol show topology`); None where it keeps none."""


@contextlib.contextmanager
def exiting_on_signals() -> Iterator[None]:
    """While inside: SIGTERM (a CronJob's activeDeadlineSeconds, a deleted pod, an operator's
    kill) and SIGINT raise SystemExit, so that the sweep's finally blocks cancel its pairs
    (Slurm jobs, JobSets) before it goes; Python's default for SIGTERM ends the process at once
    and leaves them to their deadlines, holding the next sweep. The handlers before are put
    back after. From the main thread only."""

    def stop(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    before = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT)}
    for signum in before:
        signal.signal(signum, stop)
    try:
        yield
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)
