"""Verdicts on production-shaped streams (issue 33): the acceptance rows, over many seeds.

Each trial generates a stream (bench/streams.py: one result a minute unless --interval says
otherwise, 5 % noise unless --noise) and feeds it through `netmon replay`'s engine, the daemon's
own per-series path (netmon.serve.replay), with the default policy unless --policy sets fields.
Rows:
  swing    healthy, +-10 % daily swing starting at the peak, the trough or the mean, 7 days:
           degraded share, longest degraded episode (results)
  wander   healthy AR(1) wander, sd 5 %, six-hour timescale, 7 days: degraded share
  cut      25 % cut held 24 h from a random start (2-72 h in), with and without a restart
           halfway: results to flag, degraded share while held, results to clear after it
  step     healthy step down of 15 % held 72 h: degraded share of the last 48 h
  flap     2 of every 5 results at half bandwidth (never 3 in a row) for 2 days: results until
           reason=flapping, degraded share while it flaps
  decline  0.5 %/h decline for 3 days from a random start (26-120 h in): loss when flagged,
           degraded results before 8 % loss

    python bench/verdict_streams.py --seeds 20            # every row, JSON to stdout
    python bench/verdict_streams.py --rows decline,wander --policy decline_margin=0.12

One JSON document goes to stdout: per row, each trial's figures and a summary.
The rows of issue 45 (heavy, bimodal, bimodal_cut, young, upgrade, latency) live in
bench/verdict_classes.py.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import streams as s
from verdict_classes import NEW_ROWS, NEW_SUMMARIES, index_at, offset, verdicts

from netmon.baseline import BaselinePolicy

H = 3600.0
ROWS = (
    "swing",
    "wander",
    "cut",
    "step",
    "flap",
    "decline",
    "heavy",
    "bimodal",
    "bimodal_cut",
    "young",
    "upgrade",
    "latency",
)
# A latency-bound series: 8 B all_reduce on 8 ranks, about 30 us an op, given as time_s.


def longest(flags: list[bool]) -> int:
    best = run = 0
    for flag in flags:
        run = run + 1 if flag else 0
        best = max(best, run)
    return best


def healthy(
    shape: s.Shape, seed: int, args: argparse.Namespace, policy: BaselinePolicy
) -> dict[str, Any]:
    results = list(s.stream(shape, seed, 7, args.interval, args.noise))
    out = verdicts(results, policy)
    flags = [r.verdict.degraded for r in out]
    reasons = sorted({r.verdict.reason for r in out if r.verdict.reason})
    return {"share": sum(flags) / len(flags), "longest": longest(flags), "reasons": reasons}


def trial(row: str, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    policy = BaselinePolicy(**args.policy)
    rng = random.Random(f"{row}/{seed}")
    if row == "swing":
        phase = ("peak", "trough", "mean")[seed % 3]
        return {
            "phase": phase,
            **healthy(s.Shape(s.swing(0.10, phase), s.no_fault), seed, args, policy),
        }
    if row == "wander":
        shape = s.Shape(s.ar1(0.05, 6 * H, args.interval, rng), s.no_fault)
        return healthy(shape, seed, args, policy)
    if row == "cut":
        return cut(seed, rng, args, policy)
    if row == "step":
        start = rng.uniform(2, 48) * H
        results = list(
            s.stream(
                s.Shape(s.flat, s.held(0.15, start, 1e9)),
                seed,
                start / 86400 + 3,
                args.interval,
                args.noise,
            )
        )
        flags = [r.verdict.degraded for r in verdicts(results, policy)]
        last = flags[index_at(results, start + 24 * H) :]
        return {
            "start_h": round(start / H, 1),
            "share_last_48h": sum(last) / len(last),
            "share_72h": sum(flags[index_at(results, start) :])
            / len(flags[index_at(results, start) :]),
        }
    if row == "flap":
        start = rng.uniform(26, 50) * H
        shape = s.Shape(s.flat, s.flapping(start, 48, 0.5, rng))
        results = list(s.stream(shape, seed, start / 86400 + 2.2, args.interval, args.noise))
        out = verdicts(results, policy)
        begin, end = index_at(results, start), index_at(results, start + 48 * H)
        during = out[begin:end]
        first = next((i for i, r in enumerate(during) if r.verdict.reason == "flapping"), None)
        return {
            "start_h": round(start / H, 1),
            "to_flapping": first,
            "degraded_share": sum(r.verdict.degraded for r in during) / len(during),
            "flapping_share": sum(r.verdict.reason == "flapping" for r in during) / len(during),
            "false_before": sum(r.verdict.degraded for r in out[:begin]),
        }
    if row == "decline":
        return decline(seed, rng, args, policy)
    return NEW_ROWS[row](seed, rng, args, policy)


def cut(
    seed: int, rng: random.Random, args: argparse.Namespace, policy: BaselinePolicy
) -> dict[str, Any]:
    start = rng.uniform(2, 72) * H
    restart = seed % 2 == 1
    middle = index_at(
        list(s.stream(s.Shape(s.flat, s.no_fault), seed, start / 86400 + 1, args.interval, 0)),
        start + 12 * H,
    )
    shape = s.Shape(s.flat, s.held(0.25, start, 24), frozenset({middle} if restart else set()))
    results = list(s.stream(shape, seed, start / 86400 + 1.5, args.interval, args.noise))
    out = verdicts(results, policy)
    begin, end = index_at(results, start), index_at(results, start + 24 * H)
    during, after = out[begin:end], out[end:]
    flag = next((i + 1 for i, r in enumerate(during) if r.verdict.degraded), None)
    clear = next((i + 1 for i, r in enumerate(after) if not r.verdict.degraded), None)
    return {
        "start_h": round(start / H, 1),
        "restart": restart,
        "flag": flag,
        "held_share": sum(r.verdict.degraded for r in during) / len(during),
        "clear": clear,
        "false_before": sum(r.verdict.degraded for r in out[:begin]),
    }


def decline(
    seed: int, rng: random.Random, args: argparse.Namespace, policy: BaselinePolicy
) -> dict[str, Any]:
    start = rng.uniform(26, 120) * H
    results = list(
        s.stream(
            s.Shape(s.flat, s.decline(0.005, start)),
            seed,
            start / 86400 + 3,
            args.interval,
            args.noise,
        )
    )
    out = verdicts(results, policy)

    def loss(i: int) -> float:
        return max(0.0, 0.005 * (offset(results, i) - start) / H)

    first = next((i for i, r in enumerate(out) if r.verdict.degraded), None)
    early = sum(r.verdict.degraded for i, r in enumerate(out) if loss(i) < 0.08)
    after = out[first:] if first is not None else []
    return {
        "start_h": round(start / H, 1),
        "loss_at_flag": None if first is None else round(loss(first), 4),
        "reason": None if first is None else out[first].verdict.reason,
        "degraded_before_8pct": early,
        "held_after_flag": sum(r.verdict.degraded for r in after) / len(after) if after else None,
    }


SUMMARIES: dict[str, Callable[[list[dict[str, Any]]], dict[str, Any]]] = {
    **NEW_SUMMARIES,
    "swing": lambda t: {
        "max_share": max(x["share"] for x in t),
        "max_longest": max(x["longest"] for x in t),
    },
    "wander": lambda t: {
        "max_share": max(x["share"] for x in t),
        "mean_share": statistics.mean(x["share"] for x in t),
        "over_1pct": sum(x["share"] >= 0.01 for x in t),
    },
    "cut": lambda t: {
        "max_flag": max((x["flag"] or 10**9) for x in t),
        "min_held": min(x["held_share"] for x in t),
        "max_clear": max((x["clear"] or 10**9) for x in t),
        "false_before": sum(x["false_before"] for x in t),
    },
    "step": lambda t: {"max_share_last_48h": max(x["share_last_48h"] for x in t)},
    "flap": lambda t: {
        "max_to_flapping": max(
            (x["to_flapping"] if x["to_flapping"] is not None else 10**9) for x in t
        ),
        "min_degraded_share": min(x["degraded_share"] for x in t),
        "false_before": sum(x["false_before"] for x in t),
    },
    "decline": lambda t: {
        "max_loss_at_flag": max(
            (x["loss_at_flag"] if x["loss_at_flag"] is not None else 1.0) for x in t
        ),
        "min_loss_at_flag": min(
            (x["loss_at_flag"] if x["loss_at_flag"] is not None else 1.0) for x in t
        ),
        "degraded_before_8pct": sum(x["degraded_before_8pct"] for x in t),
    },
}


def policy_fields(text: str) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    for item in filter(None, text.split(",")):
        name, _, value = item.partition("=")
        fields[name.strip()] = json.loads(value)
    BaselinePolicy(**fields)  # fails here, naming the field, rather than in every worker
    return fields


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--first-seed", type=int, default=1)
    parser.add_argument("--rows", default=",".join(ROWS))
    parser.add_argument("--interval", type=float, default=60.0)
    parser.add_argument("--noise", type=float, default=0.05)
    parser.add_argument("--days", type=float, default=7.0, help="heavy, bimodal: days a trial")
    parser.add_argument("--policy", type=policy_fields, default={}, help="NAME=VALUE,...")
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args(argv)
    rows = [r for r in args.rows.split(",") if r]
    unknown = set(rows) - set(ROWS)
    if unknown:
        parser.error(f"--rows: unknown {', '.join(sorted(unknown))} (rows: {', '.join(ROWS)})")
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    began = time.monotonic()
    with ProcessPoolExecutor(args.jobs) as pool:
        futures = {row: [pool.submit(trial, row, seed, args) for seed in seeds] for row in rows}
        trials = {row: [f.result() for f in futures[row]] for row in rows}
    report = {
        "setup": {
            "seeds": list(seeds),
            "interval_s": args.interval,
            "noise": args.noise,
            "policy": args.policy,
        },
        "summary": {row: SUMMARIES[row](trials[row]) for row in rows},
        "trials": trials,
        "seconds": round(time.monotonic() - began, 1),
    }
    json.dump(report, sys.stdout, indent=1)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
