"""A rank's peak host memory against bandwidth.buffer_budget, on gloo (issue 12).

Every figure comes from real probes of fresh rank processes started by netmon's launcher: each
rank reports its own peak resident memory (getrusage ru_maxrss), and a probe's figure is the
largest over its ranks. torch's own footprint is the median over a few probes of an 8 B
all_reduce; what an op costs is its probe's peak minus that footprint, held against the op's
budget. The acceptance: at an all_reduce of S, a rank peaks at most at footprint + 1.15 x S.

    python bench/rank_memory.py [--size 256M] [--ranks 2] [--ops all_reduce,sendrecv]
                                [--footprint-runs 3] [--no-check]

One JSON document goes to stdout; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

from netmon.bandwidth import OPS, OpName, buffer_budget, format_size, parse_size
from netmon.probe.launcher import run_probe
from netmon.probe.spec import ProbeOutcome, ProbeSpec

ALLOWANCE = 1.15  # the acceptance: peak <= footprint + 1.15 x S at an all_reduce of S
FOOTPRINT_RUNS = 3  # the footprint varies by a few hundred KiB between fresh ranks
TIMEOUT_S = 900.0


def log(message: str) -> None:
    print(f"bench: {message}", file=sys.stderr, flush=True)


def probe(op: OpName, size: int, ranks: int, check: bool) -> ProbeOutcome:
    # One warmup and one sample: the peak is reached by the first op; more only cost time.
    spec = ProbeSpec(
        op=op,
        sizes=(size,),
        ranks=ranks,
        warmup=1,
        iters=1,
        batch=1,
        check=check,
        timeout=TIMEOUT_S,
    )
    started = time.monotonic()
    outcome = run_probe(spec)
    if not outcome.ok or outcome.peak_host_memory_bytes is None:
        raise RuntimeError(f"{op} at {format_size(size)}B failed: {outcome.failure}")
    peak_mib = outcome.peak_host_memory_bytes / 2**20
    log(f"{op} {format_size(size)}: peak {peak_mib:.1f} MiB in {time.monotonic() - started:.1f} s")
    return outcome


def measure(
    size: int, ranks: int, ops: Sequence[OpName], check: bool, footprint_runs: int
) -> dict[str, Any]:
    footprints = []
    for _ in range(footprint_runs):
        outcome = probe("all_reduce", 8, ranks, check)
        assert outcome.peak_host_memory_bytes is not None
        footprints.append(outcome.peak_host_memory_bytes)
    footprint = int(statistics.median(footprints))
    rows: list[dict[str, Any]] = []
    for op in ops:
        peak = probe(op, size, ranks, check).peak_host_memory_bytes
        assert peak is not None
        budget = buffer_budget(op, size, ranks, "float32")
        rows.append(
            {
                "op": op,
                "budget_bytes": budget,
                "peak_bytes": peak,
                "above_footprint_bytes": peak - footprint,
                "ratio_to_budget": round((peak - footprint) / budget, 4),
            }
        )
    document: dict[str, Any] = {
        "torch_footprint_bytes": footprint,
        "torch_footprint_runs_bytes": footprints,
        "ops": rows,
    }
    for row in rows:
        if row["op"] == "all_reduce":
            allowed = ALLOWANCE * size
            document["acceptance"] = {
                "statement": f"peak <= torch footprint + {ALLOWANCE} x size at an all_reduce",
                "peak_bytes": row["peak_bytes"],
                "limit_bytes": int(footprint + allowed),
                "ratio_to_allowance": round(row["above_footprint_bytes"] / allowed, 4),
                "met": row["peak_bytes"] <= footprint + allowed,
            }
    return document


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--size", default="256M", help="message size S (default 256M)")
    parser.add_argument("--ranks", type=int, default=2, help="rank processes (default 2)")
    parser.add_argument("--ops", default=",".join(OPS), help="ops to measure (default: all)")
    parser.add_argument(
        "--footprint-runs",
        type=int,
        default=FOOTPRINT_RUNS,
        help=f"8 B probes whose median is torch's footprint (default {FOOTPRINT_RUNS})",
    )
    parser.add_argument(
        "--no-check", dest="check", action="store_false", help="skip --check (on by default)"
    )
    args = parser.parse_args(argv)
    try:
        args.size = parse_size(args.size)
    except ValueError as exc:
        parser.error(f"--size: {exc}")
    args.ops = [op.strip() for op in args.ops.split(",") if op.strip()]
    unknown = [op for op in args.ops if op not in OPS]
    if unknown or not args.ops:
        parser.error(f"--ops: {unknown or 'none'} not among {', '.join(OPS)}")
    if args.footprint_runs < 1:
        parser.error("--footprint-runs must be >= 1")
    if args.ranks < 2:
        parser.error("--ranks must be >= 2 (sendrecv needs a peer)")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    measured = measure(args.size, args.ranks, args.ops, args.check, args.footprint_runs)
    document = {
        "benchmark": "rank_memory",
        "date": datetime.date.today().isoformat(),
        "machine": {
            "host": platform.node(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
        },
        "setup": {
            "backend": "gloo",
            "ranks": args.ranks,
            "size_bytes": args.size,
            "dtype": "float32",
            "check": args.check,
            "warmup": 1,
            "iters": 1,
            "footprint": f"median of {args.footprint_runs} probes of an 8 B all_reduce",
        },
        **measured,
        "wall_s": round(time.monotonic() - started, 1),
    }
    json.dump(document, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
