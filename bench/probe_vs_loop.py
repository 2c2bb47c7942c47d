"""netmon's probe against a plain torch.distributed timing loop, interleaved in one run (issue 2).

Both sides run all_reduce (float32) on gloo in 2 fresh CPU rank processes over loopback. The plain
side is `plain_rank` (plain_loop.py): its own TCPStore and process group, then per sample a barrier
and time.perf_counter around ONE op (and, as a reference for netmon's default timing, around `batch`
back-to-back ops); each rank prints its samples and medians as one JSON line. This machine is noisy,
so the sides alternate (A B, B A, ...) over several rounds and each size is judged by the median of
the per-round ratios netmon / plain, quoted with their range and an interval for that median: a
verdict whose interval straddles the tolerance is reported as inconclusive. The probe's fixed cost
is a whole `netmon probe` CLI run, timed from outside, minus its time inside timed collectives.

    python bench/probe_vs_loop.py [--rounds N] [--quick] [--rank-start zygote|spawn|both]

netmon's ranks are forked by its rank zygote by default, as in the daemon; `--rank-start spawn`
starts each as a fresh interpreter (and so does the plain loop, always). `--rank-start both` adds
a fourth side to every round, netmon's per-op probe with spawned ranks, and compares the two ways
of starting ranks directly (`fork_vs_spawn`: forked busbw / spawned busbw, per size).

One JSON document goes to stdout; progress goes to stderr. The parts are modules beside this
one: plain_loop.py and netmon_side.py run the sides, loop_rounds.py a round of them, and
loop_report.py judges the rounds.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import time
from collections.abc import Sequence

from loop_report import fork_vs_spawn, stats, summarise_size, targets
from loop_rounds import log, one_round
from netmon_side import cli_command, rank_zygote, run_cli
from plain_loop import BATCH, BATCHED_ITERS, RANKS, WARMUP, plain_rank

SIZES = (8, 1 << 20, 16 << 20)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, help="interleaved rounds (default 10; --quick 2)")
    parser.add_argument("--quick", action="store_true", help="2 rounds, 20 samples, one CLI run")
    parser.add_argument(
        "--iters", type=int, help="per-op samples per size on both sides (default 50; --quick 20)"
    )
    parser.add_argument(
        "--batched-iters",
        type=int,
        default=BATCHED_ITERS,
        help=f"batched samples of {BATCH} ops per size, both sides (default {BATCHED_ITERS})",
    )
    parser.add_argument(
        "--cli-runs", type=int, help="timed `netmon probe` runs (default 3; quick 1)"
    )
    parser.add_argument(
        "--sizes", default=",".join(map(str, SIZES)), help="sizes in bytes (default 8,1M,16M)"
    )
    parser.add_argument(
        "--rank-start",
        choices=("zygote", "spawn", "both"),
        default="zygote",
        help="netmon's ranks forked by its rank zygote (default, as in the daemon), spawned, or "
        "both (a fourth side per round: spawned ranks, compared with forked ones)",
    )
    # Internal: run as one rank of the plain loop.
    parser.add_argument("--plain-rank", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for name in ("rounds", "iters", "batched_iters", "cli_runs"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    try:
        args.sizes = [int(size) for size in args.sizes.split(",")]
    except ValueError:
        parser.error("--sizes: give byte counts, comma separated (8,1048576)")
    if any(size < 1 for size in args.sizes):
        parser.error("--sizes: every size must be >= 1 byte")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    sizes: list[int] = args.sizes
    iters = args.iters or (20 if args.quick else 50)
    if args.plain_rank is not None:
        plain_rank(args.plain_rank, args.port, sizes, iters, args.batched_iters, BATCH)
        return 0
    rounds_n = args.rounds or (2 if args.quick else 10)
    cli_runs = args.cli_runs or (1 if args.quick else 3)
    started = time.monotonic()
    load_before = os.getloadavg()
    both = args.rank_start == "both"
    cli_start = "zygote" if both else args.rank_start
    with rank_zygote(args.rank_start):
        rounds = [one_round(n, sizes, iters, args.batched_iters, both) for n in range(rounds_n)]
    cli = []
    for number in range(cli_runs):
        cli.append(run_cli(sizes, cli_start))
        log(f"cli run {number + 1}: {cli[-1]['cli_wall_s']:.2f} s")
    by_size = {size: summarise_size(size, rounds) for size in sizes}
    checks = targets(by_size, "per_op")
    phases = {
        phase: stats([r["netmon_per_op_phases_s"][phase] for r in rounds])
        for phase in rounds[0]["netmon_per_op_phases_s"]
    }
    document = {
        "benchmark": "probe_vs_loop",
        "date": datetime.date.today().isoformat(),
        "machine": {
            "host": platform.node(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "torch": rounds[0]["torch"],
            # Other work on the machine skews both sides; interleaving spreads it, not removes it.
            "loadavg_1m_before": load_before[0],
            "loadavg_1m_after": os.getloadavg()[0],
            # Per round: CPU seconds used by other processes per second (0 is quiet).
            "foreign_cpu_share_per_round": stats([r["foreign_cpu_share"] for r in rounds]),
        },
        "setup": {
            "backend": "gloo",
            "ranks": RANKS,
            "op": "all_reduce",
            "dtype": "float32",
            "sizes": sizes,
            "warmup": WARMUP,
            "per_op_iters": iters,
            "batched_iters": args.batched_iters,
            "batch": BATCH,
            "rounds": rounds_n,
            "order": "each round runs every side once; odd rounds in reverse order",
            "plain_per_op": "per rank: barrier, perf_counter around one op; the slower rank's "
            "median",
            "plain_batched": f"per rank: barrier, perf_counter around {BATCH} ops, / {BATCH}; "
            "the slower rank's median",
            "netmon": "run_probe(ProbeSpec(timing=per_op|batched)); per sample the slower rank, "
            "then the median",
            "netmon_rank_start": args.rank_start,
        },
        "targets_timing": "per_op",
        "targets": checks,
        "targets_met": all(check["met"] for check in checks),
        "targets_conclusive": all(check["conclusive"] for check in checks),
        "batched_against_targets": targets(by_size, "batched"),
        "sizes": [by_size[size] for size in sizes],
        "fixed_cost": {
            "command": " ".join(cli_command(sizes, cli_start)[1:]),
            "runs": cli_runs,
            **{key: stats([run[key] for run in cli]) for key in cli[0]},
            "netmon_per_op_phases_s": phases,
            "netmon_per_op_wall_s": stats([r["netmon_per_op_wall_s"] for r in rounds]),
            "plain_wall_s": stats([r["plain_wall_s"] for r in rounds]),
            "plain_outside_timed_s": stats([r["plain_outside_timed_s"] for r in rounds]),
        },
        "rounds": rounds,
        "elapsed_s": time.monotonic() - started,
    }
    if both:
        document["fork_vs_spawn"] = fork_vs_spawn(sizes, rounds)
    print(json.dumps(document, indent=2))
    for check in checks:
        verdict = "met" if check["met"] else "NOT met"
        low, high = check["median_interval"]
        sure = "" if check["conclusive"] else " (inconclusive: the interval straddles the band)"
        log(
            f"{check['name']}: median ratio {check['median_ratio']:.3f} "
            f"[{check['min_ratio']:.3f}, {check['max_ratio']:.3f}], "
            f"{check['interval_coverage']:.0%} interval for the median [{low:.3f}, {high:.3f}]: "
            f"target {verdict}{sure}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
