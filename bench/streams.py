"""Synthetic result streams with the shapes production has: a daily swing, a slow wander, a
held cut, a healthy step down, a flapping link, a slow decline (issue 33).

Each stream is a list of results in `netmon replay`'s input format (docs/SIGNAL.md, "Replay"):
one dict per result, `{"t", "probe", "op", "size", "ranks", "path", "busbw"}` plus `"restart":
true` where the daemon restarts before it. The level is a product of the healthy shape (1 +
swing or wander) and the fault (1 - cut), times 1 + noise x z with z standard normal from one
seeded generator.

    python bench/streams.py swing --phase peak --days 7 --seed 3 > swing.jsonl
    python bench/streams.py cut --depth 0.25 --start-hours 30 --hours 24 | netmon replay -

The tests (tests/test_verdict_streams.py) and bench/verdict_streams.py draw from the same shapes.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

BUSBW = 100e9  # bytes/s: a round level, an H100 NVLink all_reduce's order of magnitude
DAY_S = 86400.0
SERIES = {"probe": "large", "op": "all_reduce", "size": 256 << 20, "ranks": 8, "path": "default"}
T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z: the streams' clock starts at a midnight


@dataclass(frozen=True)
class Shape:
    """A stream's recipe: the healthy level at time t (relative to 1), the fault's factor at
    result i and time t, and where the daemon restarts."""

    healthy: Callable[[float], float]
    fault: Callable[[int, float], float]
    restarts: frozenset[int] = frozenset()


def swing(amplitude: float, phase: str, period_s: float = DAY_S) -> Callable[[float], float]:
    """A daily swing of +-amplitude that starts at its `peak`, `trough` or `mean` (rising)."""
    offset = {"peak": math.pi / 2, "trough": -math.pi / 2, "mean": 0.0}[phase]
    return lambda t: 1 + amplitude * math.sin(2 * math.pi * t / period_s + offset)


def ar1(
    sd: float, timescale_s: float, step_s: float, rng: random.Random
) -> Callable[[float], float]:
    """An AR(1) wander of stationary standard deviation `sd` and correlation time
    `timescale_s`, sampled every `step_s` (it starts from its stationary distribution)."""
    phi = math.exp(-step_s / timescale_s)
    state = {"x": rng.gauss(0, sd), "t": 0.0}

    def level(t: float) -> float:
        while state["t"] < t:
            state["x"] = phi * state["x"] + math.sqrt(1 - phi * phi) * sd * rng.gauss(0, 1)
            state["t"] += step_s
        return 1 + state["x"]

    return level


def flat(_t: float) -> float:
    return 1.0


def no_fault(_i: int, _t: float) -> float:
    return 1.0


def held(depth: float, start_s: float, hours: float) -> Callable[[int, float], float]:
    """A cut to 1 - depth from `start_s` for `hours`, then repaired."""
    end = start_s + hours * 3600
    return lambda _i, t: 1 - depth if start_s <= t < end else 1.0


def decline(rate_per_hour: float, start_s: float) -> Callable[[int, float], float]:
    """A loss of `rate_per_hour` (0.005: 0.5 %/h) of the starting level, from `start_s`."""
    return lambda _i, t: max(0.0, 1 - rate_per_hour * max(0.0, t - start_s) / 3600)


def flapping(
    start_s: float, hours: float, depth: float, rng: random.Random
) -> Callable[[int, float], float]:
    """From `start_s` for `hours`: 2 of every 5 results at 1 - depth, never 3 in a row (the
    two bad slots of each block of five drawn at random, redrawn where they would make 3)."""
    end = start_s + hours * 3600
    state: dict[str, Any] = {"i": 0, "block": [], "tail": [False, False]}

    def next_block() -> list[bool]:
        while True:
            slots = set(rng.sample(range(5), 2))
            block = [i in slots for i in range(5)]
            joined = state["tail"] + block
            if not any(all(joined[i : i + 3]) for i in range(len(joined) - 2)):
                state["tail"] = block[-2:]
                return block

    def fault(_i: int, t: float) -> float:
        if not start_s <= t < end:
            return 1.0
        if state["i"] % 5 == 0:
            state["block"] = next_block()
        bad = state["block"][state["i"] % 5]
        state["i"] += 1
        return 1 - depth if bad else 1.0

    return fault


def outliers(
    rate: float, low: float, high: float, rng: random.Random
) -> Callable[[int, float], float]:
    """Heavy-tailed noise: each result, with probability `rate`, at a factor drawn uniformly
    from [low, high] (a noisy neighbour on the host or the fabric), else untouched."""
    return lambda _i, _t: rng.uniform(low, high) if rng.random() < rate else 1.0


def bimodal(low: float, rng: random.Random) -> Callable[[int, float], float]:
    """Two levels at random, result by result: 1 or `low` (NCCL's tuner picking one of two
    algorithms, or two rings of different speed)."""
    return lambda _i, _t: low if rng.random() < 0.5 else 1.0


def upgrade(
    gain: float, at_s: float, hold_s: float, rate_per_hour: float
) -> Callable[[int, float], float]:
    """From `at_s` the level is 1 + gain (a new driver or NCCL), held `hold_s`, then it loses
    `rate_per_hour` of that new level an hour."""

    def fault(_i: int, t: float) -> float:
        if t < at_s:
            return 1.0
        hours = max(0.0, t - at_s - hold_s) / 3600
        return (1 + gain) * max(0.0, 1 - rate_per_hour * hours)

    return fault


def both(
    first: Callable[[int, float], float], second: Callable[[int, float], float]
) -> Callable[[int, float], float]:
    return lambda i, t: first(i, t) * second(i, t)


def episodes(flags: list[bool]) -> list[int]:
    """The lengths of the degraded stretches of a replayed stream's verdicts."""
    lengths, run = [], 0
    for flag in [*flags, False]:
        if flag:
            run += 1
        elif run:
            lengths.append(run)
            run = 0
    return lengths


def stream(
    shape: Shape,
    seed: int,
    days: float,
    interval_s: float = 60.0,
    noise: float = 0.05,
    series: dict[str, Any] | None = None,
    rng: random.Random | None = None,
) -> Iterator[dict[str, Any]]:
    """The results of `shape` every `interval_s` for `days`."""
    rng = rng or random.Random(seed)
    labels = series or SERIES
    for i in range(int(days * DAY_S / interval_s)):
        t = i * interval_s
        level = shape.healthy(t) * shape.fault(i, t) * (1 + noise * rng.gauss(0, 1))
        result: dict[str, Any] = {
            "t": round(T0 + t, 3),
            **labels,
            "busbw": BUSBW * max(level, 1e-3),
        }
        if i in shape.restarts:
            result["restart"] = True
        yield result


def shape_of(args: argparse.Namespace, rng: random.Random) -> Shape:
    start = args.start_hours * 3600
    healthy: Callable[[float], float] = flat
    if args.swing:
        healthy = swing(args.swing, args.phase)
    if args.kind == "swing":
        return Shape(swing(args.amplitude, args.phase), no_fault)
    if args.kind == "wander":
        return Shape(ar1(args.sd, args.timescale_hours * 3600, args.interval, rng), no_fault)
    if args.kind == "cut":
        restarts = frozenset(
            {int((start + args.hours * 1800) / args.interval)} if args.restart else set()
        )
        return Shape(healthy, held(args.depth, start, args.hours), restarts)
    if args.kind == "step":
        return Shape(healthy, held(args.depth, start, 1e9))
    if args.kind == "flap":
        return Shape(healthy, flapping(start, args.hours, args.depth, rng))
    if args.kind == "decline":
        return Shape(healthy, decline(args.rate, start))
    return Shape(healthy, no_fault)


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "kind", choices=["healthy", "swing", "wander", "cut", "step", "flap", "decline"]
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--days", type=float, default=7.0)
    parser.add_argument("--interval", type=float, default=60.0, help="seconds between results")
    parser.add_argument("--noise", type=float, default=0.05)
    parser.add_argument("--amplitude", type=float, default=0.10, help="swing: +-amplitude")
    parser.add_argument("--phase", choices=["peak", "trough", "mean"], default="peak")
    parser.add_argument("--swing", type=float, default=0.0, help="a daily swing under a fault")
    parser.add_argument("--sd", type=float, default=0.05, help="wander: its standard deviation")
    parser.add_argument("--timescale-hours", type=float, default=6.0)
    parser.add_argument("--depth", type=float, default=0.25, help="cut, step, flap: the loss")
    parser.add_argument("--start-hours", type=float, default=30.0, help="when the fault starts")
    parser.add_argument("--hours", type=float, default=24.0, help="how long a cut or flap holds")
    parser.add_argument("--rate", type=float, default=0.005, help="decline: loss per hour")
    parser.add_argument("--restart", action="store_true", help="cut: restart halfway through it")
    return parser


def main_stream(argv: list[str] | None = None) -> Iterator[dict[str, Any]]:
    """The results this command line of the script would print (bench/replay_bench.py)."""
    args = parser().parse_args(argv)
    rng = random.Random(args.seed)
    return stream(shape_of(args, rng), args.seed, args.days, args.interval, args.noise, rng=rng)


def main(argv: list[str] | None = None) -> int:
    for result in main_stream(argv):
        sys.stdout.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
