"""The rule that judges each result of a series (docs/SIGNAL.md, "The rule").

Four ways to be degraded, each with its own way back:
- `low`: M of the last N results under the low line of the expected level (a cut);
- `drift`: the recent level (median of the last 9) under its line (a cut hidden in noise);
- `flapping`: k of the last F results low or noisy, spread among healthy ones (an
  intermittent fault that no majority rule sees);
- `decline`: the long level (median of the last 120) under the reference's line: a slow loss
  that the rolling baseline follows, or a cumulative one beyond the tolerance.
A loss within the tolerance held for `accept_after` results and steady over hours is accepted
(the verdict clears and the baseline starts from the new level); a loss beyond it never is.

Pure logic: no clock, no I/O.
"""

from __future__ import annotations

import math

from netmon.baseline import robust
from netmon.baseline.lines import Lines
from netmon.baseline.policy import BaselinePolicy
from netmon.baseline.track import (
    BETWEEN,
    HEALTHY,
    LOW,
    NOISY,
    YOUNG_AFTER,
    YOUNG_BEFORE,
    Track,
    bad_count,
    usable,
)
from netmon.baseline.verdict import Verdict

# Why a result was neither judged nor learned (netmon_inconclusive_results_total's reasons).
INCONCLUSIVE_REASONS = ("settling", "disturbed", "noisy")
# Against the baseline: these clear together, on healthy results with the level back.
AGAINST_BASELINE = {"low", "drift"}


def step(
    track: Track,
    policy: BaselinePolicy,
    size: int,
    busbw: float,
    cv: float,
    foreign_cpu: float | None,
    at: float,
    expect: float | None = None,
) -> Verdict:
    """One result of the track's series: inconclusive, learned, shown, or judged. `expect` is
    the busbw a healthy series of this key reaches at least (expect:, the shipped table)."""
    is_usable = usable(busbw)
    track.seen += 1
    track.outside = expect / policy.ratio_for(size) if expect and policy.judges(size) else None
    baseline = track.baseline(policy)
    was = track.degraded
    reason = inconclusive(track, policy, cv, foreign_cpu, is_usable)
    if reason == "settling" and is_usable and not track.learned and track.seed is None:
        track.settled.append(busbw)
    # The level expected before this result, for the ratio of one inconclusive or only shown
    # (a judged result's is to its lines, drawn once it is in the recent level): the daemon's
    # costliest figure, not taken where it is not reported.
    expected = track.expected(policy) if reason or not policy.judges(size) else None
    ratio = busbw / expected if expected is not None and is_usable else None
    if reason is not None:
        if reason == "noisy" and baseline is not None and policy.judges(size):
            # Evidence of an intermittent fault, though not a figure to judge a level by.
            track.count_flag(NOISY, policy)
            conditions = set(track.conditions)
            level, lines = track.recent_level(policy), track.lines(policy, size)
            _flapping(track, policy, conditions, bool(level and lines and level >= lines.clear))
            track.set_conditions(conditions, at)
        return track.verdict(
            policy, size, ratio, inconclusive=reason, changed=track.degraded != was
        )
    track.judged_at = at
    track.level.append(busbw if is_usable else 0.0)
    track.long.append(busbw if is_usable else 0.0)
    if is_usable:
        track.trend.add(busbw, at, keep=policy.steady_hours)
    expected = track.expected(policy)  # the level appended above does not move it
    if expected is None:
        # Learning: nothing to compare with, so no low flags and no verdict yet.
        if is_usable:
            track.learn(busbw, cv, at, policy)
            track.saw_young(busbw)
            _check_young(track, policy, size, at)
        formed = track.expected(policy)
        return track.verdict(policy, size, busbw / formed if formed and is_usable else None)
    lines = track.lines_at(policy, size, expected)
    if policy.judges(size):
        # Reported against the baseline it was judged by, not the one it may have moved.
        return judge(track, policy, size, busbw, cv, lines, at, baseline)
    track.set_conditions(set(), at)  # a verdict from a policy that judged this size
    if is_usable:  # shown, never paged on: the plain median of its recent results
        track.learn(busbw, cv, at, policy)
    return track.verdict(policy, size, ratio, lines, baseline)


def inconclusive(
    track: Track, policy: BaselinePolicy, cv: float, foreign_cpu: float | None, is_usable: bool
) -> str | None:
    """Why this result can say nothing about the link's level, or None."""
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
    track: Track,
    policy: BaselinePolicy,
    size: int,
    busbw: float,
    cv: float,
    lines: Lines,
    at: float,
    baseline: float | None = None,
) -> Verdict:
    """One conclusive result of a judged size against its lines: count it, turn or hold the
    verdict, then learn from it if it is healthy and the series is not degraded. The verdict
    reports `baseline` (the one the result was judged by), or the track's."""
    is_usable = usable(busbw)
    low = not is_usable or busbw < lines.low
    healthy = is_usable and busbw >= lines.healthy
    track.recent.append(low)
    track.healthy.append(healthy)
    track.recent_values.append(busbw if is_usable else None)
    track.count_flag(LOW if low else HEALTHY if healthy else BETWEEN, policy)
    was = track.degraded
    _turn(track, policy, size, lines, at)
    # A degraded link must never become the new normal: learn only results within the band
    # around the expected level (from the low line up, as far over it), on a series that is
    # healthy now (the result that clears a degradation counts), and not while the recent
    # level is well under the expected level: the top of a cut's spread would be learned,
    # result by result, before the verdict turns (measured on a recording whose level ran
    # 10-15 % higher in its second half: the baseline fell from 1.05x to 0.8x). Halfway
    # between the drift line and the clearing line: higher, healthy noise would stop learning
    # in its own low stretches and bias the baseline up.
    level = track.recent_level(policy)
    steady = level is None or level >= _steady_line(lines)
    if track.young(policy):
        # Young: learned at once, within the band and not low (the baseline is a mean of few
        # results: a low one would pull it onto a cut, one from a long upper tail lift it over
        # the series: a busy 2-core host at 1 MiB, one quiet 1.54 GB/s among 0.45s took it
        # from 0.52 to 0.61 and the level line over the series' own median); and every usable
        # one, low ones too, goes to the young check, which looks for a cut among them.
        if is_usable:
            track.saw_young(busbw)  # degraded or not: the check may still find the level before
        if is_usable and not track.degraded and not low and _within_band(busbw, level, lines):
            track.learn(busbw, cv, at, policy)
        _check_young(track, policy, size, at)
    elif not low and not track.degraded and _within_band(busbw, level, lines):
        track.pending.append((busbw, cv, at))
    _release(track, policy, steady)
    stale = False
    if not track.degraded:
        track.raise_accepted(policy)
        stale = track.follow_upgrade(policy, size)
    return track.verdict(
        policy,
        size,
        busbw / lines.expected if is_usable else None,
        lines,
        baseline,
        changed=track.degraded != was,
        reference_stale=stale,
    )


def _turn(track: Track, policy: BaselinePolicy, size: int, lines: Lines, at: float) -> None:
    """Turn or clear each condition on this result, then accept a loss held within the
    tolerance for long enough. Between turning and clearing a condition holds."""
    conditions = set(track.conditions)
    level = track.recent_level(policy)
    if conditions:
        track.since += 1
        _hold(track, policy, lines)
    turn = None
    if not conditions & AGAINST_BASELINE:
        turn = _against_baseline(track, policy, size, level, lines)
        if turn:
            conditions.add(turn)
    elif sum(track.healthy) >= policy.trigger and _back(track, policy, lines.clear):
        conditions -= AGAINST_BASELINE
    _flapping(track, policy, conditions, level is not None and level >= lines.clear)
    within = _decline(track, policy, size, level, conditions)
    # Within the tolerance: the recent level over its line, the long level over the
    # reference's tolerance, no flapping. Held for accept_after results, and steady over
    # hours, the loss is the series' new level (a healthy step down): the verdict cannot
    # stick on it for ever.
    # A series whose first results showed a cut (its seed) never accepts a level under it.
    seeded = track.seed is None or (
        level is not None and level >= _young_ratio(policy, size) * track.seed
    )
    within = within and level is not None and level >= lines.level and seeded
    if conditions - {"flapping"} and "flapping" not in conditions and within:
        track.tolerated += 1
    else:
        track.tolerated = 0
    if track.tolerated >= policy.accept_after and track.steady(policy):
        conditions -= {*AGAINST_BASELINE, "decline"}
        track.rebase(policy, size)
        track.tolerated = 0
    was = track.degraded
    track.set_conditions(conditions, at)
    if turn and not was:
        track.held = _held_at_turn(policy, size, level, lines)


def _against_baseline(
    track: Track, policy: BaselinePolicy, size: int, level: float | None, lines: Lines
) -> str | None:
    """`low` when M of the last N results are low and the recent level is under its line too,
    `drift` when only the level is; None otherwise. M low results alone do not turn the
    verdict once the level is known: a heavy-tailed series (2 % of its results at 0.3-0.6x, a
    noisy neighbour) has 3 of 5 low about once a week by chance, 5 of 9 (which the median
    needs) about once in 5 years; a cut moves the level 2 results after it moves 3 of 5.
    The level is under its line when the mean of its results floored at floor x the expected
    level is (floored, so that a few outliers cannot pull the mean down alone: with the floor
    at 0.7, 7 of 9 must be that low to take it under 0.8), or when its median is and the mean
    of its newest `of` results is under the steady line (none counted over the expected
    level: the recorded stream's fast results at 1.6x held a 40 % cut's turn back by three).
    A median of a few results jumps from one level to the other on a series with two (NCCL
    switching between two algorithms): five of nine on a lower level at 0.80-0.83x, scattered
    among the upper ones, put it under the line about 9 times a series-year
    (bench/false_alarms.py, class `edge`), each turn held for a baseline window. A cut moves
    the newest results first, all of them: the median of nine turns on its fifth result as
    before, a mixture's scattered lower results rarely do."""
    low = sum(track.recent) >= policy.trigger
    if level is None:
        return "low" if low else None
    floored = track.floored_mean(policy.floor_for(size) * lines.expected)
    if floored < lines.level or (level < lines.level and _newest_agree(track, policy, lines)):
        return "low" if low else "drift"
    return None


def _newest_agree(track: Track, policy: BaselinePolicy, lines: Lines) -> bool:
    """Whether the newest `of` results of the recent level are low together: their mean, none
    counted over the expected level, under the steady line."""
    return track.newest_mean(policy.of, lines.expected) < _steady_line(lines)


def _steady_line(lines: Lines) -> float:
    """Halfway between the recent level's line and the clearing line: a recent level over it
    holds steady (learning goes on), and a recent level whose mean is not under it has not
    left the series' healthy range, whatever its median says."""
    return (lines.level + lines.clear) / 2


def _held_at_turn(policy: BaselinePolicy, size: int, level: float | None, lines: Lines) -> bool:
    """Whether a new degradation holds from its turn: its recent level is over the floor, a
    level a cut settles at (a 25 % cut reads 0.75x) and few outliers make (five of nine
    results at 0.3-0.6x put the median under 0.7x). Only a turn at a level that deep may clear
    as soon as its next results are back; a shallow one waits for a baseline window of them,
    as a burst of fast results inside a held cut (the recorded stream runs 1.2-1.3x its median
    for ten results: cut to 0.75x, 0.9x) must not clear it."""
    return level is not None and level >= policy.floor_for(size) * lines.expected


def _hold(track: Track, policy: BaselinePolicy, lines: Lines) -> None:
    """The degradation has held once `of` results since the turn have their median under the
    clearing line: from then on it clears only on a baseline window of results back."""
    since = track.since_level(policy, policy.of)
    if since is not None and since < lines.clear:
        track.held = True


def _flapping(track: Track, policy: BaselinePolicy, conditions: set[str], level_ok: bool) -> None:
    """Flapping: at least flap_trigger of the last flap_window results low or noisy, half of
    them low, spread over both halves of the window and a low one among its newest quarter,
    while as many were healthy and the recent level is back over its clearing line
    (`level_ok`). Noisy results alone are not flapping: a healthy series has a few. A held cut
    (a low level) and the repair after it (its newest results good) are not either: `low` and
    `drift` judge those. Over when at most one was bad, none was healthy, or the recent level
    is under its clearing line (a fault that holds: `low` and `drift` name it better)."""
    flags = list(track.flaps)
    bad = bad_count(flags)
    good = flags.count(HEALTHY)
    if "flapping" not in conditions:
        half, quarter = len(flags) // 2, max(len(flags) // 4, 1)
        older = bad_count(flags[:half])
        spread_out = min(older, bad - older) >= policy.flap_trigger / 2
        lows = flags.count(LOW) >= policy.flap_trigger / 2
        ongoing = LOW in flags[-quarter:]
        counts = bad >= _bad_needed(track, policy) and good >= policy.flap_trigger
        if counts and lows and spread_out and ongoing and level_ok:
            conditions.add("flapping")
    elif bad <= 1 or good == 0:
        conditions.discard("flapping")
    elif not level_ok:
        # The level fell under the clearing line: a fault that holds, which `drift` names
        # (and clears as it does); never a gap of healthy results between the two.
        conditions.discard("flapping")
        conditions.add("drift")


def _bad_needed(track: Track, policy: BaselinePolicy) -> int:
    """How many bad results of a full flapping window are flapping on this series: at least
    flap_trigger, and so many that its own rate of bad results makes them that unlikely."""
    return max(
        policy.flap_trigger,
        robust.binomial_needed(policy.flap_window, track.bad_rate(policy), policy.flap_alpha),
    )


def _back(track: Track, policy: BaselinePolicy, line: float) -> bool:
    """Whether the recent level and the back level are both over `line`: the series is back."""
    level, back = track.recent_level(policy), track.back_level(policy)
    return level is not None and back is not None and level >= line and back >= line


def _decline(
    track: Track, policy: BaselinePolicy, size: int, recent: float | None, conditions: set[str]
) -> bool:
    """Turn `decline` when the long level has been under the reference's line for
    decline_hold results in a row (at once under the tolerance itself: a wander dips and comes
    back, a decline stays) and the recent level is under it too; clear it once the recent and
    back levels are halfway back to the accepted level (a repair shows there within a baseline
    window; the long level would take half of its own). Whether the long level is within the
    tolerance, by more than its own noise (True while either is not known yet)."""
    level = track.long_level(policy)
    lines = track.reference_lines(policy, size)
    if level is None or lines is None or recent is None:
        return True
    track.below = track.below + 1 if level < lines.decline else 0
    held = track.below >= policy.decline_hold or level < lines.at_once
    if held and recent < lines.decline:
        conditions.add("decline")
    elif _back(track, policy, lines.back):
        conditions.discard("decline")
    # Within by more than the long level's own noise (three standard errors of its median): a
    # loss right at the tolerance (a 20 % cut at ratio 0.8) is on the line, never accepted.
    noise = 3 * robust.MEDIAN_SE * track.spread() / math.sqrt(len(track.long))
    return level >= lines.tolerance + noise


def _check_young(track: Track, policy: BaselinePolicy, size: int, at: float) -> None:
    """While the series is young, look for a cut among its results (a changepoint: the
    results after some point under ratio x those before, each side's centre the mean of its
    middle half) and under its settling results; found, the level before is the series' seed
    and what came after is forgotten, so the cut is judged as one, never learned as normal:
    the series turns degraded (reason low) and holds until its results are back."""
    if not track.young(policy) or not policy.judges(size):
        return
    if policy.window < YOUNG_BEFORE + YOUNG_AFTER:
        return  # a young phase shorter than the check's segments: no check (not by default)
    # _young_ratio: a quarter of the way from the tolerance back to the level before, which is
    # known from 2 or 3 results only (a 25 % cut must not hide in their noise); and no result
    # of what follows may reach the lowest of them, which a healthy series' results do.
    # The settling results count as results before a cut (a cold run is slower, never faster),
    # so a cut at the first usable results is found against them and those before it.
    ratio, values = _young_ratio(policy, size), [*track.settled, *track.young_seen]
    first = min(len(track.settled), YOUNG_BEFORE) if track.settled else YOUNG_BEFORE
    found = _changepoint(values, ratio, first)
    if found is not None:
        _, track.seed = found
        track.keep_first(0)  # judged against the seed alone until results are back at it
        track.young_seen.clear()
        track.pending.clear()
        track.settled.clear()
        # Degraded at once, and held: it clears only on results back at the level before.
        track.set_conditions(track.conditions | {"low"}, at)
        track.held = True


def _young_ratio(policy: BaselinePolicy, size: int) -> float:
    return (1 + 3 * policy.ratio_for(size)) / 4


def _changepoint(values: list[float], ratio: float, first: int) -> tuple[int, float] | None:
    """(where, the level before) of the first cut in `values` after at least `first` of them,
    or None."""
    for split in range(first, len(values) - YOUNG_AFTER + 1):
        if _cut(values[:split], values[split:], ratio):
            return split, robust.midmean(values[:split])
    return None


def _cut(before: list[float], after: list[float], ratio: float) -> bool:
    """Whether `after` is a cut from `before`: its centre (the mean of its middle half) under
    ratio x theirs, and not one of its results as high as the lowest of them. A series with
    two levels (NCCL switching between two algorithms) can have a stretch of the lower one
    after a few of the upper one; after a cut, no result comes back to the level before."""
    if len(after) < YOUNG_AFTER:
        return False
    below, above = robust.midmean(after), robust.midmean(before)
    # And beyond the noise of two small samples (4 standard errors of the difference, the
    # spread read from what follows): at 10 % noise, two settling results 1.8 sd high by chance
    # put 0.85x of them over a healthy level, and a healthy series was found cut (held so for
    # good: it never comes back to a level it never had). A 25 % cut under 5 % noise clears
    # this by 0.1.
    noise = 4 * robust.spread(after) * math.sqrt(1 / len(before) + 1 / len(after))
    beyond = below < ratio * above and above - below > noise
    # Nor within halfway from `ratio` back up to the level before: two settling results on a
    # two-level series' upper level, then its lower one, put every result after under the
    # lowest of them, though the upper level keeps coming back (at 0.96x of them, say).
    return beyond and max(after) < min(min(before), (1 + ratio) / 2 * above)


def _release(track: Track, policy: BaselinePolicy, steady: bool) -> None:
    """Learn the results that waited learn_delay results, while the series is healthy and
    steady; none of them once it turned degraded. A result vouches for the link only once the
    results after it agree: the first results of a cut are within the band of a series with
    a wide spread (two levels, a heavy tail) and, learned at once, would pull its baseline down
    onto the cut before the verdict turns."""
    if track.degraded:
        track.pending.clear()
        return
    while len(track.pending) > policy.learn_delay:
        busbw, cv, at = track.pending.popleft()
        if steady:
            track.learn(busbw, cv, at, policy)


def _within_band(busbw: float, level: float | None, lines: Lines) -> bool:
    """Whether a result that is not low is learned: as far over the expected level as the low
    line is under it, or anything while the recent level itself runs over that (the series
    runs higher: a repair, a faster path, a new driver). The band is symmetric so that what is
    learned is centred on the series, whatever its shape: a ceiling nearer than the low line
    would drop the upper of two levels (NCCL switching algorithms: 1.0x and 0.8x), a floor
    nearer (the healthy line) the lower one, and either pulls the baseline onto one level, whose
    lines the other then sits on; no ceiling would raise the baseline on a long upper tail (a
    busy 2-core host at 1 MiB: quiet results of 0.32-1.5 GB/s around 0.45: bench/noise_bench.py).
    """
    ceiling = 2 * lines.expected - lines.low
    return busbw <= ceiling or (level is not None and level >= ceiling)
