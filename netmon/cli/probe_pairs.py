"""`netmon probe --pairs`: the pairwise link probes of the command line (docs/TOPOLOGY.md,
"Pairwise link probes"); what the flags ask for is netmon.cli.probe_request's."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

from netmon import sim
from netmon.cli import EXIT_GATE, EXIT_OK, EXIT_PROBE_FAILED, report
from netmon.cli.probe_request import Request, rank_zygote, spec_from
from netmon.errors import UsageError
from netmon.probe.pairs import PairOutcome, pair_placement
from netmon.probe.spec import ProbeSpec


def run_pairs(args: argparse.Namespace, request: Request, specs: Sequence[ProbeSpec]) -> int:
    """`netmon probe --pairs`: every GPU pair in rounds, re-measured where disturbed, judged
    within its path class; a health gate on the verdict."""
    from netmon.probe import pairs
    from netmon.topology.plan import plan_rounds

    if len(specs) != 1:
        raise UsageError("--pairs: give one --op, one --chunks value and one path")
    if args.passes < 1:
        raise UsageError(f"--passes: must be >= 1 (got {args.passes})")
    topo = request.topology
    assert topo is not None  # request_from reads it for --pairs
    probe, backend = request.probes[0], specs[0].backend
    rounds = plan_rounds(topo)
    paths = {pair: str(path) for pair, path in topo.pairs().items()}

    def spec_of(pair: tuple[int, int]) -> ProbeSpec:
        return spec_from(
            probe, request.node, placement=pair_placement(pair, backend), topology=topo
        )

    def progress(item: PairOutcome) -> None:
        if not args.quiet:
            state = "ok" if item.outcome.ok else f"FAILED ({item.outcome.failure.reason})"  # type: ignore[union-attr]
            print(
                f"netmon: pair {item.pair[0]}-{item.pair[1]} ({item.path}): {state}",
                file=sys.stderr,
                flush=True,
            )

    # Ranks on CPUs: gloo's, and a simulated node's (its collectives are gloo's over loopback).
    on_cpus = backend != "nccl" or sim.active() is not None
    measured: list[PairOutcome] = []
    limit = request.node.baseline.max_foreign_cpu
    with rank_zygote(args) as zygote:
        run: dict[str, Any] = {"on_pair": progress, "zygote": zygote}
        for _ in range(args.passes):
            measured += pairs.run_pair_rounds(spec_of, rounds, paths, **run)
        measured += pairs.remeasure_disturbed(measured, spec_of, paths, limit, **run)
        if on_cpus:  # a low figure there may be the host's load
            measured += pairs.remeasure_low(
                measured, spec_of, paths, args.suspect_ratio, limit, **run
            )
    # They share the CPUs of their affinity, which they inherit from this process.
    cpus = len(os.sched_getaffinity(0)) if on_cpus else None
    results, verdict, unjudged = pairs.judged(measured, args.suspect_ratio, limit, cpus)
    for line in unjudged:
        print(f"netmon: {line}", file=sys.stderr)
    if args.json:
        print(json.dumps(report.pairs_document(results, verdict, rounds), indent=2))
    else:
        print(report.pairs_table(results, verdict, args.wide))
    failed = [item for item in results if not item.outcome.ok]
    for item in failed:
        assert item.outcome.failure is not None
        print(
            f"netmon: pair {item.pair[0]}-{item.pair[1]} failed: {item.outcome.failure.describe()}",
            file=sys.stderr,
        )
    if failed:
        return EXIT_PROBE_FAILED
    if verdict.suspect_pairs or verdict.suspect_members:
        print(f"netmon: UNHEALTHY: {verdict.describe()}", file=sys.stderr)
        return EXIT_GATE
    return EXIT_OK
