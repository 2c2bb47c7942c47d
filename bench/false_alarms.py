"""The false-alarm budget (issue 45): degraded episodes a series-year on healthy streams.

Every class of healthy stream production makes, each trial a series of --days (a month by
default) with its parameters drawn at random from the class's range, one result a minute,
judged by `netmon replay`'s engine (the daemon's per-series path) under the default policy:
  gaussian  flat, noise 2-8 %
  wander    AR(1) wander of sd 5 % and a timescale of 6 h (issue 33's), 5 % noise
  wide      AR(1) wander of sd 3-6 % and a timescale of 2-12 h, 5 % noise: how the rate grows
            with the wander (each episode names its trial's sd and timescale)
  swing     a daily swing of +-5-10 % from a phase drawn at random, 5 % noise
  heavy     1-5 % of results at 0.3-0.6x (a noisy neighbour), 5 % noise
  bimodal   each result at 1.0x or at a low mode of 0.8-0.95x, its share 20-80 %, 5 % noise
  edge      bimodal's worst corner: a low mode at 0.80-0.83x holding 25-40 % of results,
            where the lower level straddles the upper one's tolerance (0.8)
  step      a lasting step of 2-6 % up or down at a random time: inside the decline margin
            (8 %), so not a loss the verdict is built to name
  outages   no results for 1-72 h a few times a month, half of them ending in a restart

An episode is a run of degraded verdicts; the budget counts those of 10 results or more (10
minutes at one a minute: NetmonBusbwDegraded's wait). Per class the report gives the
series-years judged, the episodes, their rate a series-year and the rate's exact one-sided
95 % upper bound (Poisson), and every episode's trial, hour, length and reason.

    python bench/false_alarms.py --series-years 30          # every class, JSON to stdout
    python bench/false_alarms.py --classes heavy,bimodal --series-years 3 --first-seed 100
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import streams as s
from verdict_classes import verdicts

from netmon.baseline import BaselinePolicy

H = 3600.0
YEAR_S = 365 * 86400.0
EPISODE = 10  # results: the budget's shortest episode
Gaps = list[tuple[float, float]]  # seconds from the stream's start: no results in [a, b)


@dataclass(frozen=True)
class Draw:
    """One trial's stream as its class drew it: the shape, the noise, the outages, and the
    parameters drawn (reported with each episode)."""

    shape: s.Shape
    noise: float = 0.05
    gaps: Gaps = field(default_factory=list)
    params: dict[str, float] = field(default_factory=dict)


def gaussian(rng: random.Random, days: float) -> Draw:
    noise = rng.uniform(0.02, 0.08)
    return Draw(s.Shape(s.flat, s.no_fault), noise, params={"noise": round(noise, 4)})


def wander(rng: random.Random, days: float) -> Draw:
    return Draw(s.Shape(s.ar1(0.05, 6 * H, 60.0, rng), s.no_fault))


def wide(rng: random.Random, days: float) -> Draw:
    sd, hours = rng.uniform(0.03, 0.06), rng.uniform(2, 12)
    shape = s.Shape(s.ar1(sd, hours * H, 60.0, rng), s.no_fault)
    return Draw(shape, params={"sd": round(sd, 4), "timescale_h": round(hours, 2)})


def swing(rng: random.Random, days: float) -> Draw:
    amplitude, phase = rng.uniform(0.05, 0.10), rng.uniform(0, 2 * math.pi)
    shape = s.Shape(
        lambda t: 1 + amplitude * math.sin(2 * math.pi * t / s.DAY_S + phase), s.no_fault
    )
    return Draw(shape, params={"amplitude": round(amplitude, 4), "phase": round(phase, 3)})


def heavy(rng: random.Random, days: float) -> Draw:
    rate = rng.uniform(0.01, 0.05)
    return Draw(s.Shape(s.flat, s.outliers(rate, 0.3, 0.6, rng)), params={"rate": round(rate, 4)})


def bimodal(rng: random.Random, days: float) -> Draw:
    return two_levels(rng, rng.uniform(0.8, 0.95), rng.uniform(0.2, 0.8))


def edge(rng: random.Random, days: float) -> Draw:
    return two_levels(rng, rng.uniform(0.8, 0.83), rng.uniform(0.25, 0.4))


def two_levels(rng: random.Random, low: float, share: float) -> Draw:
    shape = s.Shape(s.flat, lambda _i, _t: low if rng.random() < share else 1.0)
    return Draw(shape, params={"low": round(low, 4), "low_share": round(share, 3)})


def step(rng: random.Random, days: float) -> Draw:
    size = rng.uniform(0.02, 0.06) * rng.choice((-1, 1))
    start = rng.uniform(0.1, 0.9) * days * s.DAY_S
    shape = s.Shape(s.flat, s.held(size, start, 1e9))
    return Draw(shape, params={"step": round(-size, 4), "at_h": round(start / H, 1)})


def outages(rng: random.Random, days: float) -> Draw:
    gaps = []
    for _ in range(max(1, round(days / 7 * rng.uniform(1, 3)))):
        start = rng.uniform(0.05, 0.95) * days * s.DAY_S
        gaps.append((start, start + rng.uniform(1, 72) * H))
    return Draw(s.Shape(s.flat, s.no_fault), gaps=gaps, params={"outages": len(gaps)})


CLASSES: dict[str, Callable[[random.Random, float], Draw]] = {
    "gaussian": gaussian,
    "wander": wander,
    "wide": wide,
    "swing": swing,
    "heavy": heavy,
    "bimodal": bimodal,
    "edge": edge,
    "step": step,
    "outages": outages,
}


def without_gaps(
    results: list[dict[str, Any]], gaps: Gaps, rng: random.Random
) -> list[dict[str, Any]]:
    """The stream with no results inside a gap; the first one after a gap, half the time,
    follows a restart of the daemon."""
    kept, after_gap = [], False
    for result in results:
        t = float(result["t"]) - s.T0
        if any(a <= t < b for a, b in gaps):
            after_gap = True
            continue
        if after_gap and rng.random() < 0.5:
            result = {**result, "restart": True}
        after_gap = False
        kept.append(result)
    return kept


def trial(name: str, seed: int, days: float, policy_fields: dict[str, Any]) -> dict[str, Any]:
    rng = random.Random(f"budget/{name}/{seed}")
    draw = CLASSES[name](rng, days)
    stream = s.stream(draw.shape, seed, days, 60.0, draw.noise, rng=rng)
    results = without_gaps(list(stream), draw.gaps, rng)
    out = verdicts(results, BaselinePolicy(**policy_fields))
    found, run = [], 0
    for i, replayed in enumerate([*out, None]):
        if replayed is not None and replayed.verdict.degraded:
            run += 1
            continue
        if run >= EPISODE:
            first = out[i - run]
            found.append(
                {
                    "seed": seed,
                    "hour": round((float(first.result.t) - s.T0) / H, 2),
                    "results": run,
                    "reason": first.verdict.reason,
                    **draw.params,
                }
            )
        run = 0
    return {
        "series_years": days * s.DAY_S / YEAR_S,
        "degraded": sum(r.verdict.degraded for r in out),
        "results": len(out),
        "episodes": found,
    }


def upper_95(count: int, exposure: float) -> float:
    """The exact one-sided 95 % upper bound of a Poisson rate seen `count` times in
    `exposure` (3.0 / exposure for none), by bisection on the Poisson tail."""

    def tail(mu: float) -> float:  # P(X <= count) for X ~ Poisson(mu)
        term = total = math.exp(-mu)
        for k in range(1, count + 1):
            term *= mu / k
            total += term
        return total

    low, high = 0.0, 10.0 + 10.0 * count
    for _ in range(100):
        middle = (low + high) / 2
        low, high = (middle, high) if tail(middle) > 0.05 else (low, middle)
    return high / exposure


def summary(trials: list[dict[str, Any]]) -> dict[str, Any]:
    years = sum(t["series_years"] for t in trials)
    episodes = [e for t in trials for e in t["episodes"]]
    return {
        "trials": len(trials),
        "series_years": round(years, 2),
        "episodes_10": len(episodes),
        "per_series_year": round(len(episodes) / years, 3),
        "upper_95_per_series_year": round(upper_95(len(episodes), years), 3),
        "degraded_share": sum(t["degraded"] for t in trials) / sum(t["results"] for t in trials),
        "longest": max((e["results"] for e in episodes), default=0),
        "episodes": episodes,
    }


def judged(names: list[str], seeds: range, days: float, jobs: int) -> dict[str, Any]:
    """Every class's summary over its trials, in `jobs` processes (in this one for 1)."""
    if jobs == 1:
        return {n: summary([trial(n, seed, days, {}) for seed in seeds]) for n in names}
    with ProcessPoolExecutor(jobs) as pool:
        futures = {n: [pool.submit(trial, n, seed, days, {}) for seed in seeds] for n in names}
        return {n: summary([f.result() for f in futures[n]]) for n in names}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--classes", default=",".join(CLASSES))
    parser.add_argument("--series-years", type=float, default=30.0, help="judged per class")
    parser.add_argument("--days", type=float, default=30.0, help="days a trial")
    parser.add_argument("--first-seed", type=int, default=1)
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args(argv)
    names = [c for c in args.classes.split(",") if c]
    unknown = set(names) - set(CLASSES)
    if unknown:
        parser.error(
            f"--classes: unknown {', '.join(sorted(unknown))} (classes: {', '.join(CLASSES)})"
        )
    count = max(1, math.ceil(args.series_years * YEAR_S / (args.days * s.DAY_S)))
    seeds = range(args.first_seed, args.first_seed + count)
    began = time.monotonic()
    report = judged(names, seeds, args.days, args.jobs)
    json.dump(
        {
            "setup": {
                "days_a_trial": args.days,
                "trials_a_class": count,
                "seeds": [seeds.start, seeds.stop - 1],
                "interval_s": 60.0,
                "episode_results": EPISODE,
                "policy": "default",
            },
            "classes": report,
            "seconds": round(time.monotonic() - began, 1),
        },
        sys.stdout,
        indent=1,
    )
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
