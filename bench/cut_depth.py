"""How deep a cut netmon catches, and how fast (issue 16): rounds to a verdict per cut depth.

Two daemons in two network namespaces joined by one shaped veth pair (tests/netns.py, as in
tests/test_group_netns.py), a group round of 2 MiB every second, the default baseline policy.
The baseline is learned at 400 Mbit/s; the cable is then cut to each depth for at most `--limit`
rounds and restored for at most `--limit` rounds. Needs root (network namespaces).

    python bench/cut_depth.py                      # 25, 50, 60, 75 % of the rate: about 4 min
    python bench/cut_depth.py --depths 0.6,0.9 --limit 10

One JSON document goes to stdout; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.netns import Link
from tests.test_group_netns import measure_cut

HEALTHY_MBIT = 400


def log(message: str) -> None:
    print(f"bench: {message}", file=sys.stderr, flush=True)


def one_depth(depth: float, limit: int) -> dict[str, object]:
    rate = f"{round(HEALTHY_MBIT * depth)}mbit"
    link = Link()
    try:
        with tempfile.TemporaryDirectory(prefix="netmon-cut-bench-") as directory:
            result = measure_cut(link, Path(directory), rate, limit, healthy=f"{HEALTHY_MBIT}mbit")
    finally:
        link.remove()
    row = {
        "depth": depth,
        "rate": rate,
        "baseline_bytes_per_second": result.baseline,
        "rounds_to_verdict": result.to_verdict,
        "ratio_at_verdict": result.ratio_at_verdict,
        "rounds_to_clear": result.to_clear,
    }
    log(f"{depth:.0%} of the rate: {row}")
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--depths", default="0.25,0.5,0.6,0.75", help="fractions of the rate")
    parser.add_argument("--limit", type=int, default=10, help="rounds to wait for each verdict")
    args = parser.parse_args()
    try:
        depths = [float(d) for d in args.depths.split(",")]
    except ValueError:
        parser.error("--depths: give fractions of the rate, comma separated (0.25,0.6)")
    if not all(0 < d < 1 for d in depths) or args.limit < 1:
        parser.error("--depths: each between 0 and 1, exclusive; --limit: at least 1")
    started = time.monotonic()
    rows = [one_depth(depth, args.limit) for depth in depths]
    print(
        json.dumps(
            {
                "benchmark": "cut_depth",
                "date": datetime.date.today().isoformat(),
                "machine": {"host": platform.node(), "cpus": os.cpu_count()},
                "setup": {
                    "healthy_rate": f"{HEALTHY_MBIT}mbit",
                    "probe": "group round, all_reduce 2 MiB, every 1 s, 2 daemons (1 rank each)",
                    "policy": "default (3 of the last 5 low; ratio 0.8; spread_k 3; settle 2)",
                    "limit_rounds": args.limit,
                },
                "depths": rows,
                "elapsed_s": round(time.monotonic() - started, 1),
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
