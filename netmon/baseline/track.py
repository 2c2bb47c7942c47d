"""One series' state: what it learned, what it saw lately, and what it is degraded for.

Pure logic: no clock, no I/O; netmon.baseline.rule moves it one result at a time, and
BaselineBook keeps the tracks, locks them and gives them the time.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from netmon.baseline import robust
from netmon.baseline.hours import Hours
from netmon.baseline.lines import Lines
from netmon.baseline.memo import Counted, keyed_on
from netmon.baseline.ordered import Ordered
from netmon.baseline.policy import BaselinePolicy
from netmon.baseline.reference import Reference
from netmon.baseline.verdict import DEGRADED_REASONS, Verdict

# The baseline and the spread are taken over this many windows of learned results (120 by
# default). A median absolute deviation of 20 values is itself a noisy figure (about 30 % either
# way), and a spread read too narrow draws the line too close under the baseline. On a series
# with two levels the share of each among 60 learned results varies (a third on the lower one:
# 0.33 +- 0.06), and the baseline with it: at its top, the lower level sat on the line. Over
# 120 it varies by a third less (bench/false_alarms.py, classes `bimodal` and `edge`); it
# follows a healthy change later, which the swing and step classes measure.
LEARNED_WINDOWS = 6

# The share of learned results at each end the baseline leaves out (Track.baseline).
BASELINE_TRIM = 0.1

# What each judged result was, for the flapping rule: low, noisy (a result whose own cv is far
# over the series' usual: evidence, not noise to throw away), healthy, or between the lines.
LOW, NOISY, HEALTHY, BETWEEN = "L", "N", "H", "."

# The young check's segments (rule._check_young): the results before a change at least
# YOUNG_BEFORE, those after it at least YOUNG_AFTER: on a series with two levels, the chance
# that so many in a row fall on the lower one is 2^-10.
YOUNG_BEFORE = 3
YOUNG_AFTER = 10
# At most this many results are kept for the young check: a cut found later than this into a
# series' life is the rolling rules' (its lows are not learned, so it stays young meanwhile).
YOUNG_SEEN = 120
BAD = (LOW, NOISY)


@dataclass(frozen=True)
class ReferenceLines:
    """The long level's lines relative to the reference: `tolerance` (ratio x the reference)
    can never be accepted; `decline` (over it once the reference is mature and the series
    steady enough) is a loss within the tolerance that a level held long enough accepts."""

    tolerance: float
    decline: float
    back: float  # the long level must be back over it before a decline clears
    # Under it the long level turns `decline` at once: ratio x the lower of where the
    # series' hours centre since its first day and the reference less how much deeper than
    # that day's trough they wander (Reference.excess); the tolerance on a flat series or a
    # daily swing its first day saw whole.
    at_once: float


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
    # Results within the band, waiting learn_delay results before they are learned: (busbw,
    # cv, time). Not kept across a restart: a few results unlearned, no baseline forgotten.
    pending: deque[tuple[float, float, float]] = field(default_factory=deque)
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
    # Whether the results since it turned have held under the clearing line (a fault that
    # holds), or were back at once (a few outliers that happened to meet: cleared as soon).
    held: bool = False
    # The level this series' own first results showed before a cut it was born with or cut
    # while young (the young check: rule._young_cut), or None. A lower bound of the expected
    # level for the track's life: a young series is never learned cut.
    seed: float | None = None
    # The usable results of a new series while it settled: a cold first run is slower, never
    # faster, so a settling result well over what follows says the link was cut after it.
    settled: list[float] = field(default_factory=list)
    # Every usable conclusive result while young, low ones too: what the young check reads
    # (the learned ones leave the lows out). Not kept across a restart: it is gathered again.
    young_seen: deque[float] = field(default_factory=lambda: deque(maxlen=YOUNG_SEEN))
    # The level the site (expect:) or the shipped table of published figures expects of this
    # key at least, divided by the ratio (so that the low line sits on it); given with each
    # result, not kept.
    outside: float | None = None
    # The flapping rule's own rate of bad results on this series: decayed counts of bad flags
    # and of all flags, while it is not degraded (a fault must not raise its own allowance).
    rate_bad: float = 0.0
    rate_count: float = 0.0
    episodes: int = 0  # times it turned degraded since the daemon started
    seen: int = 0  # results since settling began (a start, a new zygote, a pause)
    judged_at: float | None = None  # when the latest conclusive result came
    # The learned results (older and learned) and the long window in order, moved with them
    # rather than sorted anew on every result: figures of the state, not part of it.
    _learned_order: Ordered = field(default_factory=Ordered, init=False, repr=False, compare=False)
    _long_order: Ordered = field(default_factory=Ordered, init=False, repr=False, compare=False)

    @classmethod
    def new(cls, policy: BaselinePolicy) -> Track:
        window, of = policy.window, policy.of
        # The windows the kept figures read count their changes (memo.Counted): a figure is
        # keyed on its windows' counts, not on copies of them.
        return cls(
            learned=Counted(maxlen=window),
            learned_cv=deque(maxlen=window),
            older=Counted(maxlen=(LEARNED_WINDOWS - 1) * window),
            recent=deque(maxlen=of),
            healthy=deque(maxlen=of),
            recent_values=deque(maxlen=of),
            noisy_recent=deque(maxlen=of),
            level=Counted(maxlen=policy.level_size),
            long=Counted(maxlen=policy.long_window),
            flaps=deque(maxlen=policy.flap_window),
        )

    @property
    def degraded(self) -> bool:
        return bool(self.conditions)

    @property
    def reason(self) -> str | None:
        """The first of DEGRADED_REASONS that holds: the most specific one."""
        return next((r for r in DEGRADED_REASONS if r in self.conditions), None)

    @keyed_on("older", "learned")  # read three times per result, moves once at most
    def baseline(self, policy: BaselinePolicy) -> float | None:
        """The rolling baseline: the mean of the last 6 x `window` learned results without
        their highest and lowest tenth. A result is judged against it (the expected level);
        the reference watches the long run. A mean, not a median: on a series with two levels
        (NCCL switching between two algorithms) a median jumps from one to the other as their
        counts change, and the lower one sits on the line. Trimmed: what is learned lies in a
        band as wide as the low line is deep, and a long upper tail within it (a busy 2-core
        host at 1 MiB) would lift a plain mean over the series' own median. At least one
        result off each end: a tenth of the first five is none, and one result at 5x among
        them (a busy host's latency) set a baseline no later result reached, for good."""
        if len(self.learned) < policy.min_samples:
            return None
        return robust.trimmed_mean_of_ordered(self._learned_in_order(), BASELINE_TRIM, 1)

    def expected(self, policy: BaselinePolicy) -> float | None:
        """The level a result is judged against: the baseline, or where the baseline has
        fallen under it, the reference's floor (its day's trough, or the level accepted under
        it) less the baseline's own uncertainty. So the baseline cannot follow a cut down
        result by result: judged against the floor, a cut's results are low and never learned.
        """
        baseline = self.baseline(policy)
        lower = max(self.seed or 0.0, self.outside or 0.0)
        if baseline is None:
            return lower or None
        floor = self.reference.floor()
        if floor is None:
            return max(baseline, lower)
        if self.accepted is not None:
            floor = min(floor, self.accepted)
        return max(baseline, floor - self._wander() / 2, lower)

    def young(self, policy: BaselinePolicy) -> bool:
        """Whether the series has learned fewer than a window of results and no cut was found
        in them: its first results are checked for a change before the baseline is trusted."""
        return self.seed is None and len(self.older) + len(self.learned) < policy.window

    def saw_young(self, value: float) -> None:
        self.young_seen.append(value)

    def learned_values(self) -> list[float]:
        return [*self.older, *self.learned]

    def keep_first(self, count: int) -> None:
        """Forget every learned result after the first `count` (a cut found among them)."""
        values = self.learned_values()[:count]
        self.older.clear()
        self.learned.clear()
        self.learned_cv.clear()
        self.learned.extend(values[-self.learned.maxlen :] if self.learned.maxlen else values)
        self.older.extend(values[: max(0, len(values) - len(self.learned))])

    def _wander(self) -> float:
        """Two standard errors of the window's median: how far it moves on noise alone."""
        return 2 * robust.MEDIAN_SE * self.spread() / math.sqrt(max(len(self.learned), 1))

    def lines(self, policy: BaselinePolicy, size: int) -> Lines | None:
        expected = self.expected(policy)
        return None if expected is None else self.lines_at(policy, size, expected)

    def lines_at(self, policy: BaselinePolicy, size: int, expected: float) -> Lines:
        """The lines around `expected`, the expected level of the state as it is now (the rule
        has it at hand: expected() is the costliest figure it reads)."""
        return Lines.of(policy, size, expected, self.spread())

    @keyed_on("older", "learned")  # read about four times per result, moves more rarely
    def spread(self) -> float:
        """The spread of the learned results (the last six windows). Since they are learned
        within a symmetric band from the low line (rule._within_band), they are the series'
        noise, not its healthy half; before, the recent level's spread was taken where wider,
        and a cut's own onset widened the lines under it (a 25 % cut flagged 15 results late)."""
        return robust.spread_of_ordered(self._learned_in_order())

    def _learned_in_order(self) -> list[float]:
        return self._learned_order.of([*self.older, *self.learned])

    def usual_cv(self, policy: BaselinePolicy) -> float | None:
        if len(self.learned_cv) < policy.min_samples:
            return None
        return robust.median(list(self.learned_cv))

    @keyed_on("level")  # read four times per result, moves once
    def recent_level(self, policy: BaselinePolicy) -> float | None:
        """The median of the last level_window conclusive results, once there are that many."""
        if len(self.level) < policy.level_size:
            return None
        return robust.median(self.level)

    def floored_mean(self, floor: float) -> float:
        """The mean of the recent level's results, each taken as `floor` at least."""
        return math.fsum(max(v, floor) for v in self.level) / max(len(self.level), 1)

    def newest_mean(self, count: int, cap: float) -> float:
        """The mean of the newest `count` results of the recent level, each taken as `cap` at
        most: one fast result says the link is not slow, not that four slow ones are not."""
        newest = list(self.level)[-count:]
        return math.fsum(min(v, cap) for v in newest) / max(len(newest), 1)

    def back_level(self, policy: BaselinePolicy) -> float | None:
        """The median of the conclusive results since the series turned degraded, the last
        `clear_window` of them: what a degradation must bring back over its clearing line.
        Results from before the fault prove nothing. Once the fault has held (`held`), None
        until a baseline window of them came: a burst of good results inside a held cut (the
        recorded stream runs 1.2-1.3x for ten results at a time) must be at most half of them,
        and a repair after a long fault shows within half of clear_window. Before, `of` of them
        do: a turn that the next results do not bear out (a few outliers of a heavy-tailed
        series that met in one window) clears within `of` results, too short to page."""
        needed = max(policy.level_size, min(policy.window, policy.clear_window))
        return self.since_level(policy, needed if self.held else policy.of)

    def since_level(self, policy: BaselinePolicy, needed: int) -> float | None:
        """The median of the last clear_window conclusive results since the turn (`needed`
        where that is more: a clear_window under the level window held a fault for good), once
        there are `needed` of them."""
        count = min(self.since, max(policy.clear_window, needed), len(self.long))
        if count < needed:
            return None
        return robust.median(list(self.long)[-count:])

    @keyed_on("long")  # read three times per result: a median of 120
    def long_level(self, policy: BaselinePolicy) -> float | None:
        """The mean of the middle half of the last long_window conclusive results, once there
        are that many: slow enough to read a loss of a few percent under the noise of single
        results, and steady on a series with two levels, where a median jumps between them."""
        if len(self.long) < policy.long_window:
            return None
        return robust.midmean_of_ordered(self._long_order.of(list(self.long)))

    def reference_lines(self, policy: BaselinePolicy, size: int) -> ReferenceLines | None:
        """The long level's lines, once there is a reference. While it is young the decline
        line is the tolerance itself: what a day's swing looks like is not known yet."""
        reference = self.reference.value()
        if reference is None:
            return None
        ratio = policy.ratio_for(size)
        tolerance = ratio * reference
        at_once = decline = tolerance
        if self.reference.mature:
            # The margin is the policy's, or wider where the series' own hours wander more.
            wander = policy.decline_k * self.reference.wander() / reference
            margin = max(policy.decline_margin, wander)
            centre = self.reference.centre() or reference
            at_once = ratio * min(centre, reference - self.reference.excess())
            decline = max(at_once, self.accepted_level() * (1 - margin))
        return ReferenceLines(tolerance, decline, (decline + self.accepted_level()) / 2, at_once)

    def accepted_level(self) -> float:
        reference = self.reference.value() or 0.0
        return reference if self.accepted is None else min(self.accepted, reference)

    def steady(self, policy: BaselinePolicy) -> bool:
        """Whether the level holds: its hour medians over the last steady_hours fall by less
        than steady_slope an hour. A loss still under way (a slow decline) is never accepted."""
        slope = self.trend.slope(policy.steady_hours)
        return slope is not None and slope >= -policy.steady_slope

    def count_flag(self, flag: str, policy: BaselinePolicy) -> None:
        """Add a judged or noisy result's flag to the flapping window and, while the series is
        not degraded, the flag the window lets go to its own rate of bad results (decayed over
        flap_rate_results). The window is judged against the rate of the results before it:
        counted as they came, a flap's own bad results raised the allowance faster than they
        filled the window (2 of 5 at half bandwidth after 4 healthy hours: never flagged)."""
        leaving = self.flaps[0] if len(self.flaps) == self.flaps.maxlen else None
        self.flaps.append(flag)
        if self.degraded or leaving is None:
            return
        keep = 1 - 1 / policy.flap_rate_results
        self.rate_bad = self.rate_bad * keep + (leaving in BAD)
        self.rate_count = self.rate_count * keep + 1

    def bad_rate(self, policy: BaselinePolicy) -> float:
        """An upper bound on the series' own rate of bad results: the decayed share, pulled
        toward flap_base_rate by a prior of flap_prior results, plus two standard errors (a
        young series is allowed more, until its rate is known)."""
        weight = self.rate_count + policy.flap_prior
        rate = (self.rate_bad + policy.flap_base_rate * policy.flap_prior) / weight
        return min(rate + 2 * math.sqrt(rate * (1 - rate) / weight), 0.5)

    def learn(self, busbw: float, cv: float, at: float, policy: BaselinePolicy) -> None:
        if len(self.learned) == self.learned.maxlen:
            self.older.append(self.learned[0])
        self.learned.append(busbw)
        self.learned_cv.append(cv)
        self.reference.learn(busbw, at, policy.reference_hours, policy.reference_min_hours)

    def rebase(self, policy: BaselinePolicy, size: int) -> None:
        """Accept the level the series has held within its tolerance: the baseline starts again
        from its latest results and declines count from here. The reference does not move."""
        latest = list(self.long)[-policy.window :]
        # Learned as any result is: within the band around their centre, so an outlier among
        # them does not move the baseline's mean.
        centre, ratio = robust.median(latest), policy.ratio_for(size)
        self.learned.clear()
        self.learned.extend(v for v in latest if ratio * centre <= v <= centre / ratio)
        self.older.clear()
        for flags in (self.recent, self.healthy, self.recent_values):
            flags.clear()
        self.pending.clear()
        level = self.long_level(policy) or robust.median(latest)
        self.accepted = min(level, self.accepted_level())

    def follow_upgrade(self, policy: BaselinePolicy, size: int) -> bool:
        """Take a mature reference up to where the series has run for the last
        `upgrade_hours` hours, every one of them beyond what the tolerance allows over it (a new
        driver or NCCL: +40 % held for days), so that a decline from there is measured from
        there. Returns whether the reference is stale: every one of those hours over it by
        more than decline_margin but not that far (`netmon rebaseline` takes it up)."""
        reference = self.reference.value()
        recent = [m for _, m in self.reference.hours.done[-policy.upgrade_hours :]]
        if not self.reference.mature or reference is None or len(recent) < policy.upgrade_hours:
            return False
        if self.reference.hours.span_of(policy.upgrade_hours) > policy.upgrade_hours:
            return False  # hours missing among them: not a level held
        if min(recent) >= reference / policy.ratio_for(size):
            self.reference.raise_to(robust.median(recent), robust.quantile(recent, 0.1))
            self.accepted = None
            return False
        return min(recent) >= reference * (1 + policy.decline_margin)

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
            self.held = False
        elif not conditions:
            self.degraded_since = None
            # Back at the level its first results showed: the seed has done its work, and a
            # series with two levels (whose first few fell on the upper one) learns both.
            self.seed = None
        self.conditions = conditions

    def verdict(
        self,
        policy: BaselinePolicy,
        size: int,
        ratio: float | None = None,
        lines: Lines | None = None,
        baseline: float | None = None,
        **extra: object,
    ) -> Verdict:
        """Where the track stands now; `lines` and `baseline` are the ones the latest result was
        judged by (those of the current state otherwise)."""
        judged = policy.judges(size)
        if lines is None:
            lines = self.lines(policy, size)
        level = self.recent_level(policy)
        reference_lines = self.reference_lines(policy, size) if judged else None
        return Verdict(
            baseline=self.baseline(policy) if baseline is None else baseline,
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
            flaps=bad_count(self.flaps) if judged else 0,
            degraded_since=self.degraded_since,
            episodes=self.episodes,
            young=self.young(policy) and self.baseline(policy) is not None,
            **extra,  # type: ignore[arg-type]
        )


def bad_count(flags: Sequence[str]) -> int:
    """How many of the flapping window's flags are BAD (counted in C: read three times per
    result)."""
    return flags.count(LOW) + flags.count(NOISY)


def usable(busbw: float) -> bool:
    return math.isfinite(busbw) and busbw > 0
