"""The node_pairs probes' verdicts as this member judged them while it led its group: the latest
verdict per probe, and how many node-pair sweeps in a row named each member and each node pair
(netmon.probe.streaks), with when a sweep last measured it.

Only the leader judges, so only the leader's streaks move. A member that lost the lead keeps its
last verdict, whose age the alerts read; once it has followed a round of the probe that another
member led, its next sweep as leader counts from 0, as its first since it started does: the
sweeps the other leader judged in between (which may have cleared a member) are not its to count,
so a count carried over them would join two sweeps that were not in a row. Like the GPU pairs'
streaks (netmon.serve.pair_record), they live in memory only.

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
        # Probes with a round led by another member since this member last judged a sweep.
        self._followed: set[str] = set()

    def followed(self, probe: str) -> None:
        """A round of `probe` that another member leads: this member's next sweep of it as
        leader starts from empty streaks."""
        self._followed.add(probe)

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
        is measured when one of its pairs is. Streaks are kept for `members` only, so that a
        member that is no longer one leaves no series behind."""
        done = {_pair(a, b) for a, b in measured}
        named_pairs = {_pair(a, b) for a, b in pair_suspects}
        before = self.verdicts.get(probe, PeerVerdict((), (), ()))
        if probe in self._followed:
            before = PeerVerdict((), (), ())
            self._followed.discard(probe)
        streaks = advance(before.streaks, {m for pair in done for m in pair}, set(suspects), now)
        pair_streaks = advance(before.pair_streaks, done, named_pairs, now)
        current = set(members)
        self.verdicts[probe] = PeerVerdict(
            members,
            suspects,
            tuple(sorted(named_pairs)),
            {m: s for m, s in streaks.items() if m in current},
            {p: s for p, s in pair_streaks.items() if p[0] in current and p[1] in current},
        )

    def reconfigure(self, probes: Collection[str]) -> None:
        """A probe a reload removed takes its verdict and streaks with it."""
        self.verdicts = {k: v for k, v in self.verdicts.items() if k in probes}
        self._followed &= set(probes)
