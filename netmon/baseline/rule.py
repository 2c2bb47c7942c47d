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
from dataclasses import replace

from netmon.baseline import robust
from netmon.baseline.lines import Lines
from netmon.baseline.policy import BaselinePolicy
from netmon.baseline.track import BAD, BETWEEN, HEALTHY, LOW, NOISY, Track, usable
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
) -> Verdict:
    """One result of the track's series: inconclusive, learned, shown, or judged."""
    is_usable = usable(busbw)
    track.seen += 1
    baseline, expected = track.baseline(policy), track.expected(policy)
    ratio = busbw / expected if expected is not None and is_usable else None
    was = track.degraded
    reason = inconclusive(track, policy, cv, foreign_cpu, is_usable)
    if reason is not None:
        if reason == "noisy" and baseline is not None and policy.judges(size):
            # Evidence of an intermittent fault, though not a figure to judge a level by.
            track.flaps.append(NOISY)
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
    if baseline is None:
        # Learning: nothing to compare with, so no low flags and no verdict yet.
        if is_usable:
            track.learn(busbw, cv, at, policy)
        formed = track.expected(policy)
        return track.verdict(policy, size, busbw / formed if formed and is_usable else None)
    lines = track.lines(policy, size)
    assert lines is not None  # a baseline exists
    if policy.judges(size):
        # Reported against the baseline it was judged by, not the one it may have moved.
        return replace(judge(track, policy, size, busbw, cv, lines, at), baseline=baseline)
    track.set_conditions(set(), at)  # a verdict from a policy that judged this size
    if is_usable:  # shown, never paged on: the plain median of its recent results
        track.learn(busbw, cv, at, policy)
    return replace(track.verdict(policy, size, ratio, lines), baseline=baseline)


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
) -> Verdict:
    """One conclusive result of a judged size against its lines: count it, turn or hold the
    verdict, then learn from it if it is healthy and the series is not degraded."""
    is_usable = usable(busbw)
    low = not is_usable or busbw < lines.low
    healthy = is_usable and busbw >= lines.healthy
    track.recent.append(low)
    track.healthy.append(healthy)
    track.recent_values.append(busbw if is_usable else None)
    track.flaps.append(LOW if low else HEALTHY if healthy else BETWEEN)
    was = track.degraded
    _turn(track, policy, size, lines, at)
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
    if healthy and not track.degraded and steady and _within_band(busbw, level, lines):
        track.learn(busbw, cv, at, policy)
    if not track.degraded:
        track.raise_accepted(policy)
    return track.verdict(
        policy,
        size,
        busbw / lines.expected if is_usable else None,
        lines,
        changed=track.degraded != was,
    )


def _turn(track: Track, policy: BaselinePolicy, size: int, lines: Lines, at: float) -> None:
    """Turn or clear each condition on this result, then accept a loss held within the
    tolerance for long enough. Between turning and clearing a condition holds."""
    conditions = set(track.conditions)
    level = track.recent_level(policy)
    if conditions:
        track.since += 1
    if not conditions & AGAINST_BASELINE:
        if sum(track.recent) >= policy.trigger:
            conditions.add("low")
        elif level is not None and level < lines.level:
            conditions.add("drift")
    elif sum(track.healthy) >= policy.trigger and _back(track, policy, lines.clear):
        conditions -= AGAINST_BASELINE
    _flapping(track, policy, conditions, level is not None and level >= lines.clear)
    within = _decline(track, policy, size, level, conditions)
    # Within the tolerance: the recent level over its line, the long level over the
    # reference's tolerance, no flapping. Held for accept_after results, and steady over
    # hours, the loss is the series' new level (a healthy step down): the verdict cannot
    # stick on it for ever.
    within = within and level is not None and level >= lines.level
    if conditions - {"flapping"} and "flapping" not in conditions and within:
        track.tolerated += 1
    else:
        track.tolerated = 0
    if track.tolerated >= policy.accept_after and track.steady(policy):
        conditions -= {*AGAINST_BASELINE, "decline"}
        track.rebase(policy)
        track.tolerated = 0
    track.set_conditions(conditions, at)


def _flapping(track: Track, policy: BaselinePolicy, conditions: set[str], level_ok: bool) -> None:
    """Flapping: at least flap_trigger of the last flap_window results low or noisy, half of
    them low, spread over both halves of the window and a low one among its newest quarter,
    while as many were healthy and the recent level is back over its clearing line
    (`level_ok`). Noisy results alone are not flapping: a healthy series has a few. A held cut
    (a low level) and the repair after it (its newest results good) are not either: `low` and
    `drift` judge those. Over when at most one was bad, none was healthy, or the recent level
    is under its clearing line (a fault that holds: `low` and `drift` name it better)."""
    flags = list(track.flaps)
    bad = sum(f in BAD for f in flags)
    good = sum(f == HEALTHY for f in flags)
    if "flapping" not in conditions:
        half, quarter = len(flags) // 2, max(len(flags) // 4, 1)
        older = sum(f in BAD for f in flags[:half])
        spread_out = min(older, bad - older) >= policy.flap_trigger / 2
        lows = flags.count(LOW) >= policy.flap_trigger / 2
        ongoing = LOW in flags[-quarter:]
        counts = bad >= policy.flap_trigger and good >= policy.flap_trigger
        if counts and lows and spread_out and ongoing and level_ok:
            conditions.add("flapping")
    elif bad <= 1 or good == 0 or not level_ok:
        conditions.discard("flapping")


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
    held = track.below >= policy.decline_hold or level < lines.tolerance
    if held and recent < lines.decline:
        conditions.add("decline")
    elif _back(track, policy, lines.back):
        conditions.discard("decline")
    # Within by more than the long level's own noise (three standard errors of its median): a
    # loss right at the tolerance (a 20 % cut at ratio 0.8) is on the line, never accepted.
    noise = 3 * robust.MEDIAN_SE * track.spread() / math.sqrt(len(track.long))
    return level >= lines.tolerance + noise


def _within_band(busbw: float, level: float | None, lines: Lines) -> bool:
    """Whether a healthy result is learned: as far over the expected level as the healthy line
    is under it, or higher while the recent level is over the expected level too (the series
    runs higher: a repair, a faster path). Results under the healthy line are never learned, so
    learning every result over it would raise the baseline on a wide spread with a long upper
    tail (a busy 2-core host at 1 MiB: quiet results of 0.32-1.5 GB/s around 0.45, the baseline
    climbed to 0.57 and the low line over a third of healthy results: bench/noise_bench.py)."""
    ceiling = 2 * lines.expected - lines.healthy
    return busbw <= ceiling or level is None or level >= lines.expected
