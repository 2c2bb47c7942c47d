"""Issue 45's classes of stream for bench/verdict_streams.py: heavy-tailed noise, two NCCL
algorithms, a series born cut, an upgrade then a decline, a doubled latency given as time_s;
and the helpers both use to replay a stream and find a time in it."""

from __future__ import annotations

import argparse
import random
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import streams as s

from netmon.baseline import BaselinePolicy
from netmon.serve import replay

H = 3600.0
LATENCY: dict[str, Any] = {
    "probe": "small",
    "op": "all_reduce",
    "size": 8,
    "ranks": 8,
    "path": "default",
}
LATENCY_S = 30e-6


def verdicts(results: list[dict[str, Any]], policy: BaselinePolicy) -> list[replay.Replayed]:
    parsed = [replay.parse_result(r, f"result {i}") for i, r in enumerate(results)]
    return list(replay.replay(parsed, policy))


def offset(results: list[dict[str, Any]], i: int) -> float:
    return float(results[i]["t"]) - s.T0


def index_at(results: list[dict[str, Any]], seconds: float) -> int:
    return next((i for i in range(len(results)) if offset(results, i) >= seconds), len(results))


def heavy(
    seed: int, rng: random.Random, args: argparse.Namespace, policy: BaselinePolicy
) -> dict[str, Any]:
    """Healthy, with 1-5 % of results at 0.3-0.6x (a noisy neighbour), a week."""
    rate = (0.01, 0.02, 0.05)[seed % 3]
    shape = s.Shape(s.flat, s.outliers(rate, 0.3, 0.6, rng))
    return {"rate": rate, **false_alarms(shape, seed, rng, args, policy)}


def bimodal(
    seed: int, rng: random.Random, args: argparse.Namespace, policy: BaselinePolicy
) -> dict[str, Any]:
    """Each result at 1.0x or 0.8x at random (two NCCL algorithms), a week."""
    shape = s.Shape(s.flat, s.bimodal(0.8, rng))
    return false_alarms(shape, seed, rng, args, policy)


def false_alarms(
    shape: s.Shape,
    seed: int,
    rng: random.Random,
    args: argparse.Namespace,
    policy: BaselinePolicy,
) -> dict[str, Any]:
    """A healthy stream of `shape` judged: its degraded share, longest episode, episodes of 10
    results or more, and how many series-years it spans."""
    results = list(s.stream(shape, seed, args.days, args.interval, args.noise, rng=rng))
    flags = [r.verdict.degraded for r in verdicts(results, policy)]
    runs = s.episodes(flags)
    return {
        "share": sum(flags) / len(flags),
        "longest": max(runs, default=0),
        "episodes_10": sum(n >= 10 for n in runs),
        "series_years": len(results) * args.interval / (365 * 86400),
    }


def bimodal_cut(
    seed: int, rng: random.Random, args: argparse.Namespace, policy: BaselinePolicy
) -> dict[str, Any]:
    """The two modes, cut 25 % together from a random start for 6 h."""
    start = rng.uniform(26, 50) * H
    fault = s.both(s.bimodal(0.8, rng), s.held(0.25, start, 6))
    results = list(
        s.stream(
            s.Shape(s.flat, fault), seed, start / 86400 + 0.5, args.interval, args.noise, rng=rng
        )
    )
    out = verdicts(results, policy)
    begin, end = index_at(results, start), index_at(results, start + 6 * H)
    during = out[begin:end]
    flag = next((i + 1 for i, r in enumerate(during) if r.verdict.degraded), None)
    return {
        "start_h": round(start / H, 1),
        "flag": flag,
        "held_share": sum(r.verdict.degraded for r in during) / len(during),
        "false_before": sum(r.verdict.degraded for r in out[:begin]),
    }


def young(
    seed: int, rng: random.Random, args: argparse.Namespace, policy: BaselinePolicy
) -> dict[str, Any]:
    """A new series cut 25 % from its result 3 or 6 (the first results it can learn), held
    30 h: is it flagged, and how soon?"""
    first = (3, 6)[seed % 2]
    start = (first - 1) * args.interval
    shape = s.Shape(s.flat, s.held(0.25, start, 30))
    results = list(s.stream(shape, seed, 30 / 24, args.interval, args.noise, rng=rng))
    out = verdicts(results, policy)
    flag = next((i + 1 for i, r in enumerate(out) if r.verdict.degraded), None)
    later = out[index_at(results, start + 2 * H) :]
    return {
        "from": first,
        "flag": flag,
        "held_share_after_2h": sum(r.verdict.degraded for r in later) / len(later),
    }


def upgrade(
    seed: int, rng: random.Random, args: argparse.Namespace, policy: BaselinePolicy
) -> dict[str, Any]:
    """+40 % from a random hour of day 2 (a new driver), held 3 days, then -0.5 %/h of the new
    level: the loss from the new level when flagged, and results degraded before 8 %."""
    at = rng.uniform(26, 48) * H
    hold = 3 * 86400
    shape = s.Shape(s.flat, s.upgrade(0.4, at, hold, 0.005))
    days = (at + hold) / 86400 + 2
    results = list(s.stream(shape, seed, days, args.interval, args.noise, rng=rng))
    out = verdicts(results, policy)

    def loss(i: int) -> float:
        return max(0.0, 0.005 * (offset(results, i) - at - hold) / H)

    first = next((i for i, r in enumerate(out) if r.verdict.degraded), None)
    return {
        "at_h": round(at / H, 1),
        "loss_at_flag": None if first is None else round(loss(first), 4),
        "reason": None if first is None else out[first].verdict.reason,
        "degraded_before_8pct": sum(
            r.verdict.degraded for i, r in enumerate(out) if loss(i) < 0.08
        ),
    }


def latency(
    seed: int, rng: random.Random, args: argparse.Namespace, policy: BaselinePolicy
) -> dict[str, Any]:
    """8 B all_reduce whose time doubles for an hour after 2 healthy days."""
    start = 48 * H + rng.uniform(0, 24) * H
    shape = s.Shape(s.flat, s.held(0.5, start, 1))  # the rate halves: the time doubles
    results = []
    for r in s.stream(shape, seed, start / 86400 + 0.25, args.interval, args.noise, rng=rng):
        result = {**r, **LATENCY, "time_s": LATENCY_S * s.BUSBW / r["busbw"]}
        del result["busbw"]  # given as seconds per op, as `netmon replay` takes them
        results.append(result)
    out = verdicts(results, policy)
    begin, end = index_at(results, start), index_at(results, start + H)
    during = out[begin:end]
    flag = next((i + 1 for i, r in enumerate(during) if r.verdict.degraded), None)
    before = [r.verdict.degraded for r in out[:begin]]
    return {
        "start_h": round(start / H, 1),
        "flag": flag,
        "held_share": sum(r.verdict.degraded for r in during) / len(during),
        "share_before": sum(before) / len(before),
    }


NEW_ROWS = {
    "heavy": heavy,
    "bimodal": bimodal,
    "bimodal_cut": bimodal_cut,
    "young": young,
    "upgrade": upgrade,
    "latency": latency,
}


def budget(trials: list[dict[str, Any]]) -> dict[str, Any]:
    years = sum(x["series_years"] for x in trials)
    count = sum(x["episodes_10"] for x in trials)
    return {
        "max_share": max(x["share"] for x in trials),
        "max_longest": max(x["longest"] for x in trials),
        "episodes_10": count,
        "series_years": round(years, 3),
        "episodes_10_per_series_year": round(count / years, 3),
    }


def flagged(trials: list[dict[str, Any]], key: str = "flag") -> dict[str, Any]:
    found = sorted(x[key] if x[key] is not None else 10**9 for x in trials)
    return {"max_flag": found[-1], "median_flag": found[len(found) // 2]}


NEW_SUMMARIES: dict[str, Callable[[list[dict[str, Any]]], dict[str, Any]]] = {
    "heavy": budget,
    "bimodal": budget,
    "bimodal_cut": lambda t: {
        **flagged(t),
        "min_held": min(x["held_share"] for x in t),
        "false_before": sum(x["false_before"] for x in t),
        "within_10": sum((x["flag"] or 10**9) <= 10 for x in t) / len(t),
    },
    "young": lambda t: {
        **flagged(t),
        "within_60": sum((x["flag"] or 10**9) <= 60 for x in t) / len(t),
        "min_held_after_2h": min(x["held_share_after_2h"] for x in t),
    },
    "upgrade": lambda t: {
        "max_loss_at_flag": max(
            (x["loss_at_flag"] if x["loss_at_flag"] is not None else 1.0) for x in t
        ),
        "min_loss_at_flag": min(
            (x["loss_at_flag"] if x["loss_at_flag"] is not None else 1.0) for x in t
        ),
        "degraded_before_8pct": sum(x["degraded_before_8pct"] for x in t),
    },
    "latency": lambda t: {
        **flagged(t),
        "min_held": min(x["held_share"] for x in t),
        "max_share_before": max(x["share_before"] for x in t),
    },
}
