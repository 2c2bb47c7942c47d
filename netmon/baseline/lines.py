"""The lines one result of a series is judged by, drawn from its baseline and its noise
(docs/SIGNAL.md, "The lines")."""

from __future__ import annotations

from dataclasses import dataclass

from netmon.baseline import robust
from netmon.baseline.policy import BaselinePolicy


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
    def of(cls, policy: BaselinePolicy, size: int, expected: float, spread: float) -> Lines:
        """The lines for a series whose expected level is `expected`."""
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
            # Halfway back from the line to the expected level: a burst of good results in a
            # held cut (the recorded stream runs 1.2-1.3x its median for ten results at a time:
            # cut to 0.75x, about 0.9x) does not clear it.
            clear=max(level, robust.clear_bound(expected, ratio)),
        )
