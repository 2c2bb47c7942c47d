"""`netmon probe`: its flags in (what they ask for is netmon.cli.probe_request), the probes run,
nccl-tests-style tables, JSON, plots and a health gate out."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from netmon import bandwidth
from netmon.cli import EXIT_GATE, EXIT_OK, EXIT_PROBE_FAILED, report, table, textfile_warning
from netmon.cli.probe_request import rank_zygote, request_from
from netmon.cli.progress import REPORT_EVERY_S, Progress
from netmon.errors import CouldNotRun, UsageError
from netmon.probe.launcher import run_probe
from netmon.probe.spec import ProbeOutcome

# nccl-tests' flags that netmon probe spells otherwise or does not take: the one-line hint an
# unknown argument gets (nccl-tests' README, "Arguments").
NCCL_TESTS_HINTS = {
    "-c": "nccl-tests' -c 0/1 is -c (--check) here, given alone",
    "-z": "nccl-tests' -z 0/1 is -z (--per-op) here, given alone",
    "-g": "nccl-tests' -g (GPUs per thread) is --ranks N here, one rank per GPU, or --devices",
    "-t": "nccl-tests' -t (threads) has no counterpart: --ranks N starts one process per GPU",
    "-d": "nccl-tests' -d (datatype) is --dtype here: float32, bfloat16 or float16",
    "-o": "nccl-tests' -o (reduction) is not taken: netmon reduces with sum, nccl-tests' default",
    "-a": "nccl-tests' -a (the ranks' figure) is --rank-stat here: max, mean or min",
    "-G": "nccl-tests' -G (CUDA graph launches) is --cuda-graph auto or off here",
    "-T": "nccl-tests' -T (timeout) is --timeout here: 300s, 5m",
}


def add_parser(commands: Any) -> None:
    probe = commands.add_parser(
        "probe",
        help="run collectives once and print nccl-tests-style results",
        description="Run a collective sweep in fresh rank processes, like nccl-tests.",
    )
    probe.hints = NCCL_TESTS_HINTS
    probe.add_argument(
        "--backend",
        choices=("nccl", "gloo"),
        help="default: nccl where CUDA GPUs exist, else gloo with 2 CPU ranks",
    )
    probe.add_argument("--ranks", type=int, help="number of ranks (default: all GPUs, or 2 on CPU)")
    probe.add_argument("--devices", help="GPUs per rank, by index or UUID: 0,1,2,3")
    probe.add_argument(
        "--op",
        default="all_reduce",
        help=f"one or more of {','.join(bandwidth.OPS)}, comma separated",
    )
    probe.add_argument("--sizes", help="sizes with binary suffixes: 8,64K,16M (64K = 65536 B)")
    probe.add_argument("-b", "--minbytes", help="sweep start, as nccl-tests -b")
    probe.add_argument("-e", "--maxbytes", help="sweep end, as nccl-tests -e")
    probe.add_argument("-f", "--stepfactor", type=int, default=2, help="sweep factor (default 2)")
    probe.add_argument("-n", "--iters", type=int, default=20, help="timed samples per size")
    probe.add_argument("-w", "--warmup", type=int, default=5, help="warm-up ops per size")
    probe.add_argument(
        "--warmup-s",
        type=float,
        help="on GPUs, warm the first size up for at least this long (default 0.1 s; 0: none)",
    )
    probe.add_argument(
        "--batch",
        type=int,
        default=5,
        help="back-to-back ops per sample in batched timing (default 5)",
    )
    probe.add_argument(
        "-z",
        "--per-op",
        action="store_true",
        help="synchronise after every op (nccl-tests -z, latency view)",
    )
    probe.add_argument(
        "--cuda-graph",
        choices=("auto", "off"),
        default="auto",
        help="time sizes up to 1 MiB on NCCL from one CUDA graph per batch (auto, the default; "
        "the JSON's timing_path says which was used) or off: eager calls",
    )
    probe.add_argument(
        "--rank-stat",
        choices=bandwidth.RANK_STATS,
        default="max",
        help="a sample's time across ranks: max, the slowest rank (default), or mean, as "
        "nccl-tests -a 1, or min",
    )
    probe.add_argument(
        "--chunks",
        "--repeat",
        default="1",
        help="carry each size as k ops of S/k; a list (1,8,64) compares them",
    )
    probe.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    probe.add_argument("--timeout", default="300s", help="deadline for each probe (300s, 5m)")
    probe.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra environment for the ranks (NCCL_ALGO=Ring); repeatable",
    )
    probe.add_argument(
        "--paths",
        default="default",
        help="path variants, each in fresh ranks: default, pcie (NCCL_P2P_DISABLE=1, the "
        "host-memory path), ring, tree, nvls; a list compares them (default,pcie)",
    )
    probe.add_argument(
        "--plot",
        type=Path,
        metavar="FILE.png",
        help="draw busbw against size for every op, path and chunking (needs matplotlib: "
        "pip install matplotlib)",
    )
    probe.add_argument("-c", "--check", action="store_true", help="verify results after timing")
    probe.add_argument(
        "--min-busbw",
        metavar="RATE",
        help="health gate: exit 1 if busbw at the largest size is under RATE "
        "(decimal: 1.5G = 1.5e9 B/s)",
    )
    probe.add_argument("--json", action="store_true", help="one JSON document on stdout")
    probe.add_argument(
        "--textfile",
        type=Path,
        metavar="PATH",
        help="also write the results in Prometheus text format, atomically, for "
        "node_exporter's textfile collector (PATH ending in .prom)",
    )
    probe.add_argument(
        "--name", default="cli", help="the probe label in --textfile output (default cli)"
    )
    probe.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    table.add_wide_flag(probe)
    probe.add_argument(
        "--host",
        default="127.0.0.1",
        help="rendezvous address rank 0 binds; {gpu} is replaced by rank 0's GPU (pair probes)",
    )
    probe.add_argument(
        "--wrapper",
        metavar="CMD",
        help="per-rank command prefix; {rank}, {gpu}, {numa} are replaced "
        "(numactl --cpunodebind={numa}, ip netns exec ns{gpu})",
    )
    probe.add_argument(
        "--rank-start",
        choices=("zygote", "spawn"),
        default="zygote",
        help="fork ranks from one process that imported torch once (zygote, default), or start "
        "each as a new interpreter (spawn)",
    )
    probe.add_argument(
        "--pairs",
        action="store_true",
        help="pairwise link probes: every GPU pair as a 2-rank world, in rounds of disjoint "
        "pairs; names a suspect pair or GPU (exit 1 when there is one)",
    )
    probe.add_argument(
        "--topology",
        type=Path,
        metavar="FILE",
        help="`nvidia-smi topo -m` output for the pair plan and path classes "
        "(default: NVML; with gloo, --ranks members of one class)",
    )
    probe.add_argument(
        "--passes",
        type=int,
        default=1,
        help="pair probes: run the whole plan N times and judge each pair's best (default 1)",
    )
    probe.add_argument(
        "--suspect-ratio",
        type=float,
        default=0.7,
        help="a pair is low under this fraction of its path-class median (default 0.7)",
    )
    probe.set_defaults(handler=run)


def _gate(outcomes: Sequence[ProbeOutcome], min_busbw: float) -> list[str]:
    """Messages for every probe whose largest size fell under the threshold."""
    failures = []
    for outcome in outcomes:
        if not outcome.results:
            continue
        largest = max(outcome.results, key=lambda r: r.size_bytes)
        if largest.busbw_bytes_per_second < min_busbw:
            failures.append(
                f"{largest.op} busbw {largest.busbw_bytes_per_second / 1e9:.3f} GB/s at "
                f"{bandwidth.format_size(largest.size_bytes)} is under --min-busbw "
                f"{min_busbw / 1e9:.3f} GB/s"
            )
    return failures


def run(args: argparse.Namespace) -> int:
    min_busbw = None
    if args.min_busbw is not None:
        try:
            min_busbw = bandwidth.parse_rate(args.min_busbw)
        except ValueError as exc:
            raise UsageError(f"--min-busbw: {exc}") from None
    if args.plot is not None:
        from netmon.cli import plot

        plot.require()  # before the measuring, not after it
    request = request_from(args)
    specs = request.specs()
    if getattr(args, "nccl_missing", None):
        raise CouldNotRun(f"--backend nccl: no usable GPU: {args.nccl_missing}; or --backend gloo")
    if getattr(args, "announce", None) and not args.quiet:  # -q: nothing but the results
        print(args.announce, file=sys.stderr)
    # Once every flag is known to be valid (a usage error stays one line), before the measuring.
    if args.textfile is not None and (warning := textfile_warning(args.textfile)):
        print(warning, file=sys.stderr)
    if args.pairs:
        from netmon.cli.probe_pairs import run_pairs

        return run_pairs(args, request, specs)
    total = sum(len(spec.sizes) for spec in specs)
    live = not args.quiet and sys.stderr.isatty()
    progress = Progress(total, sys.stderr, results=not args.quiet and total > 1, live=live)
    if live:  # a person is watching: the ranks say how a long size is going
        specs = [spec.model_copy(update={"progress_s": REPORT_EVERY_S}) for spec in specs]
    with rank_zygote(args) as zygote:
        try:
            outcomes = [run_probe(spec, on_event=progress, zygote=zygote) for spec in specs]
        finally:
            progress.close()
    if args.plot is not None:
        from netmon.cli import plot

        plot.busbw_against_size(outcomes, args.plot)
    if args.textfile is not None:
        from netmon.exposition import textfile

        try:
            textfile.write(args.textfile, outcomes, args.name, min_busbw)
        except OSError as exc:
            raise UsageError(f"--textfile: {args.textfile}: {exc.strerror}") from None
    if args.json:
        print(json.dumps(report.json_document(outcomes), indent=2))
    else:
        print("\n\n".join(report.table(outcome, args.wide) for outcome in outcomes))
    failed = [o for o in outcomes if o.failure is not None]
    for outcome in failed:
        assert outcome.failure is not None
        print(
            f"netmon: probe {outcome.spec.op} failed: {outcome.failure.describe()}", file=sys.stderr
        )
    if failed:
        return EXIT_PROBE_FAILED
    if min_busbw is not None:
        gate = _gate(outcomes, min_busbw)
        for message in gate:
            print(f"netmon: UNHEALTHY: {message}", file=sys.stderr)
        if gate:
            return EXIT_GATE
    return EXIT_OK
