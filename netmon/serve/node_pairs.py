"""Node-pair rounds of a group: every pair of members measured alone, in rounds of disjoint pairs,
then judged against the median of all node pairs, so that a bad node or cable is named."""

from __future__ import annotations

import contextlib
import json
import logging
from typing import Any

from netmon.config import ProbeConfig
from netmon.group.link import GroupError
from netmon.group.members import World, lay_out
from netmon.logs import event
from netmon.probe.verdict import judge_pairs
from netmon.serve.rounds import Rounds
from netmon.topology.plan import plan_pair_rounds

log = logging.getLogger(__name__)


class NodePairs:
    """The node_pairs scope of a group's rounds, on the machinery of one round
    (netmon.serve.rounds)."""

    def __init__(self, rounds: Rounds) -> None:
        self.rounds = rounds

    def lead(self, probe: ProbeConfig) -> None:
        """Every pair of members, in rounds of disjoint pairs; then the same-class verdict."""
        members = sorted(self.rounds.group.members)
        busbw: dict[tuple[int, int], float] = {}
        for round_pairs in plan_pair_rounds(len(members)):
            if self.rounds.stopping.is_set():
                return
            pairs = [(members[a], members[b]) for a, b in round_pairs]
            measured = self._round(probe, pairs)
            if measured is None:
                return  # skipped: counted and logged; the sweep starts over next interval
            for (a, b), value in measured.items():
                if value is not None:
                    busbw[(members.index(a), members.index(b))] = value
        verdict = judge_pairs(busbw, dict.fromkeys(busbw, "NET"), probe.suspect_ratio)
        suspects = tuple(members[i] for i in verdict.suspect_members)
        pair_suspects = tuple((members[a], members[b]) for a, b in verdict.suspect_pairs)
        done = [(members[a], members[b]) for a, b in busbw]
        self.rounds.results.set_peer_verdict(
            probe.name, tuple(members), suspects, pair_suspects, done
        )
        event(
            log,
            "node pairs judged",
            level=logging.WARNING if suspects or pair_suspects else logging.INFO,
            group=self.rounds.group.name,
            probe=probe.name,
            pairs=len(busbw),
            verdict=verdict.describe(),
        )

    def _round(
        self, probe: ProbeConfig, pairs: list[tuple[str, str]]
    ) -> dict[tuple[str, str], float | None] | None:
        epoch, prefix = self.rounds.open_round(
            {"probe": probe.name, "pairs": [list(p) for p in pairs]}
        )
        participants = [m for pair in pairs for m in pair]
        mine: float | None = None
        with self.rounds.offer(probe) as offer:
            ready = self.rounds.gather_ready(probe, prefix, epoch, participants, offer)
            if ready is None:
                return None
            addresses = {m: str(r.get("address") or "") for m, r in ready.items()}
            worlds = [
                lay_out(pair, {m: int(ready[m]["ranks"]) for m in pair}, addresses)
                for pair in pairs
            ]
            devices_of = {m: [str(d) for d in r.get("devices", [])] for m, r in ready.items()}
            go = {"pairs": [json.loads(w.to_json()) for w in worlds], "devices": devices_of}
            self.rounds.link.put(self.rounds.me, prefix + "go", go)
            for index, world in enumerate(worlds):
                if self.rounds.me in world.members:
                    mine = self._run_pair(probe, index, world, devices_of, prefix, self.rounds.me)
        measured: dict[tuple[str, str], float | None] = {}
        for index, world in enumerate(worlds):
            low = world.members[0]
            pair = (world.members[0], world.members[1])
            if low == self.rounds.me:
                measured[pair] = mine
                continue
            try:
                report = self.rounds.link.take_result(
                    self.rounds.me,
                    prefix + f"result/{index}",
                    probe.timeout + self.rounds.group.ready_timeout,
                    sender=low,
                )
                busbw = report.get("busbw")
                measured[pair] = float(busbw) if isinstance(busbw, (int, float)) else None
            except GroupError:
                measured[pair] = None
        return measured

    def follow(
        self, leader: str, prefix: str, probe: ProbeConfig, plan: dict[str, Any], epoch: int
    ) -> None:
        # Another member leads this probe's sweeps now: the sweeps it judges are not this
        # member's to count, so a lead taken back later counts from 0. Before the bye, so that
        # every round of another leader's sweep is noted.
        self.rounds.results.peer_round_followed(probe.name)
        pairs = [tuple(pair) for pair in plan.get("pairs", [])]
        if not any(self.rounds.me in pair for pair in pairs):
            return  # sits this round out (an odd member count leaves one member a bye)
        with self.rounds.joined(leader, prefix, probe, epoch) as go:
            if go is None:
                return
            for index, raw in enumerate(go["pairs"]):
                world = World.from_json(json.dumps(raw))
                if self.rounds.me in world.members:
                    self._run_pair(probe, index, world, go.get("devices", {}), prefix, leader)

    def _run_pair(
        self,
        probe: ProbeConfig,
        index: int,
        world: World,
        devices_of: dict[str, list[str]],
        prefix: str,
        leader: str,
    ) -> float | None:
        """This member's side of one node pair; the pair's rank-0 member reports and exports."""
        port_key = prefix + f"pair{index}/port"
        low = world.members[0]
        host_of_rank0 = low == self.rounds.me
        devices = [str(d) for m in world.members for d in devices_of.get(m, [])]

        def publish(kind: str, fields: dict[str, Any]) -> None:
            if kind == "store":
                self.rounds.link.put(leader, port_key, {"port": int(fields["port"])})

        outcome = self.rounds.run_ranks(
            probe,
            world,
            devices,
            on_event=publish if host_of_rank0 else None,
            port_source=(
                None
                if host_of_rank0
                else self.rounds.port_source(leader, port_key, world.members[0])
            ),
        )
        peer = world.members[1] if host_of_rank0 else world.members[0]
        self.rounds.results.finished(probe, outcome, "node_pair", export=False)
        largest = max(outcome.results, key=lambda r: r.size_bytes, default=None)
        # No value from a failed pair, one that ran on another network than the group declares
        # or its nodes show (transport_mismatch, netmon.probe.crossnode) included: the verdict
        # leaves it out.
        value = largest.busbw_bytes_per_second if largest and outcome.ok else None
        if host_of_rank0:
            self.rounds.results.peer_measured(probe.name, peer, outcome)
            with contextlib.suppress(GroupError):
                self.rounds.link.put_result(leader, prefix + f"result/{index}", {"busbw": value})
        event(
            log,
            "node pair measured",
            level=logging.INFO if outcome.ok else logging.WARNING,
            group=self.rounds.group.name,
            probe=probe.name,
            peer=peer,
            outcome="ok" if outcome.ok else "failed",
            reason=outcome.failure.reason if outcome.failure else None,
            detail=outcome.failure.describe() if outcome.failure else None,
            busbw_gbps=round(value / 1e9, 4) if value else None,
        )
        return value
