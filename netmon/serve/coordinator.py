"""Node-group rounds: the leader plans them in its store, every member runs its own ranks.

Here the group's membership and leadership, the rounds' schedule, and whole-group rounds; the
machinery of one round (its keys in the leader's store, each member's offer, the go) is
netmon.serve.rounds', node-pair rounds are netmon.serve.node_pairs'. Leadership goes to the
lowest-named member that proves it holds the group's secret (its sealed, fresh `netmon/hello`),
checked every heartbeat, so a departed leader is replaced within a heartbeat and a ping timeout.
Every value is sealed (netmon.group.auth): a forged or replayed one counts as missing.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from netmon.config import ProbeConfig
from netmon.exposition.snapshot import GroupView
from netmon.gpu.fabric import FabricReading
from netmon.gpu.nvml_links import read_fabric
from netmon.group import members
from netmon.group.auth import Sealer
from netmon.group.keys import GroupKeys, key_files, load_keys, stamp_of
from netmon.group.link import GroupError, GroupLink, SealedLink
from netmon.group.members import RDMA_ROOT, GroupConfig, World, lay_out, leader_of, node_transport
from netmon.logs import event
from netmon.probe.forking import Zygote
from netmon.probe.spec import ProbeOutcome
from netmon.serve.current import CurrentConfig
from netmon.serve.node_pairs import NodePairs
from netmon.serve.readiness import Readiness
from netmon.serve.results import Results
from netmon.serve.rounds import CURRENT_KEY, PING_TIMEOUT_S, Rounds
from netmon.topology.model import Topology

log = logging.getLogger(__name__)

HELLO_KEY = "netmon/hello"
# A member whose messages keep failing authentication is logged once per this many seconds.
REJECT_LOG_INTERVAL_S = 60.0


class Coordinator:
    def __init__(
        self,
        current: CurrentConfig,
        group: GroupConfig,
        me: str,
        link: GroupLink,
        sealer: Sealer,
        readiness: Readiness,
        results: Results,
        topology: Topology | None = None,
        zygote: Zygote | None = None,
        fabric: Callable[[], Sequence[FabricReading]] = read_fabric,
        rdma: Path = RDMA_ROOT,
        keys: GroupKeys | None = None,
    ) -> None:
        self.current = current
        self.group = group
        # What NCCL must show between nodes when the group does not say: fixed, like the backend.
        transport, why = node_transport(group, current.get().backend, topology, fabric, rdma)
        event(log, "group transport", group=group.name, transport=transport, why=why)
        mnnvl_env, why = members.node_mnnvl_env(current.get().backend, transport, fabric)
        event(log, "group mnnvl", group=group.name, env=mnnvl_env, why=why)
        self.me = me
        self.link = SealedLink(
            link,
            sealer,
            self.rejected,
            signer=keys.signer if keys else None,
            verifier=keys.verifier if keys else None,
        )
        self.keys_stamp = keys.stamp if keys else None
        self.results = results
        self.stopping = readiness.stopping
        self.seen: set[str] = {me}
        self.leader: str | None = me
        self._next_due: dict[str, float] = {}
        self._last_epoch: dict[str, int] = {}
        self._rejects_logged: dict[str, float] = {}
        self.rounds = Rounds(
            current,
            group,
            me,
            self.link,
            readiness,
            results,
            topology=topology,
            zygote=zygote,
            transport=transport,
            mnnvl_env=mnnvl_env,
            seen=lambda: self.seen,
        )
        self.node_pairs = NodePairs(self.rounds)
        # Membership is checked on its own thread, so a round in progress never delays noticing
        # that a member left (and a round with an absent member is stopped).
        self._threads = [
            threading.Thread(
                target=self._every, args=(self._refresh_members,), name="group-members", daemon=True
            ),
            threading.Thread(
                target=self._every, args=(self._rounds,), name="group-rounds", daemon=True
            ),
        ]

    def probes(self) -> dict[str, ProbeConfig]:
        """The group's probes in the running configuration (a reload takes effect here)."""
        return {p.name: p for p in self.current.probes() if p.scope != "local"}

    def start(self) -> None:
        self._refresh_members()
        for thread in self._threads:
            thread.start()

    def join(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    # ---- the loops ----

    def _every(self, step: Callable[[], None]) -> None:
        while not self.stopping.is_set():
            started = time.monotonic()
            try:
                step()
            except Exception:  # a bug here must not end group work for good
                log.exception("group %s: internal error", self.group.name)
            self.stopping.wait(max(0.0, self.group.heartbeat - (time.monotonic() - started)))

    def _rounds(self) -> None:
        if self.leader == self.me:
            for name, probe in self.probes().items():
                due = self._next_due.setdefault(name, time.monotonic() + 2.0)
                if time.monotonic() >= due and not self.stopping.is_set():
                    self._next_due[name] = time.monotonic() + probe.interval
                    self._lead(probe)
        elif self.leader is not None:
            self._follow(self.leader)

    def _refresh_members(self) -> None:
        with contextlib.suppress(GroupError):
            self.link.put(self.me, HELLO_KEY, {"member": self.me, "t": time.time()})
        others = [m for m in self.group.members if m != self.me]
        with ThreadPoolExecutor(max_workers=max(1, len(others))) as pool:
            answers = list(pool.map(self._proves_membership, others))
        seen = {self.me, *(m for m, up in zip(others, answers, strict=True) if up)}
        leader = leader_of(sorted(seen))
        if seen != self.seen or leader != self.leader:
            gone, back = sorted(self.seen - seen), sorted(seen - self.seen)
            event(
                log,
                "group membership",
                level=logging.WARNING if gone else logging.INFO,
                group=self.group.name,
                leader=leader,
                seen=",".join(sorted(seen)),
                absent=",".join(gone),
                returned=",".join(back),
            )
        self.seen, self.leader = seen, leader
        self.results.set_group(
            GroupView(self.group.name, self.group.members, tuple(sorted(seen)), leader, self.me)
        )

    def _proves_membership(self, member: str) -> bool:
        """The member answers with a fresh hello sealed with the group's secret."""
        try:
            self.link.take(
                member, HELLO_KEY, PING_TIMEOUT_S, member, fresh=True, expect={"member": member}
            )
        except GroupError:
            return False
        return True

    def rekey(self) -> bool:
        """SIGHUP: the group's key files read again when their contents changed (a key rotated
        in place); UsageError, and the running keys kept, when one is unreadable or wrong."""
        if stamp_of(key_files(self.group)) == self.keys_stamp:
            return False
        keys = load_keys(self.group)
        self.link.link.rekey(keys.secret)
        self.link.sealer, self.link.signer, self.link.verifier = (
            keys.sealer,
            keys.signer,
            keys.verifier,
        )
        self.keys_stamp = keys.stamp
        event(log, "group keys reloaded", group=self.group.name, files=len(key_files(self.group)))
        return True

    def rejected(self, sender: str, why: str, reason: str | None = None) -> None:
        """A message claimed to come from `sender` and failed authentication: count, log. A
        result not signed by its member is counted by `reason` too."""
        self.results.group_message_rejected(sender)
        if reason is not None:
            self.results.group_result_refused(sender, reason)
        now = time.monotonic()
        if now - self._rejects_logged.get(sender, -REJECT_LOG_INTERVAL_S) >= REJECT_LOG_INTERVAL_S:
            self._rejects_logged[sender] = now
            event(
                log,
                "group message rejected",
                level=logging.WARNING,
                group=self.group.name,
                member=sender,
                detail=why,
            )

    # ---- leading ----

    def _lead(self, probe: ProbeConfig) -> None:
        absent = [m for m in self.group.members if m not in self.seen]
        if absent:
            self.rounds.skip(probe, "member_absent", f"no answer from {', '.join(absent)}")
            return
        if probe.scope == "node_pairs":
            self.node_pairs.lead(probe)
            return
        epoch, prefix = self.rounds.open_round({"probe": probe.name})
        with self.rounds.offer(probe) as offer:
            ready = self.rounds.gather_ready(probe, prefix, epoch, self.group.members, offer)
            if ready is None:
                return
            world = lay_out(
                self.group.members,
                {m: int(r["ranks"]) for m, r in ready.items()},
                {m: str(r.get("address") or "") for m, r in ready.items()},
            )
            devices = [str(d) for m in world.members for d in ready[m].get("devices", [])]
            plan = json.loads(world.to_json())
            plan["devices"] = devices
            self.link.put(self.me, prefix + "go", plan)

            def publish(kind: str, fields: dict[str, Any]) -> None:
                if kind == "store":
                    self.link.put(self.me, prefix + "port", {"port": int(fields["port"])})

            outcome = self.rounds.run_ranks(
                probe, world, devices, on_event=publish, port_source=None
            )
            # The member that hosts rank 0 (the leader) exports the round: once per group.
            self._record(probe, outcome, export=True, epoch=epoch)

    # ---- following ----

    def _follow(self, leader: str) -> None:
        try:
            if not self.link.check(leader, CURRENT_KEY, PING_TIMEOUT_S):
                return
            current = self.link.take(
                leader, CURRENT_KEY, PING_TIMEOUT_S, leader, fresh=True, expect={"leader": leader}
            )
            epoch = int(current["epoch"])
        except (GroupError, ValueError, KeyError, TypeError):
            return
        if epoch <= self._last_epoch.get(leader, 0):
            return
        self._last_epoch[leader] = epoch
        prefix = f"netmon/{epoch}/"
        try:
            plan = self.link.take(leader, prefix + "plan", 1.0, leader)
        except GroupError:
            return
        probe = self.probes().get(str(plan.get("probe")))
        if probe is None or self._too_late(leader, prefix, epoch):
            return
        if "pairs" in plan:
            self.node_pairs.follow(leader, prefix, probe, plan, epoch)
            return
        with self.rounds.joined(leader, prefix, probe, epoch) as go:
            if go is None:
                return
            world = World.from_json(json.dumps(go))
            outcome = self.rounds.run_ranks(
                probe,
                world,
                [str(d) for d in go.get("devices", [])],
                on_event=None,
                port_source=self.rounds.port_source(leader, prefix + "port"),
            )
            self._record(probe, outcome, export=False, epoch=epoch)

    def _too_late(self, leader: str, prefix: str, epoch: int) -> bool:
        """The leader decided this round without us (a member that just started or rejoined):
        ranks joining it now would only disturb the ranks already rendezvousing."""
        try:
            decided = self.link.check(leader, prefix + "go", PING_TIMEOUT_S)
        except GroupError:
            return True
        if decided:
            log.info(
                "group %s: round %s was decided before this member saw it", self.group.name, epoch
            )
        return decided

    def _record(self, probe: ProbeConfig, outcome: ProbeOutcome, export: bool, epoch: int) -> None:
        self.results.finished(probe, outcome, "group", export=export)
        fields: dict[str, Any] = dict(
            group=self.group.name, probe=probe.name, epoch=epoch, wall_s=round(outcome.wall_s, 3)
        )
        if outcome.failure is not None:
            event(
                log,
                "group round failed",
                level=logging.WARNING,
                outcome="failed",
                reason=outcome.failure.reason,
                detail=outcome.failure.describe(),
                **fields,
            )
            return
        largest = max(outcome.results, key=lambda r: r.size_bytes, default=None)
        if largest is not None:
            fields["busbw_gbps"] = round(largest.busbw_bytes_per_second / 1e9, 4)
        event(log, "group round ok", outcome="ok", **fields)
