"""Verdicts on held cuts under synthetic noise (issue 23): does a real cut stay flagged?

Each trial feeds the real BaselineBook (the default policy unless --policy says otherwise) a
series of one size: `--healthy` results at level 1, then the link cut by CUT and held for
`--held` results, then `--after` results restored. A result is level x (1 + noise x z), z
standard normal, drawn from one seeded generator per trial. For every noise x cut it reports,
over `--seeds` seeds: how many trials flagged the cut, how many results it took (median, max),
how many cleared while the cut was still held, the longest continuous degraded stretch, how many
results it took to clear once the cut ended, and any degraded result in the healthy part.

    python bench/verdict_sweep.py                      # the table in docs/BENCHMARKS.md
    python bench/verdict_sweep.py --seeds 5 --held 200 # a quick look

One JSON document goes to stdout; with --markdown, the table too (to stderr).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from netmon.baseline import BaselineBook, BaselinePolicy, Verdict

NOISES = (0.03, 0.05, 0.08, 0.10)
CUTS = (0.20, 0.25, 0.30, 0.40)
# A cut of 0 is a healthy link held for as long: anything flagged there is a false alarm.
HEALTHY = 0.0
KEY = ("large", "all_reduce", 16 << 20, "default", 2)
T0 = 1_767_225_600.0  # a midnight


def series(noise: float, cut: float, seed: int, healthy: int, held: int, after: int) -> list[float]:
    rng = random.Random(f"{noise}/{cut}/{seed}")
    levels = [1.0] * healthy + [1.0 - cut] * held + [1.0] * after
    return [max(1e-6, level * (1 + noise * rng.gauss(0, 1))) * 1e9 for level in levels]


def longest(flags: list[bool]) -> int:
    best = run = 0
    for flag in flags:
        run = run + 1 if flag else 0
        best = max(best, run)
    return best


def trial(
    policy: BaselinePolicy, noise: float, cut: float, seed: int, healthy: int, held: int, after: int
) -> dict[str, Any]:
    book = BaselineBook(policy)
    verdicts: list[Verdict] = [
        book.observe(KEY, value, at=T0 + 60 * i)  # one result a minute
        for i, value in enumerate(series(noise, cut, seed, healthy, held, after))
    ]
    during = [v.degraded for v in verdicts[healthy : healthy + held]]
    ended = [v.degraded for v in verdicts[healthy + held :]]
    first = during.index(True) if True in during else None
    return {
        "false": sum(v.degraded for v in verdicts[:healthy]),
        "flag": None if first is None else first + 1,
        "cleared_while_held": first is not None and not all(during[first:]),
        "longest": longest(during),
        "clear": ended.index(False) + 1 if False in ended else None,
    }


def row(
    policy: BaselinePolicy, noise: float, cut: float, args: argparse.Namespace
) -> dict[str, Any]:
    trials = [
        trial(policy, noise, cut, seed, args.healthy, args.held, args.after)
        for seed in range(args.seed, args.seed + args.seeds)
    ]
    flags = sorted(t["flag"] for t in trials if t["flag"] is not None)
    clears = [t["clear"] for t in trials if t["flag"] is not None]
    return {
        "noise": noise,
        "cut": cut,
        "seeds": len(trials),
        "flagged": len(flags),
        "flag_median": statistics.median(flags) if flags else None,
        "flag_max": flags[-1] if flags else None,
        # How many trials turned within 10 and 20 results of the cut: at 10 % noise a 25 % cut
        # is on the edge of what a baseline of 20 results can see (docs/SIGNAL.md).
        "flagged_within_10": sum(flag <= 10 for flag in flags),
        "flagged_within_20": sum(flag <= 20 for flag in flags),
        "cleared_while_held": sum(t["cleared_while_held"] for t in trials),
        "held_throughout": sum(
            t["flag"] is not None and not t["cleared_while_held"] for t in trials
        ),
        "longest_degraded_median": statistics.median(t["longest"] for t in trials),
        "longest_degraded_min": min(t["longest"] for t in trials),
        "clear_after_max": None if None in clears else max(clears, default=None),
        "false_in_healthy": sum(t["false"] for t in trials),
    }


def markdown(rows: list[dict[str, Any]], held: int) -> str:
    lines = [
        f"| noise | cut | flagged | results to flag (median / max) | held all {held} | "
        "longest degraded (median / min) | to clear after (max) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['noise']:.0%} | {r['cut']:.0%} {'(healthy)' if not r['cut'] else ''} | "
            f"{r['flagged']}/{r['seeds']} | "
            f"{r['flag_median']} / {r['flag_max']} | {r['held_throughout']}/{r['seeds']} | "
            f"{r['longest_degraded_median']} / {r['longest_degraded_min']} | "
            f"{r['clear_after_max']} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0, help="the first seed")
    parser.add_argument("--healthy", type=int, default=200)
    parser.add_argument("--held", type=int, default=1000)
    parser.add_argument("--after", type=int, default=100)
    parser.add_argument("--policy", type=json.loads, default={}, help="JSON: baseline settings")
    parser.add_argument("--markdown", action="store_true", help="the table on stderr too")
    args = parser.parse_args()
    policy = BaselinePolicy.model_validate(args.policy)
    started = time.monotonic()
    rows = [row(policy, noise, cut, args) for noise in NOISES for cut in (HEALTHY, *CUTS)]
    document = {
        "bench": "verdict_sweep",
        "policy": policy.model_dump(mode="json"),
        "healthy": args.healthy,
        "held": args.held,
        "after": args.after,
        "rows": rows,
        "seconds": round(time.monotonic() - started, 1),
    }
    print(json.dumps(document, indent=1))
    if args.markdown:
        print(markdown(rows, args.held), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
