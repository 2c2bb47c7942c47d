"""Where one series stands after its latest result, and the line that explains it."""

from __future__ import annotations

from dataclasses import dataclass, field

# Why a series is degraded (netmon_degraded_reason's reasons), the most specific first:
# "flapping", k of the last F results low or noisy among healthy ones; "low", M of the last N
# results under the low line; "drift", the recent level under its line; "decline", the long
# level under the reference's line (docs/SIGNAL.md).
DEGRADED_REASONS = ("flapping", "low", "drift", "decline")


@dataclass(frozen=True)
class Verdict:
    """Where one key stands after its latest result.

    `baseline` is the rolling one the latest result was judged against (learning from a result
    comes after judging it, so a result never vouches for itself); on the result that completes
    learning it is the baseline just formed. `reference` is the long-term level that does not
    drift down; a result is judged against `expected`, the higher of the two. `ratio` is the
    latest busbw over it: None with no baseline, for a result that was not a positive finite
    number, and after a restart until the next result.
    """

    baseline: float | None  # bytes/s, None until min_samples healthy results
    ratio: float | None  # latest busbw / expected
    degraded: bool
    healthy_samples: int  # results in the baseline window, after this one
    low_recent: int  # low results among the last N
    judged: bool = True  # False: a latency-bound size that is learned and shown, never judged
    inconclusive: str | None = None  # why the latest result was neither judged nor learned
    reference: float | None = None  # bytes/s, None until the first full window
    reason: str | None = None  # DEGRADED_REASONS while degraded
    at_floor: bool = False  # the spread would put the low line under floor x expected
    judged_at: float | None = None  # when the latest conclusive result came (time.time())
    # How it was reached, for the log and the runbook (not part of the verdict's identity):
    # the baseline window's robust spread, the busbw under which a result is low (bytes/s;
    # None before a baseline, and for a size not judged), the recent level (median of the last
    # level_window conclusive results) and its line, the last N judged results (oldest first),
    # and whether this result turned the verdict.
    # The level the latest result was judged against: the baseline, or the reference where the
    # baseline has drifted under it (bytes/s; None before a baseline).
    expected: float | None = field(default=None, compare=False)
    spread: float | None = field(default=None, compare=False)
    low_bound: float | None = field(default=None, compare=False)
    level: float | None = field(default=None, compare=False)
    level_bound: float | None = field(default=None, compare=False)
    recent: tuple[float | None, ...] = field(default=(), compare=False)
    changed: bool = field(default=False, compare=False)
    # The long level (median of the last long_window conclusive results; None until there are
    # that many) and the line it is judged by against the reference; whether the reference is
    # learned over a day yet; low or noisy results among the last flap_window; since when the
    # series is degraded (None while it is not) and how often it turned since the start.
    long_level: float | None = field(default=None, compare=False)
    reference_line: float | None = field(default=None, compare=False)
    reference_mature: bool = field(default=False, compare=False)
    flaps: int = field(default=0, compare=False)
    degraded_since: float | None = field(default=None, compare=False)
    episodes: int = field(default=0, compare=False)
    # The series has run steadily above its reference for hours (an upgrade: a new driver or
    # NCCL), further than the reference moves by itself: `netmon rebaseline` would take it up.
    reference_stale: bool = field(default=False, compare=False)
    # The series has a baseline but fewer than a window of results, checked for a cut among
    # them (docs/SIGNAL.md, "A young series").
    young: bool = field(default=False, compare=False)

    def explain(self) -> str:
        """One line for the log and the runbook: the rule, the levels, the spread, the values."""
        expected = self.expected
        if expected is None or self.low_bound is None:
            return "no verdict yet" if self.judged else "not judged (latency-bound size)"
        values = " ".join("-" if v is None else _gbps(v) for v in self.recent)
        floor = " (at the floor)" if self.at_floor else ""
        level = (
            f"; recent level {_gbps(self.level)} GB/s, its line {_gbps(self.level_bound)} GB/s"
            if self.level is not None and self.level_bound is not None
            else ""
        )
        if self.long_level is not None and self.reference_line is not None:
            level += (
                f"; long level {_gbps(self.long_level)} GB/s, the reference's line "
                f"{_gbps(self.reference_line)} GB/s"
            )
        reference = f", reference {_gbps(self.reference)} GB/s" if self.reference else ""
        why = f"[{self.reason}] " if self.degraded and self.reason else ""
        return (
            f"{why}{self.low_recent} of the last {len(self.recent)} under "
            f"{_gbps(self.low_bound)} GB/s{floor} (baseline {_gbps(self.baseline or 0.0)} GB/s"
            f"{reference}, spread {_gbps(self.spread or 0.0)} GB/s){level}; "
            f"recent GB/s: {values}"
        )


def _gbps(value: float) -> str:
    return f"{value / 1e9:.4g}"
