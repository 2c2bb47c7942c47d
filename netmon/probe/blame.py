"""Which failure a probe is blamed for: every sign of trouble is a candidate with a priority, and
once a short window has passed after the first, the highest priority, then the earliest, wins."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from netmon.probe.processes import RankProcess, describe_status, stderr_tail
from netmon.probe.spec import PHASES, FailureCause, Phase, ProbeFailure

# After a first sign of failure, wait this long for the others: a rank killed by a signal makes its
# peers raise "connection closed" a moment later, and the signal is the real cause.
BLAME_WINDOW_S = 0.3
# From the least to the most telling: wrong values are a symptom, a rank's exception beats them,
# a rank's exit beats its peers' exceptions, a signal beats an exit, and the zygote's death beats
# its ranks' ends (they exit because their parent is gone).
_CHECK, _EXCEPTION, _EXIT, _SIGNAL, _ZYGOTE = range(5)


@dataclass(order=True)
class _Candidate:
    """A possible cause of failure; the highest priority, then the earliest, is blamed."""

    priority: int
    seen: float
    failure: ProbeFailure = field(compare=False)


class Blame:
    def __init__(self) -> None:
        self._candidates: list[_Candidate] = []
        self._first: float | None = None

    def wrong_values(self, now: float, op: str, size_bytes: int) -> None:
        detail = f"wrong values after {op} of {size_bytes} bytes"
        self._add(_CHECK, now, None, "check", "check", detail)

    def exception(self, now: float, entry: RankProcess, event: dict[str, Any]) -> None:
        """A rank's own report of the exception that ends it."""
        detail = f"{event.get('type')}: {event.get('message')}"
        self._add(_EXCEPTION, now, entry.rank, event.get("phase", entry.phase), "exception", detail)

    def exited(self, now: float, entry: RankProcess, status: int) -> None:
        """A rank ended before it was done, or failed: by a signal, or with an exit code and no
        exception reported (its last words on stderr say why)."""
        if status < 0:
            self._add(_SIGNAL, now, entry.rank, entry.phase, "signal", describe_status(status))
        elif entry.error is None:
            detail = f"{describe_status(status)}; {stderr_tail(entry.stderr_path)}"
            self._add(_EXIT, now, entry.rank, entry.phase, "exit", detail)

    def zygote_lost(self, now: float, phase: Phase) -> None:
        """The rank zygote died while ranks it forked still ran (once)."""
        if not any(c.failure.cause == "zygote" for c in self._candidates):
            self._add(_ZYGOTE, now, None, phase, "zygote", "the rank zygote died under the probe")

    def _add(
        self,
        priority: int,
        now: float,
        rank: int | None,
        phase: str,
        cause: FailureCause,
        detail: str,
    ) -> None:
        phase_value: Phase = phase if phase in PHASES else "spawn"  # type: ignore[assignment]
        failure = ProbeFailure(phase=phase_value, rank=rank, cause=cause, detail=detail.strip())
        # Negative time: among equal priorities the earliest wins under max().
        self._candidates.append(_Candidate(priority, -now, failure))

    def __bool__(self) -> bool:
        """Whether any trouble was seen."""
        return bool(self._candidates)

    def settled(self, now: float) -> ProbeFailure | None:
        """The failure blamed once the window after the first trouble has passed; None before."""
        self._first = self._first or now
        if now - self._first >= BLAME_WINDOW_S:
            return max(self._candidates).failure
        return None
