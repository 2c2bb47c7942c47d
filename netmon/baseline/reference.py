"""A series' long-term reference: learned over a day of healthy results, then fixed.

A level that swings with the day (traffic beside the probe, clocks, a shared fabric's load) has
no single right value over minutes: a reference taken from the first twenty results is the day's
peak, trough or mean by chance, and the series pages at the other end of the swing. This one is
learned from every hour of a whole day: the reference is the median of the hour medians, and
their spread says how far the series wanders over a day. Until it has a day it is young: a
provisional level that follows the hours it has seen, against which only the plain tolerance
is judged (docs/SIGNAL.md). Pure logic: the time of each result is given.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from netmon.baseline import robust
from netmon.baseline.hours import HOUR_S, Hours

# The hours a mature reference keeps to see how far the series wanders: a week, every phase
# of a weekly cycle; and how many it needs before it reads them.
WANDER_HOURS = 7 * 24
WANDER_HOURS_MIN = 48
# The 90th percentile of a normal distribution is 1.2816 standard deviations over its median.
UPPER_Q90_SIGMAS = 1.2816


@dataclass
class Reference:
    """Hour medians while young; once `mature`, the level and spread they gave, fixed."""

    hours: Hours = field(default_factory=Hours)
    level: float | None = None  # set once mature
    spread: float = 0.0  # robust spread of the hour medians across the day, once mature
    low: float | None = None  # the 10th percentile of the hour medians (a swing's trough)
    _week_key: tuple[Any, ...] | None = field(default=None, init=False, repr=False, compare=False)
    _week_figures: tuple[float, float] | None = field(
        default=None, init=False, repr=False, compare=False
    )

    @property
    def mature(self) -> bool:
        return self.level is not None

    def value(self) -> float | None:
        """The reference: fixed once mature; while young, the median of the hour medians seen so
        far (the hour under way counts as one)."""
        if self.level is not None:
            return self.level
        medians = self.hours.medians()
        return robust.median(medians) if medians else None

    def learn(self, value: float, at: float, span_hours: int, min_hours: int) -> None:
        """Add one learned (healthy) result at unix time `at`. Matures once the hours it has
        seen span `span_hours` (a day: every phase of a daily swing) and `min_hours` of them
        have results. Once mature its level is fixed, but the hours go on: over a week they
        show how far the series wanders (wander())."""
        completed = self.hours.add(value, at, keep=WANDER_HOURS if self.mature else None)
        if self.mature or not completed:
            return
        done = self.hours.done
        if self.hours.span() >= span_hours and len(done) >= min_hours:
            medians = [m for _, m in done]
            self.level = robust.median(medians)
            self.spread = robust.spread(medians)
            self.low = min(self.level, robust.quantile(medians, 0.1))

    def raise_to(self, level: float, low: float) -> None:
        """A mature reference taken up to a level the series has held for hours (an upgrade);
        never down: only an operator's rebaseline or new hardware moves it down."""
        if self.level is not None and level > self.level:
            self.level, self.low = level, max(self.low or low, min(low, level))

    def wander(self) -> float:
        """How far the series' hours wander from their centre (a standard deviation), once
        mature: the day's spread, or where the hours since show more, the upper tail's (a slow
        decline under way widens only the lower tail, and must not hide itself)."""
        week = self._week()
        if week is None:
            return self.spread
        median, q90 = week
        return max(self.spread, (q90 - median) / UPPER_Q90_SIGMAS)

    def centre(self) -> float | None:
        """Where the series' hours have centred since it matured (the median of up to a week
        of hour medians, once WANDER_HOURS_MIN of them), never over the level: a first day
        that ran high on a slow wander (AR(1), sd 5 %, six hours: its median is off by 3-4 %
        one time in six) set a level the series then runs 20 % under for hours at a time."""
        week = self._week()
        if self.level is None or week is None:
            return self.level
        return min(self.level, week[0])

    def _week(self) -> tuple[float, float] | None:
        """The median and 90th percentile of the hours kept, once WANDER_HOURS_MIN of them.
        Read three times a result and changed once an hour: kept until the hours change,
        which they do only at their ends (an hour appended, the oldest let go), so their
        count and end hours tell (keyed on a copy of the week, a result cost about 8 us more)."""
        done = self.hours.done
        key = (id(done), len(done), done[0], done[-1]) if done else None
        if self._week_key != key:
            medians = sorted(m for _, m in done)
            self._week_key = key
            self._week_figures = (
                None
                if len(medians) < WANDER_HOURS_MIN
                else (robust.median(medians), robust.quantile(medians, 0.9))
            )
        return self._week_figures

    def excess(self) -> float:
        """How much deeper than its first day's trough the series' hours wander (0 while
        young): that trough less the one its hours since imply (floor())."""
        if self.low is None or self.level is None:
            return 0.0
        centre = self.centre() or self.level
        return max(0.0, self.low - (centre - UPPER_Q90_SIGMAS * self.wander()))

    def floor(self) -> float | None:
        """The lowest level a healthy series of this reference is expected at: the trough of
        its day (the 10th percentile of its hour medians), of the hours seen so far while it is
        young. A series that started at its peak is at the lowest hour it has seen when it nears
        its first trough, not under the mean of the hours before. Once mature, lower where its
        hours since wander further than its first day showed: the 10th percentile the upper
        tail implies (wander()). A day of a series that wanders over hours (AR(1), sd 5 %, six
        hours) holds about four independent levels: its trough was a point or two under the
        level, and the series went 20 % under that about 1.5 times a series-year
        (bench/false_alarms.py), each an episode of hours."""
        if self.low is not None:
            return self.low - self.excess()
        medians = self.hours.medians()
        return robust.quantile(medians, 0.1) if medians else None

    @classmethod
    def seeded(cls, level: float, at: float) -> Reference:
        """A young reference that starts from a level learned before hours were kept (a state
        file of version 2, or 1): that level counts as the hour before `at`."""
        return cls(hours=Hours(done=[(int(at // HOUR_S) - 1, level)]))
