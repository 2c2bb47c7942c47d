"""How one pair's `srun` came out, from its output, its exit and the job's final state. Pure.

The job's state is the controller's word (squeue): PREEMPTED is a pair a user job took, never a
verdict. When the controller cannot be asked, srun's own messages say what they can.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal

from netmon.sweep.ranks.rank import EXIT_BUSY, JOINED, PREFIX, STARTED
from netmon.sweep.scheduler import RunOutcome

# Why a pair was given up while it ran: never started by the scheduler in time ("queued"), its
# ranks did not all meet in time ("meet"), or the run (or the whole round) ran out ("run").
Late = Literal["queued", "meet", "run"]

_PREEMPTED_STATES = frozenset({"PREEMPTED"})
_TIMEOUT_STATES = frozenset({"TIMEOUT", "DEADLINE"})
# srun's messages when the job could not start on its nodes now (--immediate).
_BUSY_MESSAGES = ("Immediate execution impossible", "Requested nodes are busy", "Nodes required")


@dataclass(frozen=True)
class Found:
    busbw: tuple[float, ...]  # per rail, in rail order; empty unless every rail reported
    started_at: float | None  # the earliest rank start among the reports
    # Per rail with one: why its NCCL log says it measured another network (GPU pairs).
    transport: tuple[str, ...] = ()


def parse(stdout: str, rails: int) -> Found:
    by_rail: dict[int, float] = {}
    starts: list[float] = []
    wrong: list[str] = []
    for line in stdout.splitlines():
        if not line.startswith(PREFIX):
            continue
        try:
            report = json.loads(line[len(PREFIX) :])
            rail, busbw = int(report["rail"]), float(report["busbw"])
            starts.append(float(report["started_at"]))
            faults = [str(f) for f in report.get("transport_faults") or ()]
        except (ValueError, KeyError, TypeError, AttributeError):
            continue
        if 0 <= rail < rails and busbw >= 0:
            by_rail[rail] = busbw
            if faults:
                hca = report.get("hca") or "its HCA"
                wrong.append(f"rail {rail} ({hca}): {', '.join(faults)}")
    complete = len(by_rail) == rails
    values = tuple(by_rail[k] for k in range(rails)) if complete else ()
    return Found(values, min(starts) if starts else None, tuple(wrong))


@dataclass(frozen=True)
class Deadlines:
    """A pair's three clocks: from submission to every rank met (`launch`, absolute: a busy
    queue starts a pair only at a backfill pass), from the meeting to the end (`run_s`), and
    the round's own end (`hard`)."""

    launch: float
    run_s: float
    hard: float

    def late(self, now: float, started: bool, joined_at: float | None) -> Late | None:
        if now >= self.hard:
            return "run" if joined_at is not None else ("meet" if started else "queued")
        if joined_at is None and now >= self.launch:
            return "meet" if started else "queued"
        if joined_at is not None and now >= joined_at + self.run_s:
            return "run"
        return None


def marks(stdout: str) -> tuple[int, int]:
    """(tasks that started, tasks whose rail's ranks met), from the ranks' marker lines."""
    started = sum(1 for line in stdout.splitlines() if line.startswith(STARTED))
    joined = sum(1 for line in stdout.splitlines() if line.startswith(JOINED))
    return started, joined


def given_up(late: Late, waited: float) -> tuple[RunOutcome, str]:
    """How a pair given up on comes out, unless it measured or was preempted."""
    if late == "queued":
        return "busy", f"the scheduler did not start it in {waited:.0f} s (sweep.launch_timeout)"
    if late == "meet":
        return "timeout", f"its ranks did not all meet in {waited:.0f} s (sweep.launch_timeout)"
    return "timeout", f"the pair did not finish in time ({waited:.0f} s since it was submitted)"


def _last_error(stderr: str) -> str:
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    errors = [line for line in lines if "error" in line.lower()] or lines
    return errors[-1][:200] if errors else "no message"


def classify(
    returncode: int | None,
    state: str | None,
    stderr: str,
    found: Found,
    late: Late | None = None,
    waited: float = 0.0,
) -> tuple[RunOutcome, str]:
    """(outcome, one-line detail). `late`: why the sweep gave the pair up, if it did, after
    `waited` seconds from its submission."""
    if state in _PREEMPTED_STATES or (state is None and "DUE TO PREEMPTION" in stderr):
        return "preempted", "a job of a higher priority took a node"
    if found.busbw and found.transport:
        # Measured, but over another network than the pair's own (a fallback to TCP sockets,
        # another HCA): never judged, or a healthy node reads as slow.
        return "transport_mismatch", "; ".join(found.transport)[:200]
    if found.busbw and (returncode == 0 or late is not None):
        # Every rail reported: a measurement, even where srun then hung on its way out (a
        # controller that is gone cannot hear that the job ended).
        return "ok", ""
    if late is not None:
        return given_up(late, waited)
    if state in _TIMEOUT_STATES:
        return "timeout", f"the pair did not finish in time (job state {state})"
    if any(message in stderr for message in _BUSY_MESSAGES):
        return "busy", _last_error(stderr)
    if returncode == EXIT_BUSY or f"exit code {EXIT_BUSY}" in stderr:
        return "busy", "a GPU of the pair was in use"
    if returncode == 0:
        return "error", "the ranks reported no result"
    where = f"job state {state}" if state else "the controller did not say how the job ended"
    return "error", f"srun exit {returncode} ({where}): {_last_error(stderr)}"
