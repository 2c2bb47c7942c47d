"""How one pair's `srun` came out, from its output, its exit and the job's final state. Pure.

The job's state is the controller's word (squeue): PREEMPTED is a pair a user job took, never a
verdict. When the controller cannot be asked, srun's own messages say what they can.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from netmon.sweep.rank import EXIT_BUSY, PREFIX
from netmon.sweep.scheduler import RunOutcome

_PREEMPTED_STATES = frozenset({"PREEMPTED"})
_TIMEOUT_STATES = frozenset({"TIMEOUT", "DEADLINE"})
# srun's messages when the job could not start on its nodes now (--immediate).
_BUSY_MESSAGES = ("Immediate execution impossible", "Requested nodes are busy", "Nodes required")


@dataclass(frozen=True)
class Found:
    busbw: tuple[float, ...]  # per rail, in rail order; empty unless every rail reported
    started_at: float | None  # the earliest rank start among the reports


def parse(stdout: str, rails: int) -> Found:
    by_rail: dict[int, float] = {}
    starts: list[float] = []
    for line in stdout.splitlines():
        if not line.startswith(PREFIX):
            continue
        try:
            report = json.loads(line[len(PREFIX) :])
            rail, busbw = int(report["rail"]), float(report["busbw"])
            starts.append(float(report["started_at"]))
        except (ValueError, KeyError, TypeError):
            continue
        if 0 <= rail < rails and busbw >= 0:
            by_rail[rail] = busbw
    complete = len(by_rail) == rails
    values = tuple(by_rail[k] for k in range(rails)) if complete else ()
    return Found(values, min(starts) if starts else None)


def _last_error(stderr: str) -> str:
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    errors = [line for line in lines if "error" in line.lower()] or lines
    return errors[-1][:200] if errors else "no message"


def classify(
    returncode: int | None, state: str | None, stderr: str, found: Found, timed_out: bool
) -> tuple[RunOutcome, str]:
    """(outcome, one-line detail)."""
    if state in _PREEMPTED_STATES or (state is None and "DUE TO PREEMPTION" in stderr):
        return "preempted", "a job of a higher priority took a node"
    if found.busbw and (returncode == 0 or timed_out):
        # Every rail reported: a measurement, even where srun then hung on its way out (a
        # controller that is gone cannot hear that the job ended).
        return "ok", ""
    if timed_out or state in _TIMEOUT_STATES:
        return "timeout", f"the pair did not finish in time (job state {state or 'unknown'})"
    if any(message in stderr for message in _BUSY_MESSAGES):
        return "busy", _last_error(stderr)
    if returncode == EXIT_BUSY or f"exit code {EXIT_BUSY}" in stderr:
        return "busy", "a GPU of the pair was in use"
    if returncode == 0:
        return "error", "the ranks reported no result"
    where = f"job state {state}" if state else "the controller did not say how the job ended"
    return "error", f"srun exit {returncode} ({where}): {_last_error(stderr)}"
