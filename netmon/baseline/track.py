"""One series' state and the rule that judges each of its results (docs/SIGNAL.md, "The rule").

Pure logic: no clock, no I/O; BaselineBook keeps the tracks, locks them and gives them the time.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, replace

from netmon.baseline import robust
from netmon.baseline.policy import BaselinePolicy
from netmon.baseline.verdict import Verdict

# The spread is taken over this many baseline windows of learned results: a median absolute
# deviation of 20 values is itself a noisy figure (about 30 % either way), and a spread read
# too narrow draws the line too close under the baseline.
SPREAD_WINDOWS = 3
# The recent level's spread counts once it holds this many results.
MIN_LEVEL_SPREAD = 5

# Why a result was neither judged nor learned (netmon_inconclusive_results_total's reasons).
INCONCLUSIVE_REASONS = ("settling", "disturbed", "noisy")


@dataclass(frozen=True)
class Lines:
    """The lines one result is judged by, all relative to the expected level."""

    expected: float
    spread: float
    low: float  # under it a result is low
    at_floor: bool  # the spread put the statistical line under the floor
    healthy: float  # at or over it a result is healthy: it may clear and be learned
    level: float  # under it the recent level is low: degraded, reason "drift"
    clear: float  # the recent level must be back over it before a degradation clears

    @classmethod
    def of(
        cls, policy: BaselinePolicy, size: int, expected: float, spread: float, back: float
    ) -> Lines:
        """The lines for a series whose expected level is `expected`; `back` is the level a
        degradation must come back to (the higher of the baseline and the reference itself)."""
        ratio, k = policy.ratio_for(size), policy.spread_k
        floor = policy.floor_for(size)
        low, at_floor = robust.floored(
            robust.low_bound(expected, spread, ratio, k), expected, floor
        )
        level, _ = robust.floored(
            robust.level_bound(expected, spread, ratio, k, policy.level_size), expected, floor
        )
        return cls(
            expected=expected,
            spread=spread,
            low=low,
            at_floor=at_floor,
            healthy=ratio * expected,
            level=level,
            # Halfway back from the line to the reference itself: a burst of good results in a
            # held cut (the recorded stream runs 1.2-1.3x its median for ten results at a time:
            # cut to 0.75x, about 0.9x) does not clear it.
            clear=max(level, robust.clear_bound(back, ratio)),
        )


@dataclass
class Track:
    """One key's mutable state; only BaselineBook touches it, under its lock."""

    learned: deque[float]
    learned_cv: deque[float]  # the cv of each learned result
    older: deque[float]  # learned results the window let go, kept for the spread
    recent: deque[bool]  # the last N judged results: True = low
    healthy: deque[bool]  # beside `recent`: True = at or over the healthy line
    recent_values: deque[float | None]  # beside `recent`
    noisy_recent: deque[bool]  # the last N conclusive-or-noisy
    level: deque[float]  # the last level_window conclusive results
    reference: float | None = None
    degraded: bool = False
    reason: str | None = None
    seen: int = 0  # results since settling began (a start, a new zygote, a pause)
    judged_at: float | None = None  # when the latest conclusive result came

    @classmethod
    def new(cls, policy: BaselinePolicy) -> Track:
        window, of = policy.window, policy.of
        return cls(
            learned=deque(maxlen=window),
            learned_cv=deque(maxlen=window),
            older=deque(maxlen=(SPREAD_WINDOWS - 1) * window),
            recent=deque(maxlen=of),
            healthy=deque(maxlen=of),
            recent_values=deque(maxlen=of),
            noisy_recent=deque(maxlen=of),
            level=deque(maxlen=policy.level_size),
        )

    def baseline(self, policy: BaselinePolicy) -> float | None:
        if len(self.learned) < policy.min_samples:
            return None
        return robust.median(self.learned)

    def expected(self, policy: BaselinePolicy) -> float | None:
        """The level a result is judged against: the baseline, or the reference less its own
        uncertainty where the baseline has drifted under that. The reference is one window's
        median: judged against it as it stands, a series would page on its own noise."""
        baseline = self.baseline(policy)
        if baseline is None:
            return None
        if self.reference is None:
            return baseline
        return max(baseline, self.reference - self._wander() / 2)

    def back(self, policy: BaselinePolicy) -> float | None:
        """The level a degradation must come back to: the baseline or the reference itself (the
        reference's uncertainty counts against clearing, as it counts for flagging)."""
        baseline = self.baseline(policy)
        return None if baseline is None else max(baseline, self.reference or 0.0)

    def lines(self, policy: BaselinePolicy, size: int) -> Lines | None:
        expected, back = self.expected(policy), self.back(policy)
        if expected is None or back is None:
            return None
        return Lines.of(policy, size, expected, self.spread(), back)

    def spread(self) -> float:
        """The larger of the baseline window's spread and the recent level's: the window keeps
        only healthy results, and alone it reads a series as quieter than it is (a line drawn
        too close under the baseline pages on noise)."""
        recent = robust.spread(list(self.level)) if len(self.level) >= MIN_LEVEL_SPREAD else 0.0
        return max(robust.spread([*self.older, *self.learned]), recent)

    def usual_cv(self, policy: BaselinePolicy) -> float | None:
        if len(self.learned_cv) < policy.min_samples:
            return None
        return robust.median(list(self.learned_cv))

    def recent_level(self, policy: BaselinePolicy) -> float | None:
        """The median of the last level_window conclusive results, once there are that many."""
        if len(self.level) < policy.level_size:
            return None
        return robust.median(self.level)

    def learn(self, busbw: float, cv: float, policy: BaselinePolicy, judged: bool) -> None:
        if len(self.learned) == self.learned.maxlen:
            self.older.append(self.learned[0])
        self.learned.append(busbw)
        self.learned_cv.append(cv)
        if judged and self.reference is None and len(self.learned) >= policy.window:
            # The reference is the first full window's baseline, and it never moves on its own
            # (BaselineBook.forget is the only way). Not up either: a level that wanders (a
            # daily cycle, a neighbour's traffic) would ratchet it to the top of the wander
            # and page at the bottom; docs/SIGNAL.md has the figures.
            self.reference = self.baseline(policy)

    def _wander(self) -> float:
        """Two standard errors of the window's median: how far it moves on noise alone."""
        return 2 * robust.MEDIAN_SE * self.spread() / math.sqrt(max(len(self.learned), 1))

    def verdict(
        self,
        policy: BaselinePolicy,
        size: int,
        ratio: float | None = None,
        lines: Lines | None = None,
        **extra: object,
    ) -> Verdict:
        """Where the track stands now; `lines` are the ones the latest result was judged by
        (those of the current state otherwise)."""
        judged = policy.judges(size)
        if lines is None:
            lines = self.lines(policy, size)
        level = self.recent_level(policy)
        return Verdict(
            baseline=self.baseline(policy),
            ratio=ratio,
            degraded=self.degraded,
            healthy_samples=len(self.learned),
            low_recent=sum(self.recent),
            judged=judged,
            reference=self.reference,
            expected=lines.expected if lines else None,
            reason=self.reason if self.degraded else None,
            at_floor=bool(lines and judged and lines.at_floor),
            judged_at=self.judged_at,
            spread=lines.spread if lines else None,
            low_bound=lines.low if lines and judged else None,
            level=level if judged else None,
            level_bound=lines.level if lines and judged else None,
            recent=tuple(self.recent_values),
            **extra,  # type: ignore[arg-type]
        )


def usable(busbw: float) -> bool:
    return math.isfinite(busbw) and busbw > 0


def inconclusive(
    track: Track, policy: BaselinePolicy, cv: float, foreign_cpu: float | None, is_usable: bool
) -> str | None:
    """Why this result can say nothing about the link, or None."""
    if track.seen <= policy.settle:
        return "settling"
    if not is_usable:  # a zero or broken figure is low, however it was measured
        return None
    if foreign_cpu is not None and foreign_cpu >= policy.max_foreign_cpu:
        # Not capped like noise: other work on the cores is measured, not inferred, and
        # judging under it is how a busy host pages. A host that stays busy shows as a
        # steady rate of these, and as silence (netmon_last_judged_timestamp_seconds).
        return "disturbed"
    usual = track.usual_cv(policy)
    noisy = usual is not None and cv > max(policy.noisy_cv_floor, policy.noisy_cv * usual)
    track.noisy_recent.append(noisy)
    # Noise that lasts is the series' state (a flapping link is noisy too): judge it.
    return "noisy" if noisy and sum(track.noisy_recent) < policy.trigger else None


def judge(
    track: Track, policy: BaselinePolicy, size: int, busbw: float, cv: float, lines: Lines
) -> Verdict:
    """One conclusive result of a judged size against its lines: count it, turn or hold the
    verdict, then learn from it if it is healthy and the series is not degraded."""
    is_usable = usable(busbw)
    low = not is_usable or busbw < lines.low
    healthy = is_usable and busbw >= lines.healthy
    track.recent.append(low)
    track.healthy.append(healthy)
    track.recent_values.append(busbw if is_usable else None)
    was = track.degraded
    _turn(track, policy, lines)
    # A degraded link must never become the new normal: learn only healthy results on a series
    # that is healthy now (the result that clears a degradation counts). A result between the
    # low line and the healthy line may be the series' noise, not yet a fault, and is not
    # learned either: a moderate cut hiding in a wide spread must not pull the baseline down.
    # Nor while the recent level is well under the expected level: the top of a cut's spread would
    # be learned, result by result, before the verdict turns (measured on a recording whose
    # level ran 10-15 % higher in its second half: the baseline fell from 1.05x to 0.8x).
    # Halfway between the drift line and the clearing line: higher, healthy noise would stop
    # learning in its own low stretches and bias the baseline up.
    level = track.recent_level(policy)
    steady = level is None or level >= (lines.level + lines.clear) / 2
    if healthy and not track.degraded and steady:
        track.learn(busbw, cv, policy, judged=True)
    return track.verdict(
        policy,
        size,
        busbw / lines.expected if is_usable else None,
        lines,
        changed=track.degraded != was,
    )


def _turn(track: Track, policy: BaselinePolicy, lines: Lines) -> None:
    """Degrade on M low of the last N, or on the recent level under its line ("drift");
    clear only on M healthy of the last N with the recent level back over the clearing line.
    Between the two the verdict holds."""
    level = track.recent_level(policy)
    if not track.degraded:
        if sum(track.recent) >= policy.trigger:
            track.degraded, track.reason = True, "low"
        elif level is not None and level < lines.level:
            track.degraded, track.reason = True, "drift"
        return
    back = level is not None and level >= lines.clear
    if sum(track.healthy) >= policy.trigger and back:
        track.degraded, track.reason = False, None


def step(
    track: Track,
    policy: BaselinePolicy,
    size: int,
    busbw: float,
    cv: float,
    foreign_cpu: float | None,
    at: float | None,
) -> Verdict:
    """One result of the track's series: inconclusive, learned, shown, or judged."""
    is_usable = usable(busbw)
    track.seen += 1
    baseline, expected = track.baseline(policy), track.expected(policy)
    ratio = busbw / expected if expected is not None and is_usable else None
    reason = inconclusive(track, policy, cv, foreign_cpu, is_usable)
    if reason is not None:
        return track.verdict(policy, size, ratio, inconclusive=reason)
    track.judged_at = at
    track.level.append(busbw if is_usable else 0.0)
    if expected is None:
        # Learning: nothing to compare with, so no low flags and no verdict yet.
        if is_usable:
            track.learn(busbw, cv, policy, judged=policy.judges(size))
        formed = track.expected(policy)
        return track.verdict(policy, size, busbw / formed if formed and is_usable else None)
    lines = track.lines(policy, size)
    assert lines is not None  # a baseline exists
    if policy.judges(size):
        # Reported against the baseline it was judged by, not the one it may have moved.
        return replace(judge(track, policy, size, busbw, cv, lines), baseline=baseline)
    track.degraded, track.reason = False, None  # a verdict from a policy that judged this size
    if is_usable:  # shown, never paged on: the plain median of its recent results
        track.learn(busbw, cv, policy, judged=False)
    return replace(track.verdict(policy, size, ratio, lines), baseline=baseline)
