"""Verdicts on the streams issue 45's review found failing, through `netmon replay`'s engine
with the default policy: heavy-tailed noise, two NCCL algorithms, a series born cut, an
upgrade followed by a decline. Seeds start at 201 (bench/verdict_streams.py's table uses 1 up,
tests/test_verdict_streams.py 101 up); one result a minute and 5 % noise, as the review's.
bench/verdict_streams.py runs the same rows over many seeds and simulated series-years, and
docs/SIGNAL.md ("The false-alarm budget") has the figures.
"""

from __future__ import annotations

import math
import random
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import streams as s

from netmon.baseline import BaselinePolicy
from netmon.serve import replay

H = 3600.0
SEED = 201


def verdicts(results: list[dict[str, Any]]) -> list[replay.Replayed]:
    parsed = [replay.parse_result(r, f"result {i}") for i, r in enumerate(results)]
    return list(replay.replay(parsed, BaselinePolicy()))


def index_at(results: list[dict[str, Any]], seconds: float) -> int:
    return next(i for i, r in enumerate(results) if r["t"] - s.T0 >= seconds)


@pytest.mark.parametrize("rate", [0.02, 0.05])
def test_a_heavy_tail_of_outliers_never_holds_a_degraded_episode(rate: float) -> None:
    """A noisy neighbour: 2 % (then 5 %) of results at 0.3-0.6x, a week. Before, 3 of 5 low
    turned the verdict and 4 bad in 20 turned flapping, and either held 20 results: pages every
    few days. A turn now needs the level, an episode the next results do not bear out clears
    within `of` results, and flapping is judged against the series' own rate of bad results."""
    rng = random.Random(f"heavy/{SEED}/{rate}")
    shape = s.Shape(s.flat, s.outliers(rate, 0.3, 0.6, rng))
    flags = [r.verdict.degraded for r in verdicts(list(s.stream(shape, SEED, 7, rng=rng)))]
    assert max(s.episodes(flags), default=0) < 10
    assert sum(flags) / len(flags) < 0.001


def test_two_levels_at_random_are_healthy_and_a_cut_on_both_is_flagged() -> None:
    """Each result at 1.0x or 0.8x at random (NCCL's tuner between two algorithms), 3 days,
    then both cut by 25 %. Before, learning dropped the lower level, the expected level sat
    near the upper one and the lower one on its line: 5-6 % degraded, episodes up to 116 min."""
    rng = random.Random(f"bimodal/{SEED}")
    start = 72 * H
    fault = s.both(s.bimodal(0.8, rng), s.held(0.25, start, 6))
    results = list(s.stream(s.Shape(s.flat, fault), SEED, (start + 6 * H) / 86400, rng=rng))
    out = verdicts(results)
    begin = index_at(results, start)
    healthy = [r.verdict.degraded for r in out[:begin]]
    assert sum(healthy) / len(healthy) < 0.01
    assert max(s.episodes(healthy), default=0) < 10
    during = [r.verdict.degraded for r in out[begin:]]
    assert during.index(True) < 20  # bench: median 8 results, 83 % within 10
    assert sum(during) / len(during) >= 0.95


@pytest.mark.parametrize("first", [3, 6])
def test_a_series_born_cut_is_flagged_and_never_learned_as_normal(first: int) -> None:
    """A new series cut by 25 % from its result `first` (results 1-2 settle), held 30 h.
    Before, its first results were learned unchecked: flagged in 0 of 40 seeds from result 3.
    From 3, only its settling results were at the healthy level (a cold run is slower, never
    faster); from 6, three learned ones were."""
    for seed in range(SEED, SEED + 5):
        rng = random.Random(f"young/{seed}/{first}")
        shape = s.Shape(s.flat, s.held(0.25, (first - 1) * 60, 30))
        out = verdicts(list(s.stream(shape, seed, 30 / 24, rng=rng)))
        flag = next(i for i, r in enumerate(out) if r.verdict.degraded)
        assert flag < 60, (seed, flag)
        later = [r.verdict.degraded for r in out[flag:]]
        assert sum(later) / len(later) >= 0.99, seed  # held: never accepted as the new level
        # Judged against the level before the cut (its settling or first results: within
        # their noise of 1.0), never the cut's 0.75.
        assert all(
            r.verdict.expected and r.verdict.expected > 0.85 * s.BUSBW for r in out[flag + 1 :]
        )


def test_young_results_say_young_then_healthy() -> None:
    out = verdicts(list(s.stream(s.Shape(s.flat, s.no_fault), SEED, 0.05)))
    states = [r.state for r in out]
    assert states[:2] == ["inconclusive", "inconclusive"]
    assert "young" in states and states[-1] == "healthy"
    assert states.index("healthy") > max(i for i, x in enumerate(states) if x == "young")


def test_a_decline_after_an_upgrade_is_measured_from_the_new_level() -> None:
    """+40 % (a new driver) held 3 days, then -0.5 %/h. Before, the decline was measured from
    the old reference: 72 h and 36 % lost without a verdict."""
    rng = random.Random(f"upgrade/{SEED}")
    at, hold = 30 * H, 72 * H
    shape = s.Shape(s.flat, s.upgrade(0.4, at, hold, 0.005))
    results = list(s.stream(shape, SEED, (at + hold + 34 * H) / 86400, rng=rng))
    out = verdicts(results)

    def loss(i: int) -> float:
        return max(0.0, 0.005 * (float(results[i]["t"]) - s.T0 - at - hold) / H)

    first = next(i for i, r in enumerate(out) if r.verdict.degraded)
    assert 0.08 <= loss(first) < 0.15, loss(first)
    reference = out[first].verdict.reference
    assert reference is not None and reference > 1.3 * s.BUSBW  # it followed the upgrade


def wandering(t: float) -> float:
    """A series that wanders +-6 % over eight hours, its first day 8 % over where it centres
    since, with one trough 17 % under that centre on day 6 (a slow dip over eight hours): a slow
    wander's first day sets a reference it then runs 20 % under (AR(1), sd 5 %, six hours:
    about 1.5 episodes of hours a series-year before, bench/false_alarms.py)."""
    if 128 * H <= t < 136 * H:  # down and back up over eight hours, as a wander goes
        return 1 - 0.17 * math.sin(math.pi * (t - 128 * H) / (8 * H))
    return (1.08 if t < 24 * H else 1.0) + 0.06 * math.sin(2 * math.pi * t / (8 * H))


def test_a_slow_wander_under_its_first_days_level_is_healthy_and_a_deep_cut_is_not() -> None:
    """The wander's trough is 23 % under its first day's level and 17 % under where its hours
    centre since: healthy, judged against the trough those hours imply, not the first day's.
    A cut of 30 % from the centre after it is flagged within 10 results and held."""
    start = 150 * H
    shape = s.Shape(wandering, s.held(0.30, start, 3))
    results = list(s.stream(shape, SEED, (start + 3 * H) / 86400, noise=0.02))
    out = verdicts(results)
    begin = index_at(results, start)
    flags = [r.verdict.degraded for r in out]
    assert max(s.episodes(flags[:begin]), default=0) < 10, s.episodes(flags[:begin])
    flag = flags[begin:].index(True) + 1
    assert flag <= 10, flag
    assert sum(flags[begin + flag :]) / len(flags[begin + flag :]) > 0.95


def test_a_latency_given_as_time_s_is_replayed_and_its_doubling_flagged() -> None:
    """8 B all_reduce given as seconds per op (`time_s`), its time doubled for an hour after a
    healthy day, judged by the default policy (latency_ratio 0.6: docs/SIGNAL.md, "Latency").
    Before, replay took busbw only, and latency-bound sizes were never judged by default."""
    rng = random.Random(f"latency/{SEED}")
    start = 26 * H
    shape = s.Shape(s.flat, s.held(0.5, start, 1))  # the rate halves: the time doubles
    results = []
    for r in s.stream(shape, SEED, (start + 2 * H) / 86400, rng=rng):
        size, ranks = 8, 8
        result = {
            **r,
            "probe": "small",
            "size": size,
            "ranks": ranks,
            "time_s": 3e-5 * s.BUSBW / r["busbw"],
        }
        del result["busbw"]
        results.append(result)
    parsed = [replay.parse_result(r, f"result {i}") for i, r in enumerate(results)]
    out = list(replay.replay(parsed, BaselinePolicy()))
    assert out[0].record()["time_s"] == results[0]["time_s"]  # printed back
    # algbw x nccl-tests' bus factor 2 (n - 1) / n, as for a measured result
    assert out[0].record()["busbw"] == pytest.approx(8 / results[0]["time_s"] * 2 * 7 / 8)
    begin, end = index_at(results, start), index_at(results, start + H)
    during = [r.verdict.degraded for r in out[begin:end]]
    assert during.index(True) < 10
    assert sum(during) / len(during) >= 0.9
    assert not any(r.verdict.degraded for r in out[:begin])


def test_a_result_with_both_busbw_and_time_s_is_refused_in_one_line() -> None:
    base = {"t": 1, "probe": "small", "op": "all_reduce", "size": 8, "ranks": 8, "path": "x"}
    with pytest.raises(ValueError, match="busbw or time_s, not both"):
        replay.parse_result({**base, "busbw": 1.0, "time_s": 1e-5}, "stream:1")
    with pytest.raises(ValueError, match="time_s must be a positive number"):
        replay.parse_result({**base, "time_s": 0}, "stream:1")


def test_a_series_found_born_cut_stays_degraded_across_a_restart() -> None:
    """Found against its settling results, a cut series has learned nothing: without its seed
    in the state file, a restart sent it back to learning, and it learned the cut (found by
    the review of this change: 0 of 300 results degraded after the restart)."""
    import json

    from netmon.baseline import BaselineBook

    key = ("large", "all_reduce", 256 << 20, "default", 8)
    book = BaselineBook(BaselinePolicy())
    levels = [1.0, 1.02, 0.98] + [0.7] * 10
    for i, level in enumerate(levels):
        before = book.observe(key, level * s.BUSBW, at=s.T0 + 60 * i)
    assert before.degraded
    book = BaselineBook.from_json(json.loads(json.dumps(book.to_json())), BaselinePolicy())
    after = [book.observe(key, 0.7 * s.BUSBW, at=s.T0 + 60 * (20 + i)) for i in range(300)]
    assert all(v.degraded for v in after)
