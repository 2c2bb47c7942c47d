"""A series' results hour by hour: each hour's median, and the trend across hours.

Results within an hour are correlated (the same host load, the same clocks), so a day's level
and a slow trend are read from hour medians, not from single results. Pure logic: the time of
each value is given.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from netmon.baseline import robust

HOUR_S = 3600.0
# One hour's values are kept for its median; a probe that runs more often than this many
# times an hour keeps every second one, then every fourth, ... (a fair sample of the hour).
HOUR_SAMPLE = 128


@dataclass
class Hours:
    """The medians of the completed hours (the newest `keep`, or all) and the hour under way."""

    done: list[tuple[int, float]] = field(default_factory=list)  # (hour index, median)
    hour: int | None = None  # the hour being filled
    sample: list[float] = field(default_factory=list)  # its values (decimated past HOUR_SAMPLE)
    stride: int = 1  # keep one value of every `stride` in the hour
    skipped: int = 0  # values passed over since the last kept one

    def add(self, value: float, at: float, keep: int | None = None) -> bool:
        """Add a value at unix time `at`; True when it began a new hour (the one before is
        then complete). A clock that steps back stays in its hour."""
        hour = int(at // HOUR_S)
        completed = False
        if self.hour is not None and hour > self.hour and self.sample:
            self.done.append((self.hour, robust.midmean(self.sample)))
            if keep is not None:
                del self.done[:-keep]
            self.sample, self.stride, self.skipped = [], 1, 0
            completed = True
        if self.hour is None or hour > self.hour:
            self.hour = hour
        self._keep(value)
        return completed

    def _keep(self, value: float) -> None:
        if self.skipped + 1 < self.stride:
            self.skipped += 1
            return
        self.skipped = 0
        self.sample.append(value)
        if len(self.sample) >= HOUR_SAMPLE:
            self.sample = self.sample[::2]
            self.stride *= 2

    def medians(self) -> list[float]:
        """Every completed hour's median, and the hour under way's."""
        current = [robust.midmean(self.sample)] if self.sample else []
        return [m for _, m in self.done] + current

    def span(self) -> int:
        """Hours from the first completed one to the last, both counted."""
        return self.done[-1][0] - self.done[0][0] + 1 if self.done else 0

    def span_of(self, last: int) -> int:
        """Hours from the first to the last of the newest `last` completed hours, both counted."""
        newest = self.done[-last:]
        return newest[-1][0] - newest[0][0] + 1 if newest else 0

    def slope(self, within: int) -> float | None:
        """The least-squares slope of the completed hours' medians of the last `within` hours,
        per hour and relative to their mean; None with fewer than 3 such hours."""
        if not self.done:
            return None
        last = self.done[-1][0]
        points = [(h, m) for h, m in self.done if h > last - within]
        if len(points) < 3:
            return None
        mean_h = sum(h for h, _ in points) / len(points)
        mean_m = sum(m for _, m in points) / len(points)
        sxx = sum((h - mean_h) ** 2 for h, _ in points)
        sxy = sum((h - mean_h) * (m - mean_m) for h, m in points)
        if sxx == 0 or mean_m <= 0 or not math.isfinite(sxy):
            return None
        return sxy / sxx / mean_m
