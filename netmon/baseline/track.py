"""One series' state: what it learned, what it saw lately, and what it is degraded for.

Pure logic: no clock, no I/O; netmon.baseline.rule moves it one result at a time, and
BaselineBook keeps the tracks, locks them and gives them the time.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from netmon.baseline import robust
from netmon.baseline.hours import Hours
from netmon.baseline.lines import Lines
from netmon.baseline.policy import BaselinePolicy
from netmon.baseline.reference import Reference
from netmon.baseline.verdict import DEGRADED_REASONS, Verdict

# The spread is taken over this many baseline windows of learned results: a median absolute
# deviation of 20 values is itself a noisy figure (about 30 % either way), and a spread read
# too narrow draws the line too close under the baseline.
SPREAD_WINDOWS = 3
# The recent level's spread counts once it holds this many results.
MIN_LEVEL_SPREAD = 5

# What each judged result was, for the flapping rule: low, noisy (a result whose own cv is far
# over the series' usual: evidence, not noise to throw away), healthy, or between the lines.
LOW, NOISY, HEALTHY, BETWEEN = "L", "N", "H", "."
BAD = (LOW, NOISY)


@dataclass(frozen=True)
class ReferenceLines:
    """The long level's lines relative to the reference: `tolerance` (ratio x the reference)
    can never be accepted; `decline` (over it once the reference is mature and the series
    steady enough) is a loss within the tolerance that a level held long enough accepts."""

    tolerance: float
    decline: float
    back: float  # the long level must be back over it before a decline clears


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
    long: deque[float]  # the last long_window conclusive results
    flaps: deque[str]  # the last flap_window judged or noisy results: LOW, NOISY, HEALTHY, BETWEEN
    reference: Reference = field(default_factory=Reference)
    trend: Hours = field(default_factory=Hours)  # the last steady_hours of conclusive results
    # The level a decline is measured from: the reference, or a lower level within its
    # tolerance that the series held long enough to be accepted (never over the reference).
    accepted: float | None = None
    conditions: set[str] = field(default_factory=set)  # the DEGRADED_REASONS that hold now
    tolerated: int = 0  # conclusive results in a row within the tolerance while degraded
    degraded_since: float | None = None
    since: int = 0  # conclusive results since it turned degraded (this one included)
    below: int = 0  # conclusive results in a row with the levels under the decline line
    episodes: int = 0  # times it turned degraded since the daemon started
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
            long=deque(maxlen=policy.long_window),
            flaps=deque(maxlen=policy.flap_window),
        )

    @property
    def degraded(self) -> bool:
        return bool(self.conditions)

    @property
    def reason(self) -> str | None:
        """The first of DEGRADED_REASONS that holds: the most specific one."""
        return next((r for r in DEGRADED_REASONS if r in self.conditions), None)

    def baseline(self, policy: BaselinePolicy) -> float | None:
        """The rolling baseline: the median of the last `window` learned results. A result is
        judged against it (the expected level); the reference watches the long run."""
        if len(self.learned) < policy.min_samples:
            return None
        return robust.median(self.learned)

    def expected(self, policy: BaselinePolicy) -> float | None:
        """The level a result is judged against: the baseline, or where the baseline has
        fallen under it, the reference's floor (its day's trough, or the level accepted under
        it) less the baseline's own uncertainty. So the baseline cannot follow a cut down
        result by result: judged against the floor, a cut's results are low and never learned.
        """
        baseline = self.baseline(policy)
        if baseline is None:
            return None
        floor = self.reference.floor()
        if floor is None:
            return baseline
        if self.accepted is not None:
            floor = min(floor, self.accepted)
        return max(baseline, floor - self._wander() / 2)

    def _wander(self) -> float:
        """Two standard errors of the window's median: how far it moves on noise alone."""
        return 2 * robust.MEDIAN_SE * self.spread() / math.sqrt(max(len(self.learned), 1))

    def lines(self, policy: BaselinePolicy, size: int) -> Lines | None:
        expected = self.expected(policy)
        return None if expected is None else Lines.of(policy, size, expected, self.spread())

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

    def back_level(self, policy: BaselinePolicy) -> float | None:
        """The median of the conclusive results since the series turned degraded, the last
        `clear_window` of them: what a degradation must bring back over its clearing line.
        None until a baseline window of them came: results from before the fault prove
        nothing, and a burst of good results inside a held cut (the recorded stream runs
        1.2-1.3x for ten results at a time) must be at most half of them. A repair after a
        long fault shows within half of clear_window."""
        count = min(self.since, policy.clear_window, len(self.long))
        if count < max(policy.level_size, min(policy.window, policy.clear_window)):
            return None
        return robust.median(list(self.long)[-count:])

    def long_level(self, policy: BaselinePolicy) -> float | None:
        """The median of the last long_window conclusive results, once there are that many:
        slow enough to read a loss of a few percent under the noise of single results."""
        if len(self.long) < policy.long_window:
            return None
        return robust.median(self.long)

    def reference_lines(self, policy: BaselinePolicy, size: int) -> ReferenceLines | None:
        """The long level's lines, once there is a reference. While it is young the decline
        line is the tolerance itself: what a day's swing looks like is not known yet."""
        reference = self.reference.value()
        if reference is None:
            return None
        tolerance = policy.ratio_for(size) * reference
        decline = tolerance
        if self.reference.mature:
            # The margin is the policy's, or wider where the series' own hours wander more.
            wander = policy.decline_k * self.reference.wander() / reference
            margin = max(policy.decline_margin, wander)
            decline = max(tolerance, self.accepted_level() * (1 - margin))
        return ReferenceLines(tolerance, decline, (decline + self.accepted_level()) / 2)

    def accepted_level(self) -> float:
        reference = self.reference.value() or 0.0
        return reference if self.accepted is None else min(self.accepted, reference)

    def steady(self, policy: BaselinePolicy) -> bool:
        """Whether the level holds: its hour medians over the last steady_hours fall by less
        than steady_slope an hour. A loss still under way (a slow decline) is never accepted."""
        slope = self.trend.slope(policy.steady_hours)
        return slope is not None and slope >= -policy.steady_slope

    def learn(self, busbw: float, cv: float, at: float, policy: BaselinePolicy) -> None:
        if len(self.learned) == self.learned.maxlen:
            self.older.append(self.learned[0])
        self.learned.append(busbw)
        self.learned_cv.append(cv)
        self.reference.learn(busbw, at, policy.reference_hours, policy.reference_min_hours)

    def rebase(self, policy: BaselinePolicy) -> None:
        """Accept the level the series has held within its tolerance: the baseline starts again
        from its latest results and declines count from here. The reference does not move."""
        latest = list(self.long)[-policy.window :]
        self.learned.clear()
        self.learned.extend(latest)
        self.older.clear()
        for flags in (self.recent, self.healthy, self.recent_values):
            flags.clear()
        level = self.long_level(policy) or robust.median(latest)
        self.accepted = min(level, self.accepted_level())

    def raise_accepted(self, policy: BaselinePolicy) -> None:
        """A healthy series that is back over its accepted level takes it up again, as far as
        the reference (a repair after an accepted loss)."""
        level, reference = self.long_level(policy), self.reference.value()
        if self.accepted is None or level is None or reference is None:
            return
        if level > self.accepted:
            self.accepted = None if level >= reference else level

    def set_conditions(self, conditions: set[str], at: float | None) -> None:
        if conditions and not self.conditions:
            self.degraded_since = at
            self.episodes += 1
            self.since = 0
        elif not conditions:
            self.degraded_since = None
        self.conditions = conditions

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
        reference_lines = self.reference_lines(policy, size) if judged else None
        return Verdict(
            baseline=self.baseline(policy),
            ratio=ratio,
            degraded=self.degraded,
            healthy_samples=len(self.learned),
            low_recent=sum(self.recent),
            judged=judged,
            reference=self.reference.value(),
            expected=lines.expected if lines else None,
            reason=self.reason,
            at_floor=bool(lines and judged and lines.at_floor),
            judged_at=self.judged_at,
            spread=lines.spread if lines else None,
            low_bound=lines.low if lines and judged else None,
            level=level if judged else None,
            level_bound=lines.level if lines and judged else None,
            recent=tuple(self.recent_values),
            long_level=self.long_level(policy),
            reference_line=reference_lines.decline if reference_lines else None,
            reference_mature=self.reference.mature,
            flaps=sum(f in BAD for f in self.flaps) if judged else 0,
            degraded_since=self.degraded_since,
            episodes=self.episodes,
            **extra,  # type: ignore[arg-type]
        )


def usable(busbw: float) -> bool:
    return math.isfinite(busbw) and busbw > 0
