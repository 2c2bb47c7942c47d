"""The figures a track keeps beside its state (netmon.baseline.memo) are the ones it would
compute afresh, after every result of streams that learn, cut, accept a step and restart; and
robust.spread, which takes one sort where it took two, gives statistics.median's MAD bit for bit;
and a window kept in order as it moves (netmon.baseline.ordered) is the window sorted anew.
"""

from __future__ import annotations

import dataclasses
import random
import statistics
import sys
import tempfile
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest

from netmon.baseline import BaselinePolicy, robust
from netmon.baseline.memo import Counted, keyed_on
from netmon.baseline.ordered import Ordered
from netmon.baseline.reference import (
    UPPER_Q90_SIGMAS,
    WANDER_HOURS,
    WANDER_HOURS_MIN,
    Reference,
)
from netmon.baseline.track import Track
from netmon.serve import replay

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import streams as s


def mad(values: list[float]) -> float:
    """The spread as robust.spread computed it before: two statistics.median calls."""
    if len(values) < 2:
        return 0.0
    centre = statistics.median(values)
    return robust.MAD_TO_SIGMA * float(statistics.median(abs(v - centre) for v in values))


def test_spread_is_the_two_median_mad_bit_for_bit_on_random_sequences() -> None:
    rng = random.Random(7)
    draws: list[Callable[[], float]] = [
        lambda: rng.gauss(100e9, 5e9),
        lambda: float(rng.randint(0, 4)),  # ties, and the centre among them
        lambda: rng.random() * 10 ** rng.randint(-6, 12),
        lambda: rng.choice([0.0, 1e-300, 1.0, 3.5, 1e300]),
    ]
    for trial in range(4000):
        values = [draws[trial % 4]() for _ in range(rng.randint(0, 80))]
        assert robust.spread(values).hex() == mad(values).hex(), values


def week_wander(reference: Reference) -> float:
    """Reference.wander() from its definition: the day's spread, or the upper tail's of a
    week's hours where wider."""
    medians = [m for _, m in reference.hours.done]
    if len(medians) < WANDER_HOURS_MIN:
        return reference.spread
    upper = robust.quantile(medians, 0.9) - robust.median(medians)
    return max(reference.spread, upper / UPPER_Q90_SIGMAS)


def cached_and_afresh(track: Track, policy: BaselinePolicy) -> list[tuple[object, object]]:
    """Each kept figure of `track`, and the same figure computed afresh: by the plain method,
    and from the windows sorted anew (not the orders the track keeps as they move)."""
    plain: Any = Track  # the undecorated methods, through functools.wraps' __wrapped__
    fresh = dataclasses.replace(track.reference)  # the same fields, nothing kept yet
    learned, full = track.learned_values(), len(track.learned) >= policy.min_samples
    long_full = len(track.long) == policy.long_window
    return [
        (track.spread(), plain.spread.__wrapped__(track)),
        (track.spread(), robust.spread(learned)),
        (track.long_level(policy), plain.long_level.__wrapped__(track, policy)),
        (track.long_level(policy), robust.midmean(track.long) if long_full else None),
        (track.reference.wander(), week_wander(track.reference)),
        (track.reference.centre(), fresh.centre()),
        (track.reference.floor(), fresh.floor()),
        (track.baseline(policy), plain.baseline.__wrapped__(track, policy)),
        (track.baseline(policy), robust.trimmed_mean(learned, 0.1, 1) if full else None),
        (track.recent_level(policy), plain.recent_level.__wrapped__(track, policy)),
    ]


@pytest.mark.parametrize(
    "argv",
    [
        ["step", "--depth", "0.15", "--start-hours", "26"],  # accepted: a rebase clears windows
        ["cut", "--restart", "--start-hours", "30", "--hours", "8"],  # the state file read back
        ["flap", "--start-hours", "30", "--hours", "6", "--swing", "0.1"],
        # Nine days: the week of hours kept lets its oldest go, hour by hour.
        ["wander", "--days", "9", "--timescale-hours", "6"],
    ],
)
def test_kept_figures_equal_the_figures_computed_afresh_after_every_result(
    argv: list[str],
) -> None:
    # Every 5 minutes for 3 days: the reference matures after a day and reads its hours'
    # wander after two.
    results = [
        replay.parse_result(r, f"result {i}")
        for i, r in enumerate(s.main_stream(["--days", "3", *argv, "--interval", "300"]))
    ]
    policy = BaselinePolicy()
    with tempfile.TemporaryDirectory() as state:
        replayer = replay.Replayer(policy, {}, Path(state))
        wandered = accepted = False
        for result in results:
            replayer.feed(result)
            track = replayer.book._tracks[result.key]
            for kept, afresh in cached_and_afresh(track, policy):
                assert kept == afresh, (result.t, kept, afresh)
            wandered = wandered or len(track.reference.hours.done) >= 48
            accepted = accepted or track.accepted is not None
    assert wandered  # the wander was read from the hours, not the day's spread alone
    assert accepted or argv[0] != "step"  # the step's stream exercises a rebase
    # The wander's stream let its oldest hours go (kept figures keyed on the hours' ends).
    assert argv[0] != "wander" or len(track.reference.hours.done) == WANDER_HOURS


class Window:
    def __init__(self, values: deque[float] | None = None) -> None:
        self.values: deque[float] = deque(maxlen=3) if values is None else values
        self.calls = 0

    @keyed_on("values")
    def total(self, scale: object) -> float:
        self.calls += 1
        return sum(self.values) * (2.0 if scale == "double" else 1.0)


@pytest.mark.parametrize("values", [deque(maxlen=3), Counted(maxlen=3)], ids=["plain", "counted"])
def test_a_kept_figure_follows_any_change_in_place_and_other_arguments(
    values: deque[float],
) -> None:
    window, once, twice = Window(values), "once", "double"
    window.values.extend([1.0, 2.0])
    assert window.total(once) == 3.0 and window.total(once) == 3.0 and window.calls == 1
    window.values.append(4.0)  # in place, as the rule appends
    assert window.total(once) == 7.0 and window.calls == 2
    window.values[0] = 5.0  # any change of a value, not only an append
    assert window.total(once) == 11.0 and window.calls == 3
    assert window.total(twice) == 22.0 and window.calls == 4  # another argument
    window.values.clear()
    assert window.total(twice) == 0.0 and window.calls == 5


def test_a_window_kept_in_order_is_the_window_sorted_anew_whatever_moved_it() -> None:
    rng = random.Random(11)
    odd = [0.0, -0.0, float("nan"), 1.0, 2.0]  # zeros and NaNs are sorted anew; ties kept
    for _ in range(600):
        window: deque[float] = deque(maxlen=rng.choice([1, 3, 9, 60]))
        ordered = Ordered()
        for _ in range(150):
            move = rng.random()
            if move < 0.85:  # the rule's move: one append, the oldest dropped when full
                window.append(rng.choice(odd) if rng.random() < 0.05 else rng.random())
            elif move < 0.9 and window:
                window.popleft()
            elif move < 0.95:
                window.clear()  # a rebase
            else:
                window.extend(rng.random() for _ in range(rng.randint(0, 3)))  # a load
            values = list(window)
            kept, afresh = ordered.of(values), sorted(values)
            assert [v.hex() for v in kept] == [v.hex() for v in afresh], (values, kept)


# What a deque offers that reads it and changes nothing; anything else it has changes it, and
# must be counted (a Python that adds a method to deque fails here until it is).
READS = {
    "copy", "count", "index", "maxlen", "__add__", "__bool__", "__class_getitem__",
    "__contains__", "__copy__", "__eq__", "__ge__", "__getitem__", "__gt__", "__hash__",
    "__iter__", "__le__", "__len__", "__lt__", "__mul__", "__ne__", "__reduce__",
    "__repr__", "__reversed__", "__rmul__", "__sizeof__", "__init__", "__new__",
    "__class__", "__doc__", "__getattribute__", "__subclasshook__",
}  # fmt: skip


def test_a_counted_window_counts_every_change_a_deque_can_make() -> None:
    changes = {n for n in vars(deque) if n not in READS and callable(getattr(deque, n))}
    assert changes, "deque's own methods were read"
    for name in sorted(changes):
        assert getattr(Counted, name) is not getattr(deque, name), f"{name} is not counted"
    moves: list[Callable[[deque[float]], object]] = [
        lambda d: d.append(4.0), lambda d: d.appendleft(4.0), lambda d: d.extend([4.0]),
        lambda d: d.extendleft([4.0]), lambda d: d.pop(), lambda d: d.popleft(),
        lambda d: d.remove(2.0), lambda d: d.insert(1, 4.0), lambda d: d.rotate(1),
        lambda d: d.reverse(), lambda d: d.clear(), lambda d: d.__setitem__(0, 4.0),
        lambda d: d.__delitem__(0), lambda d: d.__iadd__([4.0]), lambda d: d.__imul__(2),
        lambda d: cast(Any, d).__init__([4.0]),
    ]  # fmt: skip
    for move in moves:
        window = Window(Counted([1.0, 2.0, 3.0], maxlen=4))
        before = window.total("once")
        move(window.values)
        assert window.total("once") == sum(window.values) and window.calls == 2, before
