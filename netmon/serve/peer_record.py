"""The node_pairs probes' verdicts as this member judged them while it led its group: the latest
verdict per probe, and how many node-pair sweeps in a row named each member and each node pair
(netmon.probe.streaks), with when a sweep last measured it.

Only the leader judges, so only the leader's streaks move; a member that took over the lead
counts from 0, and one that lost it keeps its last verdict, whose age the alerts read. Like the
GPU pairs' streaks (netmon.serve.pair_record), they live in memory only.

Not locked itself: netmon.serve.results holds one and calls it under its own lock.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

from netmon.exposition.snapshot import PeerVerdict
from netmon.probe.streaks import advance


def _pair(a: str, b: str) -> tuple[str, str]:
    return (a, b) if a <= b else (b, a)


class PeerRecord:
    def __init__(self) -> None:
        self.verdicts: dict[str, PeerVerdict] = {}

    def judged(
        self,
        probe: str,
        members: tuple[str, ...],
        suspects: tuple[str, ...],
        pair_suspects: tuple[tuple[str, str], ...],
        measured: Iterable[tuple[str, str]],
        now: float,
    ) -> None:
        """One node-pair sweep's verdict; `measured`: the node pairs it has a busbw for. A member
        is measured when one of its pairs is."""
        done = {_pair(a, b) for a, b in measured}
        named_pairs = {_pair(a, b) for a, b in pair_suspects}
        before = self.verdicts.get(probe, PeerVerdict((), (), ()))
        self.verdicts[probe] = PeerVerdict(
            members,
            suspects,
            tuple(sorted(named_pairs)),
            advance(before.streaks, {m for pair in done for m in pair}, set(suspects), now),
            advance(before.pair_streaks, done, named_pairs, now),
        )

    def reconfigure(self, probes: Collection[str]) -> None:
        """A probe a reload removed takes its verdict and streaks with it."""
        self.verdicts = {k: v for k, v in self.verdicts.items() if k in probes}
