"""The pairs probes' part of the daemon's record: each pair's latest measurement and its age, the
pairs a sweep could not measure by reason, the links judged from what is kept, and how many
sweeps in a row named each pair and each GPU (netmon.probe.streaks).

The streaks live in memory only, as the verdicts they count do: a restart starts them at 0, so
the hardware as it is after a restart (often a repair: a reboot, a reseat, a new GPU) needs two
sweeps of its own that agree before an alert, at the cost of one more pair interval.

Not locked itself: netmon.serve.results holds one and calls it under its own lock.
"""

from __future__ import annotations

from collections.abc import Sequence

from netmon.config import NetmonConfig, ProbeConfig
from netmon.exposition.catalogue import PAIR_SKIP_REASONS
from netmon.exposition.snapshot import LinkPoint
from netmon.probe.pairs import PairOutcome, PairSkip, verdict_at_largest
from netmon.probe.streaks import Streak, advance
from netmon.probe.verdict import LinkVerdict, Pair


class PairRecord:
    def __init__(self, config: NetmonConfig) -> None:
        # Each pair's latest successful measurement and when, per pairs probe: a sweep measures
        # the pairs that are idle then, and the others keep their last result and its age.
        self._latest: dict[str, dict[Pair, tuple[PairOutcome, float]]] = {}
        self._links: dict[str, tuple[LinkPoint, ...]] = {}
        self.skips: dict[tuple[str, str], int] = {}
        self.suspect_gpus: dict[str, tuple[int, ...]] = {}
        self.members: dict[str, tuple[int, ...]] = {}
        self._pair_streaks: dict[str, dict[Pair, Streak]] = {}
        self.gpu_streaks: dict[str, dict[int, Streak]] = {}
        self.reconfigure(config)

    @property
    def links(self) -> tuple[LinkPoint, ...]:
        return tuple(point for name in sorted(self._links) for point in self._links[name])

    def reconfigure(self, config: NetmonConfig) -> None:
        """Everything of a probe a reload removed goes (its pairs, links, suspects and skips);
        every pairs probe's skip reasons count from 0, so that increase() sees the first skip of
        a probe a reload added as of one present at start."""
        names = {p.name for p in config.probes or ()}
        self._latest = {k: v for k, v in self._latest.items() if k in names}
        self._links = {k: v for k, v in self._links.items() if k in names}
        self.suspect_gpus = {k: v for k, v in self.suspect_gpus.items() if k in names}
        self.members = {k: v for k, v in self.members.items() if k in names}
        self._pair_streaks = {k: v for k, v in self._pair_streaks.items() if k in names}
        self.gpu_streaks = {k: v for k, v in self.gpu_streaks.items() if k in names}
        self.skips = {k: v for k, v in self.skips.items() if k[0] in names}
        for probe in config.probes or ():
            if probe.kind == "pairs":
                for reason in PAIR_SKIP_REASONS:
                    self.skips.setdefault((probe.name, reason), 0)

    def skipped(self, probe: str, skipped: Sequence[PairSkip]) -> None:
        for item in skipped:
            key = (probe, item.reason)
            self.skips[key] = self.skips.get(key, 0) + 1

    def sweep(self, probe: ProbeConfig, results: Sequence[PairOutcome], now: float) -> LinkVerdict:
        """One sweep's pairs, judged on each pair's latest measurement. A pair that failed this
        time has no point until it succeeds again; a pair not run keeps its last result."""
        latest = self._latest.setdefault(probe.name, {})
        for item in results:
            if item.outcome.ok:
                latest[item.pair] = (item, now)
            else:
                latest.pop(item.pair, None)
        kept = [item for item, _ in latest.values()]
        verdict = verdict_at_largest(kept, probe.suspect_ratio)
        # Measured by this sweep: the pairs that succeeded, and their GPUs. A pair that failed
        # or was skipped, and a GPU none of whose pairs succeeded, keep their streaks.
        done = [item.pair for item in results if item.outcome.ok]
        pairs = self._pair_streaks.get(probe.name, {})
        pairs = advance(pairs, done, verdict.suspect_pairs, now)
        gpus = self.gpu_streaks.get(probe.name, {})
        gpus = advance(gpus, {g for pair in done for g in pair}, verdict.suspect_members, now)
        self._pair_streaks[probe.name], self.gpu_streaks[probe.name] = pairs, gpus
        self._links[probe.name] = _link_points(probe.name, latest, verdict, pairs)
        self.suspect_gpus[probe.name] = verdict.suspect_members
        self.members[probe.name] = tuple(
            sorted({m for item in [*results, *kept] for m in item.pair})
        )
        return verdict


def _link_points(
    probe: str,
    latest: dict[Pair, tuple[PairOutcome, float]],
    verdict: LinkVerdict,
    streaks: dict[Pair, Streak],
) -> tuple[LinkPoint, ...]:
    points = []
    suspect = set(verdict.suspect_pairs)
    for pair, (item, measured_at) in sorted(latest.items()):
        judged = verdict.pairs.get(pair)
        for result in item.outcome.results:
            points.append(
                LinkPoint(
                    probe=probe,
                    size_bytes=result.size_bytes,
                    gpu=pair[0],
                    peer_gpu=pair[1],
                    path=item.path,
                    busbw=result.busbw_bytes_per_second,
                    ratio=judged.ratio if judged else None,
                    low=bool(judged and judged.low),
                    suspect=pair in suspect,
                    measured_at=measured_at,
                    suspect_sweeps=streaks[pair].sweeps if pair in streaks else 0,
                )
            )
    return tuple(points)
