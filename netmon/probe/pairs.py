"""Pairwise link probes: every GPU pair as its own 2-rank world, in rounds of disjoint pairs.

Pairs in one round run at the same time (they share no GPU, and the plan keeps pairs that share a
PCIe switch uplink apart); each pair gets fresh rank processes, so a hung pair is killed alone.
A gate (the daemon's readiness) may hold each pair's two GPUs while it runs, stop it alone when a
job takes one of them, or skip it.
"""

from __future__ import annotations

import math
import sys
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from netmon.probe.build import Placement
from netmon.probe.forking import Zygote
from netmon.probe.launcher import AbortCheck, Launcher
from netmon.probe.spec import ProbeOutcome, ProbeSpec, SizeResult
from netmon.probe.verdict import LinkVerdict, Pair, judge_pairs

# A 2-rank all_reduce measures one link only with NVLS off and a ring (docs/FACTS.md, "Pairs").
PAIR_NCCL_ENV = {"NCCL_NVLS_ENABLE": "0", "NCCL_ALGO": "Ring"}


@dataclass(frozen=True)
class PairOutcome:
    pair: Pair
    path: str
    outcome: ProbeOutcome


@dataclass(frozen=True)
class Gate:
    """What a pair may do now: run with its own abort check, or be skipped for `reason`."""

    reason: str | None = None
    detail: str = ""
    abort: AbortCheck | None = None


@dataclass(frozen=True)
class PairSkip:
    pair: Pair
    path: str
    reason: str
    detail: str


# Holds a pair's GPUs while it runs (entered before its ranks start, left after they are gone).
PairGate = Callable[[Pair], AbstractContextManager[Gate]]


def pair_placement(pair: Pair, backend: str) -> Placement:
    """A probe narrowed to one pair: 2 ranks on GPUs (or CPU rank slots) a and b.

    On GPUs its intent is left to probe.build, from the topology: "nvlink" where NVLink joins
    the pair, so a pair that fell back to SHM or the network is a transport fault; "any"
    otherwise, as P2P over PCIe is as legitimate a path for a PCIe pair as host memory (the
    "pcie" intent would count its P2P as a fault). CPU ranks write no NCCL log: "any".
    """
    nccl = backend == "nccl"
    return Placement(
        devices=(str(pair[0]), str(pair[1])),
        ranks=2,
        env=PAIR_NCCL_ENV if nccl else {},
        intent=None if nccl else "any",
    )


def run_pair_rounds(
    spec_of: Callable[[Pair], ProbeSpec],
    rounds: Sequence[Sequence[Pair]],
    paths: Mapping[Pair, str],
    *,
    abort: AbortCheck | None = None,
    python: str | None = None,
    on_pair: Callable[[PairOutcome], None] | None = None,
    on_skip: Callable[[PairSkip], None] | None = None,
    parallel: bool | None = None,
    gate: PairGate | None = None,
    zygote: Zygote | None = None,
) -> list[PairOutcome]:
    """Run every round in order, the pairs of a round concurrently; stop early on abort.

    `spec_of` makes a pair's spec (probe.build with pair_placement). `parallel` defaults to True
    for GPUs and False for CPU ranks: gloo ranks share the host's cores, so concurrent pairs
    would measure each other rather than their links. `abort` stops the whole sweep; `gate`
    decides each pair (its abort check then stops that pair alone), and a pair it refuses goes
    to `on_skip`. A `zygote` forks the ranks (netmon.probe.forking).
    """
    done: list[PairOutcome] = []
    run = _Round(abort, python or sys.executable, gate, on_skip, zygote)
    for round_pairs in rounds:
        if abort is not None and abort() is not None:
            break
        specs = {pair: spec_of(pair) for pair in round_pairs}
        concurrent = parallel if parallel is not None else _on_gpus(specs.values())
        groups = [list(round_pairs)] if concurrent else [[pair] for pair in round_pairs]
        outcomes: dict[Pair, ProbeOutcome] = {}
        for group in groups:
            outcomes.update(run(specs, group, paths))
        for pair in round_pairs:
            if pair not in outcomes:
                continue
            result = PairOutcome(pair, paths.get(pair, "unknown"), outcomes[pair])
            done.append(result)
            if on_pair is not None:
                on_pair(result)
    return done


def _on_gpus(specs: Iterable[ProbeSpec]) -> bool:
    return any(spec.backend == "nccl" for spec in specs)


@dataclass(frozen=True)
class _Round:
    """Runs the pairs of one round, each in its own thread, each through the gate."""

    abort: AbortCheck | None
    python: str
    gate: PairGate | None
    on_skip: Callable[[PairSkip], None] | None
    zygote: Zygote | None = None

    def __call__(
        self, specs: Mapping[Pair, ProbeSpec], pairs: Sequence[Pair], paths: Mapping[Pair, str]
    ) -> dict[Pair, ProbeOutcome]:
        outcomes: dict[Pair, ProbeOutcome] = {}

        def run(pair: Pair) -> None:
            if self.gate is None:
                outcomes[pair] = self._launcher(specs[pair], self.abort).run()
                return
            with self.gate(pair) as gate:
                if gate.reason is None:
                    outcomes[pair] = self._launcher(specs[pair], gate.abort).run()
                elif self.on_skip is not None:
                    path = paths.get(pair, "unknown")
                    self.on_skip(PairSkip(pair, path, gate.reason, gate.detail))

        threads = [
            threading.Thread(target=run, args=(pair,), name=f"pair-{pair[0]}-{pair[1]}")
            for pair in pairs
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return outcomes

    def _launcher(self, spec: ProbeSpec, abort: AbortCheck | None) -> Launcher:
        return Launcher(spec, abort=abort, python=self.python, zygote=self.zygote)


def _largest_busbw(item: PairOutcome) -> float:
    if not item.outcome.results:
        return -1.0
    return max(item.outcome.results, key=lambda r: r.size_bytes).busbw_bytes_per_second


def best_per_pair(
    results: Sequence[PairOutcome], max_foreign_cpu: float = 1.0
) -> list[PairOutcome]:
    """One outcome per pair over several passes: a failure if any pass failed, else the best of
    the undisturbed ones (`disturbed`), else the best.

    Noise from a busy host only ever slows a link down, so the best of a few passes estimates what
    the link can do, and a link that is really degraded is slow in every pass.
    """
    chosen: dict[Pair, PairOutcome] = {}

    def rank(item: PairOutcome) -> tuple[bool, float]:
        return (not disturbed(item, max_foreign_cpu), _largest_busbw(item))

    for item in results:
        current = chosen.get(item.pair)
        if current is None or (
            current.outcome.ok and (not item.outcome.ok or rank(item) > rank(current))
        ):
            chosen[item.pair] = item
    return list(chosen.values())


# How many times a pair measured while other work held the CPUs is measured again, alone.
DISTURBED_RETRIES = 2


def remeasure_disturbed(
    measured: Sequence[PairOutcome],
    spec_of: Callable[[Pair], ProbeSpec],
    paths: Mapping[Pair, str],
    max_foreign_cpu: float,
    **run: Any,
) -> list[PairOutcome]:
    """Pairs measured while other work held the CPUs (often the round's other pairs, on a host
    with few cores), measured again alone up to DISTURBED_RETRIES times, as the daemon leaves
    such a result unjudged rather than call the link slow. `run` goes to run_pair_rounds."""
    again: list[PairOutcome] = []
    for _ in range(DISTURBED_RETRIES):
        pairs = [
            item.pair
            for item in best_per_pair([*measured, *again], max_foreign_cpu)
            if item.outcome.ok and disturbed(item, max_foreign_cpu)
        ]
        if not pairs:
            break
        again += run_pair_rounds(spec_of, [[pair] for pair in pairs], paths, **run)
    return again


# How many times a pair on CPU ranks that reads low is measured again, alone: there another
# pass differs from the first only by what else the host ran.
LOW_RETRIES = 2


def remeasure_low(
    measured: Sequence[PairOutcome],
    spec_of: Callable[[Pair], ProbeSpec],
    paths: Mapping[Pair, str],
    ratio: float,
    max_foreign_cpu: float,
    **run: Any,
) -> list[PairOutcome]:
    """Pairs on CPU ranks whose best figure is under `ratio` of their class median, measured
    again alone up to LOW_RETRIES times, so that each is judged on the best of its tries. `run`
    goes to run_pair_rounds."""
    again: list[PairOutcome] = []
    for _ in range(LOW_RETRIES):
        verdict = verdict_at_largest(best_per_pair([*measured, *again], max_foreign_cpu), ratio)
        pairs = [pair for pair, judged in verdict.pairs.items() if judged.low]
        if not pairs:
            break
        again += run_pair_rounds(spec_of, [[pair] for pair in pairs], paths, **run)
    return again


def judged(
    measured: Sequence[PairOutcome], ratio: float, max_foreign_cpu: float, cpus: int | None = None
) -> tuple[list[PairOutcome], LinkVerdict, list[str]]:
    """The best outcome per pair, the verdict at the largest size (`cpus`: verdict_at_largest),
    and a line per pair left unjudged."""
    results = best_per_pair(measured, max_foreign_cpu)
    verdict = verdict_at_largest(results, ratio, max_foreign_cpu, cpus)
    return results, verdict, not_judged(results, verdict, max_foreign_cpu)


def not_judged(
    results: Sequence[PairOutcome], verdict: LinkVerdict, max_foreign_cpu: float
) -> list[str]:
    """One line per measured pair the verdict left out: disturbed in every try, or low only by
    as much as the other work measured with it can account for (load_ceiling)."""
    lines = []
    for item in results:
        if not item.outcome.ok or not item.outcome.results or item.pair in verdict.pairs:
            continue
        name = f"pair {item.pair[0]}-{item.pair[1]} not judged"
        if disturbed(item, max_foreign_cpu):
            lines.append(
                f"{name}: other processes held {max_foreign_cpu:.0%} or more of the CPUs in "
                "every try (measured alone too)"
            )
        else:
            share = _largest(item).foreign_cpu_share or 0.0
            lines.append(
                f"{name}: low in every try, but other processes held {share:.0%} of the CPUs "
                "meanwhile, which can slow CPU ranks by as much (measured alone too)"
            )
    return lines


def load_ceiling(busbw: float, share: float | None, cpus: int) -> float:
    """The most a pair on CPU ranks measured at `busbw` could have given had nothing else run.

    A 2-rank collective goes at its slower rank's pace. Other work that took `share` of `cpus`
    CPUs took at most share x cpus of one core (all of it from one rank's), so that rank, and the
    pair, kept at least 1 - share x cpus of its pace; taking more than a core leaves no bound.
    """
    lost = (share or 0.0) * cpus
    return busbw / (1.0 - lost) if lost < 1.0 else math.inf


def disturbed(item: PairOutcome, max_foreign_cpu: float) -> bool:
    """Whether other work held `max_foreign_cpu` or more of the CPUs while the pair's largest
    size was measured (the baseline's `disturbed`: its figure says little about the link)."""
    if not item.outcome.results:
        return False
    share = max(item.outcome.results, key=lambda r: r.size_bytes).foreign_cpu_share
    return share is not None and share >= max_foreign_cpu


def _largest(item: PairOutcome) -> SizeResult:
    return max(item.outcome.results, key=lambda r: r.size_bytes)


def verdict_at_largest(
    results: Sequence[PairOutcome],
    ratio: float,
    max_foreign_cpu: float = 1.0,
    cpus: int | None = None,
) -> LinkVerdict:
    """Judge the pairs on their largest measured size (bandwidth, not latency, shows a link);
    a pair measured only while other work held the CPUs is not judged.

    On CPU ranks (`cpus`: how many their affinity holds) a pair is low only if its load_ceiling
    is: a pair under `ratio` by no more than the other work measured with it can explain is
    left unjudged, and its class judged without it, until no such pair is left."""
    busbw: dict[Pair, float] = {}
    ceilings: dict[Pair, float] = {}
    paths: dict[Pair, str] = {}
    for item in results:
        if item.outcome.results and not disturbed(item, max_foreign_cpu):
            largest = _largest(item)
            busbw[item.pair] = largest.busbw_bytes_per_second
            ceilings[item.pair] = busbw[item.pair]
            if cpus is not None:
                ceilings[item.pair] = load_ceiling(
                    busbw[item.pair], largest.foreign_cpu_share, cpus
                )
            paths[item.pair] = item.path
    while True:
        verdict = judge_pairs(busbw, paths, ratio)
        explained = [
            pair
            for pair, judged in verdict.pairs.items()
            if judged.low and judged.class_median and ceilings[pair] >= ratio * judged.class_median
        ]
        if not explained:
            return verdict
        for pair in explained:
            del busbw[pair]
