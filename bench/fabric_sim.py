"""The simulated network under a sweep: what a pair's busbw would be on a fabric with faults.

A pair's busbw on one rail is the line rate times the slowest link its flows cross (its two
cables and, across leaves, the uplinks the routing picks: netmon.sweep.locate.fabric, the same
model the planner uses), each uplink direction shared equally by the flows of the round that use
it, times a measurement noise factor drawn from recorded streams.

Noise: the relative deviations of recorded healthy results (tests/fixtures/healthy_streams*.json,
the 16 MiB all_reduce, conclusive results only) from their local level (the median of the 11
results around each, itself left out), so that the recording's slow drift, which a cohort
measured at one time shares, is not counted as a pair's own noise. `scale` stretches the
deviations: 1 is the recording's (CPU ranks on a loaded 2-core VM), smaller a steadier fabric.
"""

from __future__ import annotations

import json
import random
import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from netmon.sweep.locate.fabric import Cable, Fabric, Hop, Link, Uplink
from netmon.sweep.locate.plan import PairPlan

ROOT = Path(__file__).resolve().parent.parent
STREAMS = (
    ROOT / "tests" / "fixtures" / "healthy_streams.json",
    ROOT / "tests" / "fixtures" / "healthy_streams_2.json",
)
SERIES = "large/all_reduce/16777216/default/2"
LOCAL = 5  # results each side of one that make its local level
LINE_RATE = 48e9  # bytes/s: one 400 Gb/s rail's all_reduce busbw between two nodes


def recorded_deviations(paths: Sequence[Path] = STREAMS, series: str = SERIES) -> list[float]:
    """Each conclusive result over the median of the results around it."""
    factors: list[float] = []
    for path in paths:
        stream = json.loads(path.read_text())["streams"][series]
        values = [r["busbw"] for r in stream if not r["load"] and (r["foreign_cpu"] or 0.0) < 0.25]
        for i, value in enumerate(values):
            around = values[max(0, i - LOCAL) : i] + values[i + 1 : i + LOCAL + 1]
            factors.append(value / statistics.median(around))
    return factors


@dataclass(frozen=True)
class Noise:
    deviations: tuple[float, ...]
    scale: float = 1.0

    def draw(self, rng: random.Random) -> float:
        return max(0.01, 1.0 + self.scale * (rng.choice(self.deviations) - 1.0))

    @property
    def sigma(self) -> float:
        """The scaled deviations' robust spread (1.4826 x MAD)."""
        centre = statistics.median(self.deviations)
        mad = statistics.median(abs(d - centre) for d in self.deviations)
        return 1.4826 * mad * self.scale


@dataclass(frozen=True)
class Fault:
    link: Link  # a cable or an uplink
    factor: float  # the link's rate over its healthy rate while the fault shows
    flap: float = 1.0  # the share of measurements in which it shows
    switch: str | None = None  # the leaf or spine whose every uplink this fault slows

    @property
    def kind(self) -> str:
        if self.switch is not None:
            return "switch"
        return "uplink" if isinstance(self.link, Uplink) else "node-cable"


@dataclass
class Network:
    fabric: Fabric
    faults: Sequence[Fault]
    noise: Noise
    rng: random.Random
    line_rate: float = LINE_RATE
    # Nodes of another type: their busbw over the usual type's (a pair runs at its slower end).
    speed: Mapping[str, float] = field(default_factory=dict)

    def measure(self, pairs: Sequence[PairPlan]) -> list[tuple[float, ...]]:
        """Every pair of one round at once: each one's busbw per rail."""
        load: Counter[Hop] = Counter()
        for pair in pairs:
            for rail in range(pair.rails):
                load.update(self.fabric.pair_hops(pair.nodes, rail))
        by_link = {f.link: f for f in self.faults}
        return [
            tuple(
                statistics.median(
                    self._rail(pair.nodes, rail, load, by_link) for _ in range(pair.repeats)
                )
                for rail in range(pair.rails)
            )
            for pair in pairs
        ]

    def _rail(
        self, nodes: Sequence[str], rail: int, load: Counter[Hop], by_link: dict[Link, Fault]
    ) -> float:
        """One measurement: a pair measuring `repeats` times the usual length is modelled as
        the median of that many independent ones (noise and flapping drawn for each)."""
        share = 1.0
        for hop in self.fabric.pair_hops(nodes, rail):
            share = min(share, self._health(hop.link, by_link) / load[hop])
        for node in nodes:
            share = min(share, self._health(Cable(node, rail), by_link))
        speed = min(self.speed.get(node, 1.0) for node in nodes)
        return self.line_rate * speed * share * self.noise.draw(self.rng)

    def _health(self, link: Link, by_link: dict[Link, Fault]) -> float:
        fault = by_link.get(link)
        if fault is None or self.rng.random() >= fault.flap:
            return 1.0
        return fault.factor
