"""Node-group rounds: the leader plans them in its store, every member runs its own ranks.

Each round has its own epoch and key prefix (netmon/<epoch>/...) in the leader's store:
`plan` (which probe), `ready/<member>` (what each member can give now), `go` (the world, or why
the round is skipped) and `port` (where rank 0's rendezvous store listens); `netmon/current`
names the latest epoch. A member that does not answer makes the round fail fast with skip reason
`member_absent`; a crashed round leaves only its own keys behind. Leadership goes to the
lowest-named member that proves it holds the group's secret (its sealed, fresh `netmon/hello`),
checked every heartbeat, so a departed leader is replaced within a heartbeat and a ping timeout.
Every value is sealed (netmon.group.auth): a forged or replayed one counts as missing.
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from netmon.config import NetmonConfig, ProbeConfig
from netmon.exposition.snapshot import GroupView
from netmon.gpu.fabric import FabricReading
from netmon.gpu.nvml_links import read_fabric
from netmon.group import members
from netmon.group.auth import Sealer
from netmon.group.link import GroupError, GroupLink, SealedLink
from netmon.group.members import RDMA_ROOT, GroupConfig, World, lay_out, leader_of, node_transport
from netmon.logs import event
from netmon.probe.build import Placement, build_spec
from netmon.probe.crossnode import INTENT_OF_TRANSPORT, transport_checked
from netmon.probe.forking import Zygote
from netmon.probe.launcher import Launcher
from netmon.probe.spec import ProbeOutcome, ProbeSpec
from netmon.serve.current import CurrentConfig
from netmon.serve.node_pairs import NodePairs
from netmon.serve.readiness import Readiness, device_keys, first_reason
from netmon.serve.results import Results
from netmon.topology.model import Topology

log = logging.getLogger(__name__)

PING_TIMEOUT_S = 0.5
HELLO_KEY = "netmon/hello"
CURRENT_KEY = "netmon/current"
# A member whose messages keep failing authentication is logged once per this many seconds.
REJECT_LOG_INTERVAL_S = 60.0
# Rounds whose keys stay in the leader's store; older ones are deleted, so that a daemon
# running for months does not grow its store by a round's keys every interval.
ROUNDS_KEPT = 2


# Per node pair: where its rank 0 published its port, and its result.
_PAIR_KEYS = (("pair", "/port"), ("result/", ""))


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
    ) -> None:
        self.current = current
        self.zygote = zygote
        self.group = group
        # What NCCL must show between nodes when the group does not say: fixed, like the backend.
        self.transport, why = node_transport(group, current.get().backend, topology, fabric, rdma)
        event(log, "group transport", group=group.name, transport=self.transport, why=why)
        self.mnnvl_env, why = members.node_mnnvl_env(current.get().backend, self.transport, fabric)
        event(log, "group mnnvl", group=group.name, env=self.mnnvl_env, why=why)
        self.me = me
        self.link = SealedLink(link, sealer, self.rejected)
        self.readiness = readiness
        self.results = results
        self.topology = topology
        self.stopping = readiness.stopping
        self.seen: set[str] = {me}
        self.leader: str | None = me
        self._next_due: dict[str, float] = {}
        self._last_epoch: dict[str, int] = {}
        self._epoch = 0
        self._round_keys: collections.deque[list[str]] = collections.deque()
        self._rejects_logged: dict[str, float] = {}
        self.node_pairs = NodePairs(self)
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

    def rejected(self, sender: str, why: str) -> None:
        """A message claimed to come from `sender` and failed authentication: count, log."""
        self.results.group_message_rejected(sender)
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

    # ---- what each member can give ----

    @contextlib.contextmanager
    def offer(self, probe: ProbeConfig) -> Iterator[dict[str, Any]]:
        """What this member can give a round now (the readiness decision), holding its devices
        while the round runs: its ranks and GPUs (one for group_one_gpu and node_pairs)."""
        spec = build_spec(probe, self.current.get(), topology=self.topology)
        local = 1 if probe.scope in ("group_one_gpu", "node_pairs") else spec.ranks
        devices = list(spec.devices[:local])
        keys = device_keys(spec)
        if local == 1 and len(spec.devices) > 1:
            # One GPU of several: whichever is idle now, so a job on the first does not keep
            # this member out of every round.
            survey = self.readiness.survey(spec.devices)
            if survey.blocked is not None or not survey.idle:
                why = (
                    survey.blocked.reason if survey.blocked else first_reason(survey.busy.values())
                )
                yield {"idle": False, "reason": why}
                return
            devices, keys = [survey.idle[0]], frozenset(survey.idle[:1])
        timeout = self.group.ready_timeout / 2
        with self.readiness.claim(keys, devices, timeout) as decision:
            if not decision.ready:
                yield {"idle": False, "reason": decision.reason}
                return
            yield {
                "idle": True,
                "ranks": local,
                "devices": devices,
                # Where this member's rank 0 would listen: the address its store is bound to,
                # which its member name may not resolve to elsewhere.
                "address": self.link.address,
            }

    # ---- leading ----

    def _lead(self, probe: ProbeConfig) -> None:
        absent = [m for m in self.group.members if m not in self.seen]
        if absent:
            self.skip(probe, "member_absent", f"no answer from {', '.join(absent)}")
            return
        if probe.scope == "node_pairs":
            self.node_pairs.lead(probe)
            return
        epoch, prefix = self.open_round({"probe": probe.name})
        with self.offer(probe) as offer:
            ready = self.gather_ready(probe, prefix, epoch, self.group.members, offer)
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

            outcome = self.run_ranks(probe, world, devices, on_event=publish, port_source=None)
            # The member that hosts rank 0 (the leader) exports the round: once per group.
            self._record(probe, outcome, export=True, epoch=epoch)

    def open_round(self, plan: dict[str, Any]) -> tuple[int, str]:
        """A new epoch with its plan, announced in `netmon/current`."""
        # Milliseconds since the epoch, so a restarted leader's rounds still come after the ones
        # its followers saw before the restart.
        self._epoch = max(self._epoch + 1, int(time.time() * 1000))
        prefix = f"netmon/{self._epoch}/"
        self._forget_old_rounds(prefix, len(plan.get("pairs", ())))
        self.link.put(self.me, prefix + "plan", plan)
        current = {"epoch": self._epoch, "leader": self.me, "t": time.time()}
        self.link.put(self.me, CURRENT_KEY, current)
        return self._epoch, prefix

    def _forget_old_rounds(self, prefix: str, pairs: int) -> None:
        """Remember the keys this round may leave in the store; delete the oldest round's."""
        names = ["plan", "go", "port", *(f"ready/{m}" for m in self.group.members)]
        names += [f"{kind}{i}{tail}" for i in range(pairs) for kind, tail in _PAIR_KEYS]
        self._round_keys.append([prefix + name for name in names])
        while len(self._round_keys) > ROUNDS_KEPT:
            for key in self._round_keys.popleft():
                with contextlib.suppress(GroupError):
                    self.link.delete(self.me, key)

    def gather_ready(
        self,
        probe: ProbeConfig,
        prefix: str,
        epoch: int,
        members: Sequence[str],
        offer: dict[str, Any],
    ) -> dict[str, dict[str, Any]] | None:
        """Every member's readiness within ready_timeout; None (skip written) if any is missing
        or cannot take part."""
        ready: dict[str, dict[str, Any]] = {}
        if self.me in members:
            ready[self.me] = offer
        missing = []
        deadline = time.monotonic() + self.group.ready_timeout
        for member in members:
            if member == self.me:
                continue
            try:
                left = max(0.1, deadline - time.monotonic())
                ready[member] = self.link.take(self.me, prefix + f"ready/{member}", left, member)
            except GroupError:
                missing.append(member)
        if missing:
            detail = f"{', '.join(missing)} did not answer round {epoch}"
            self._cancel(prefix, probe, "member_absent", detail)
            return None
        busy = {m: r.get("reason", "gpu_unknown") for m, r in ready.items() if not r["idle"]}
        if busy:
            member, reason = sorted(busy.items())[0]
            self._cancel(prefix, probe, reason, f"{member} cannot take part: {reason}")
            return None
        return ready

    def _cancel(self, prefix: str, probe: ProbeConfig, reason: str, detail: str) -> None:
        with contextlib.suppress(GroupError):
            self.link.put(self.me, prefix + "go", {"skip": reason})
        self.skip(probe, reason, detail)

    def skip(self, probe: ProbeConfig, reason: str, detail: str) -> None:
        self.results.skip(probe.name, reason)
        event(
            log,
            "group round skipped",
            level=logging.WARNING,
            group=self.group.name,
            probe=probe.name,
            outcome="skipped",
            reason=reason,
            detail=detail,
        )

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
        with self.joined(leader, prefix, probe, epoch) as go:
            if go is None:
                return
            world = World.from_json(json.dumps(go))
            outcome = self.run_ranks(
                probe,
                world,
                [str(d) for d in go.get("devices", [])],
                on_event=None,
                port_source=self.port_source(leader, prefix + "port"),
            )
            self._record(probe, outcome, export=False, epoch=epoch)

    @contextlib.contextmanager
    def joined(
        self, leader: str, prefix: str, probe: ProbeConfig, epoch: int
    ) -> Iterator[dict[str, Any] | None]:
        """A follower's side of a round: offer what this member can give, then the leader's go,
        the devices held until the round is over; None (the skip counted) when the leader
        skipped the round or stopped answering."""
        with self.offer(probe) as offer:
            try:
                self.link.put(leader, prefix + f"ready/{self.me}", offer)
                go = self.link.take(leader, prefix + "go", self.group.ready_timeout + 2.0, leader)
            except GroupError as exc:
                self.skip(probe, "member_absent", f"leader {leader} stopped answering: {exc}")
                yield None
                return
            if "skip" in go:
                self.skip(probe, str(go["skip"]), f"the leader {leader} skipped round {epoch}")
                yield None
                return
            yield go

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

    def port_source(
        self, leader: str, key: str, sender: str | None = None
    ) -> Callable[[], int | None]:
        next_try = [0.0]

        def port() -> int | None:
            if time.monotonic() < next_try[0]:
                return None
            next_try[0] = time.monotonic() + 0.2
            try:
                if not self.link.check(leader, key, PING_TIMEOUT_S):
                    return None
                return int(self.link.take(leader, key, PING_TIMEOUT_S, sender or leader)["port"])
            except (GroupError, ValueError, KeyError, TypeError):
                return None

        return port

    # ---- running this member's ranks ----

    def _group_spec(
        self, probe: ProbeConfig, config: NetmonConfig, world: World, devices: list[str]
    ) -> ProbeSpec:
        nccl = (config.backend or "gloo") == "nccl"
        placement = Placement(
            devices=tuple(devices) if nccl and len(devices) == world.size else (),
            ranks=world.size,
            host=world.host,
            reporters=world.reporters,
            local_ranks=world.ranks_of[self.me],
            env=members.round_env(self.group.interface, self.mnnvl_env),
            label="group",
            intent=INTENT_OF_TRANSPORT[self.transport],
        )
        return build_spec(probe, config, placement=placement, topology=self.topology)

    def run_ranks(
        self,
        probe: ProbeConfig,
        world: World,
        devices: list[str],
        on_event: Callable[[str, dict[str, Any]], None] | None,
        port_source: Callable[[], int | None] | None,
    ) -> ProbeOutcome:
        config = self.current.get()
        spec = self._group_spec(probe, config, world, devices)
        self.results.started(probe.name)
        local = world.ranks_of[self.me]
        mine = [spec.devices[rank] for rank in local] if spec.devices else []
        local_abort = self.readiness.abort_check(mine)

        def abort() -> str | None:
            # A member that left mid-round: stop now rather than wait for a deadline.
            if any(member not in self.seen for member in world.members):
                return "member_absent"
            return local_abort()

        launcher = Launcher(
            spec,
            abort=abort,
            on_event=on_event,
            local_ranks=local,
            port_source=port_source,
            python=config.rank_python or sys.executable,
            zygote=self.zygote,
        )
        return transport_checked(launcher.run())

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
