"""Pairwise link probes: every GPU pair as its own 2-rank world, in rounds of disjoint pairs.

Pairs in one round run at the same time (they share no GPU, and the plan keeps pairs that share a
PCIe switch uplink apart); each pair gets fresh rank processes, so a hung pair is killed alone.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from netmon.probe.build import Placement
from netmon.probe.launcher import AbortCheck, Launcher
from netmon.probe.spec import ProbeOutcome, ProbeSpec
from netmon.probe.verdict import LinkVerdict, Pair, judge_pairs

# A 2-rank all_reduce measures one link only with NVLS off and a ring (docs/FACTS.md, "Pairs").
PAIR_NCCL_ENV = {"NCCL_NVLS_ENABLE": "0", "NCCL_ALGO": "Ring"}


@dataclass(frozen=True)
class PairOutcome:
    pair: Pair
    path: str
    outcome: ProbeOutcome


def pair_placement(pair: Pair, backend: str) -> Placement:
    """A probe narrowed to one pair: 2 ranks on GPUs (or CPU rank slots) a and b."""
    return Placement(
        devices=(str(pair[0]), str(pair[1])),
        ranks=2,
        env=PAIR_NCCL_ENV if backend == "nccl" else {},
        # Judged against its path class, not by transport: the pair's path is its label.
        intent="any",
    )


def run_pair_rounds(
    spec_of: Callable[[Pair], ProbeSpec],
    rounds: Sequence[Sequence[Pair]],
    paths: Mapping[Pair, str],
    *,
    abort: AbortCheck | None = None,
    python: str | None = None,
    on_pair: Callable[[PairOutcome], None] | None = None,
    parallel: bool | None = None,
) -> list[PairOutcome]:
    """Run every round in order, the pairs of a round concurrently; stop early on abort.

    `spec_of` makes a pair's spec (probe.build with pair_placement). `parallel` defaults to True
    for GPUs and False for CPU ranks: gloo ranks share the host's cores, so concurrent pairs
    would measure each other rather than their links.
    """
    done: list[PairOutcome] = []
    for round_pairs in rounds:
        if abort is not None and abort() is not None:
            break
        specs = {pair: spec_of(pair) for pair in round_pairs}
        concurrent = parallel if parallel is not None else _on_gpus(specs.values())
        groups = [list(round_pairs)] if concurrent else [[pair] for pair in round_pairs]
        outcomes: dict[Pair, ProbeOutcome] = {}
        for group in groups:
            outcomes.update(_run_round(specs, group, abort, python or sys.executable))
        for pair in round_pairs:
            result = PairOutcome(pair, paths.get(pair, "unknown"), outcomes[pair])
            done.append(result)
            if on_pair is not None:
                on_pair(result)
    return done


def _on_gpus(specs: Iterable[ProbeSpec]) -> bool:
    return any(spec.backend == "nccl" for spec in specs)


def _run_round(
    specs: Mapping[Pair, ProbeSpec],
    round_pairs: Sequence[Pair],
    abort: AbortCheck | None,
    python: str,
) -> dict[Pair, ProbeOutcome]:
    outcomes: dict[Pair, ProbeOutcome] = {}

    def run(pair: Pair) -> None:
        outcomes[pair] = Launcher(specs[pair], abort=abort, python=python).run()

    threads = [
        threading.Thread(target=run, args=(pair,), name=f"pair-{pair[0]}-{pair[1]}")
        for pair in round_pairs
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return outcomes


def _largest_busbw(item: PairOutcome) -> float:
    if not item.outcome.results:
        return -1.0
    return max(item.outcome.results, key=lambda r: r.size_bytes).busbw_bytes_per_second


def best_per_pair(results: Sequence[PairOutcome]) -> list[PairOutcome]:
    """One outcome per pair over several passes: a failure if any pass failed, else the best.

    Noise from a busy host only ever slows a link down, so the best of a few passes estimates what
    the link can do, and a link that is really degraded is slow in every pass.
    """
    chosen: dict[Pair, PairOutcome] = {}
    for item in results:
        current = chosen.get(item.pair)
        if current is None or (
            current.outcome.ok
            and (not item.outcome.ok or _largest_busbw(item) > _largest_busbw(current))
        ):
            chosen[item.pair] = item
    return list(chosen.values())


def verdict_at_largest(results: Sequence[PairOutcome], ratio: float) -> LinkVerdict:
    """Judge the pairs on their largest measured size (bandwidth, not latency, shows a link)."""
    busbw: dict[Pair, float] = {}
    paths: dict[Pair, str] = {}
    for item in results:
        if item.outcome.results:
            largest = max(item.outcome.results, key=lambda r: r.size_bytes)
            busbw[item.pair] = largest.busbw_bytes_per_second
            paths[item.pair] = item.path
    return judge_pairs(busbw, paths, ratio)
