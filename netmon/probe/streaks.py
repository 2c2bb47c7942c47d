"""Verdicts counted across sweeps: how many sweeps in a row named a subject (a GPU pair, a GPU, a
node, a node pair). One sweep can be a fluke, so the alerts wait for a second that agrees, and
the daemon counts it because only the daemon knows which sweeps measured what: a `for:` duration
would count minutes, not sweeps, and a sweep that skipped the subject agrees with nothing.
"""

from __future__ import annotations

from collections.abc import Collection, Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import TypeVar

K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True)
class Streak:
    sweeps: int  # sweeps in a row, of those that measured the subject, that named it
    measured_at: float  # when a sweep last measured it (unix seconds)


def advance(
    streaks: Mapping[K, Streak], measured: Iterable[K], named: Collection[K], at: float
) -> dict[K, Streak]:
    """The streaks after one more sweep, at `at`: one more for a subject it measured and named,
    0 for one it measured and did not name. A subject it did not measure keeps its streak and
    its time, named or not: a verdict on an older result is no second opinion."""
    after = dict(streaks)
    for key in set(measured):
        before = streaks.get(key)
        count = before.sweeps if before is not None else 0
        after[key] = Streak(count + 1 if key in named else 0, at)
    return after
