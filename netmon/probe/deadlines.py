"""A probe's deadlines: whether one has passed (a phase's, the probe's own --timeout, or a rank
silent too long), the rank that holds the others up, and the message that says where it stood."""

from __future__ import annotations

from collections.abc import Sequence

from netmon import bandwidth
from netmon.probe.processes import RankProcess, process_state
from netmon.probe.spec import PHASES, ProbeFailure, ProbeSpec

# A rank not heard from for this long counts as stuck when the culprit is chosen, and its silence
# is named in the message.
SILENT_S = 2.0


def deadline_passed(
    spec: ProbeSpec, ranks: Sequence[RankProcess], start: float, now: float
) -> ProbeFailure | None:
    """The timeout of a probe started at `start` (monotonic) that some rank is late for, blamed
    on the rank that holds the others up; None while every rank is in time."""
    deadlines = spec.deadlines
    overall_left = start + spec.timeout - now
    late = []
    for entry in ranks:
        phase_left = entry.phase_since + deadlines.for_phase(entry.phase) - now
        silent = entry.hello and now - entry.last_heard > deadlines.unresponsive
        if min(phase_left, overall_left) <= 0 or silent:
            late.append(entry)
    if not late:
        return None
    held_up_by = culprit(ranks, now)
    return ProbeFailure(
        phase=held_up_by.phase,
        rank=held_up_by.rank,
        cause="timeout",
        detail=timeout_detail(spec, held_up_by, start, now),
    )


def culprit(ranks: Sequence[RankProcess], now: float) -> RankProcess:
    """The rank that holds the others up: stopped or silent first, then the least advanced.

    It need not be a late rank itself: a stopped rank keeps its peers waiting in a collective.
    """

    def progress(entry: RankProcess) -> tuple[int, int, int]:
        state = process_state(entry.proc.pid)
        frozen = state in ("T", "t") or now - entry.last_heard > SILENT_S
        return (0 if frozen else 1, PHASES.index(entry.phase), entry.sizes_done)

    return min(ranks, key=lambda entry: (progress(entry), entry.rank))


def timeout_detail(spec: ProbeSpec, entry: RankProcess, start: float, now: float) -> str:
    """Where the rank stood when the deadline passed, and what its process was doing."""
    waited = now - entry.phase_since
    where = f" at {bandwidth.format_size(entry.size)}" if entry.size else ""
    state = process_state(entry.proc.pid)
    notes = {
        "T": "; the process is stopped (SIGSTOP?)",
        "t": "; the process is traced",
        "D": "; the process is in uninterruptible sleep (driver?)",
    }
    silent = now - entry.last_heard
    told = notes.get(state or "", "")
    told += f"; silent for {silent:.1f} s" if silent > SILENT_S else ""
    if now - start >= spec.timeout:  # the probe's own timeout, not the phase's
        return f"--timeout {spec.timeout:g} s ran out in phase {entry.phase}{where}{told}"
    return f"no progress in phase {entry.phase}{where} after {waited:.1f} s{told}"
