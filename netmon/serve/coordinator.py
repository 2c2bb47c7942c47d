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
import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from netmon.config import NetmonConfig, ProbeConfig
from netmon.gpu import idle
from netmon.group.auth import Sealer
from netmon.group.link import GroupError, GroupLink, SealedLink
from netmon.group.members import GroupConfig, World, lay_out, leader_of
from netmon.logs import event
from netmon.probe.launcher import Launcher
from netmon.probe.spec import ProbeOutcome, ProbeSpec
from netmon.probe.verdict import judge_pairs
from netmon.serve.results import GroupView, Results
from netmon.serve.runner import DeviceLocks, ProbeRunner, device_keys, spec_for
from netmon.topology.model import plan_pair_rounds

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
        config: NetmonConfig,
        group: GroupConfig,
        me: str,
        link: GroupLink,
        sealer: Sealer,
        runner: ProbeRunner,
        results: Results,
        locks: DeviceLocks,
        stopping: threading.Event,
    ) -> None:
        self.config = config
        self.group = group
        self.me = me
        self.link = SealedLink(link, sealer, self.rejected)
        self.runner = runner
        self.results = results
        self.locks = locks
        self.stopping = stopping
        self.probes = {p.name: p for p in config.probes or () if p.scope != "local"}
        self.seen: set[str] = {me}
        self.leader: str | None = me
        self._next_due = {name: time.monotonic() + 2.0 for name in self.probes}
        self._last_epoch: dict[str, int] = {}
        self._epoch = 0
        self._round_keys: collections.deque[list[str]] = collections.deque()
        self._rejects_logged: dict[str, float] = {}
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

    def reconfigure(self, config: NetmonConfig) -> None:
        self.config = config
        self.probes = {p.name: p for p in config.probes or () if p.scope != "local"}
        for name in self.probes:
            self._next_due.setdefault(name, time.monotonic() + 2.0)

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
            for name, probe in self.probes.items():
                if time.monotonic() >= self._next_due[name] and not self.stopping.is_set():
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

    def _local_ranks(self, probe: ProbeConfig) -> int:
        if probe.scope in ("group_one_gpu", "node_pairs"):
            return 1
        spec = spec_for(probe, self.config)
        return spec.ranks

    def _readiness(self, probe: ProbeConfig, got_lock: bool) -> dict[str, Any]:
        if not got_lock:
            return {"idle": False, "reason": "devices_busy"}
        if self.runner.paused():
            return {"idle": False, "reason": "paused"}
        spec = spec_for(probe, self.config)
        devices = spec.devices[: self._local_ranks(probe)]
        decision = idle.check(self.runner.idle_source, devices, {os.getpid()}, self.config.idle)
        if not decision.idle:
            return {"idle": False, "reason": decision.reason or "gpu_unknown"}
        return {
            "idle": True,
            "ranks": self._local_ranks(probe),
            "devices": list(devices),
            # Where this member's rank 0 would listen: the address its store is bound to, which
            # its member name may not resolve to elsewhere.
            "address": self.link.link.host,
        }

    # ---- leading ----

    def _lead(self, probe: ProbeConfig) -> None:
        absent = [m for m in self.group.members if m not in self.seen]
        if absent:
            self._skip(probe, "member_absent", f"no answer from {', '.join(absent)}")
            return
        if probe.scope == "node_pairs":
            self._lead_pairs(probe)
            return
        epoch, prefix = self._open_round({"probe": probe.name})
        spec = spec_for(probe, self.config)
        with self.locks.hold(device_keys(spec), timeout=self.group.ready_timeout / 2) as got:
            ready = self._gather_ready(probe, prefix, epoch, self.group.members, got)
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

            outcome = self._run(probe, world, devices, on_event=publish, port_source=None)
            # The member that hosts rank 0 (the leader) exports the round: once per group.
            self._record(probe, outcome, export=True, epoch=epoch)

    def _open_round(self, plan: dict[str, Any]) -> tuple[int, str]:
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

    # ---- node pairs ----

    def _lead_pairs(self, probe: ProbeConfig) -> None:
        """Every pair of members, in rounds of disjoint pairs; then the same-class verdict."""
        members = sorted(self.group.members)
        busbw: dict[tuple[int, int], float] = {}
        for round_pairs in plan_pair_rounds(len(members)):
            if self.stopping.is_set():
                return
            pairs = [(members[a], members[b]) for a, b in round_pairs]
            measured = self._lead_pair_round(probe, pairs)
            if measured is None:
                return  # skipped: counted and logged; the sweep starts over next interval
            for (a, b), value in measured.items():
                if value is not None:
                    busbw[(members.index(a), members.index(b))] = value
        verdict = judge_pairs(busbw, dict.fromkeys(busbw, "NET"), probe.suspect_ratio)
        suspects = tuple(members[i] for i in verdict.suspect_members)
        pair_suspects = tuple((members[a], members[b]) for a, b in verdict.suspect_pairs)
        self.results.set_peer_verdict(probe.name, tuple(members), suspects, pair_suspects)
        event(
            log,
            "node pairs judged",
            level=logging.WARNING if suspects or pair_suspects else logging.INFO,
            group=self.group.name,
            probe=probe.name,
            pairs=len(busbw),
            verdict=verdict.describe(),
        )

    def _lead_pair_round(
        self, probe: ProbeConfig, pairs: list[tuple[str, str]]
    ) -> dict[tuple[str, str], float | None] | None:
        epoch, prefix = self._open_round({"probe": probe.name, "pairs": [list(p) for p in pairs]})
        participants = [m for pair in pairs for m in pair]
        spec = spec_for(probe, self.config)
        mine: float | None = None
        with self.locks.hold(device_keys(spec), timeout=self.group.ready_timeout / 2) as got:
            ready = self._gather_ready(probe, prefix, epoch, participants, got)
            if ready is None:
                return None
            addresses = {m: str(r.get("address") or "") for m, r in ready.items()}
            worlds = [
                lay_out(pair, {m: int(ready[m]["ranks"]) for m in pair}, addresses)
                for pair in pairs
            ]
            devices_of = {m: [str(d) for d in r.get("devices", [])] for m, r in ready.items()}
            go = {"pairs": [json.loads(w.to_json()) for w in worlds], "devices": devices_of}
            self.link.put(self.me, prefix + "go", go)
            for index, world in enumerate(worlds):
                if self.me in world.members:
                    mine = self._run_pair(probe, index, world, devices_of, prefix, self.me)
        measured: dict[tuple[str, str], float | None] = {}
        for index, world in enumerate(worlds):
            low = world.members[0]
            pair = (world.members[0], world.members[1])
            if low == self.me:
                measured[pair] = mine
                continue
            try:
                report = self.link.take(
                    self.me,
                    prefix + f"result/{index}",
                    probe.timeout + self.group.ready_timeout,
                    sender=low,
                )
                busbw = report.get("busbw")
                measured[pair] = float(busbw) if isinstance(busbw, (int, float)) else None
            except GroupError:
                measured[pair] = None
        return measured

    def _follow_pairs(
        self, leader: str, prefix: str, probe: ProbeConfig, plan: dict[str, Any], epoch: int
    ) -> None:
        pairs = [tuple(pair) for pair in plan.get("pairs", [])]
        if not any(self.me in pair for pair in pairs):
            return  # sits this round out (an odd member count leaves one member a bye)
        spec = spec_for(probe, self.config)
        with self.locks.hold(device_keys(spec), timeout=self.group.ready_timeout / 2) as got:
            go = self._answer_plan(leader, prefix, probe, got)
            if go is None:
                return
            if "skip" in go:
                self._skip(probe, str(go["skip"]), f"the leader {leader} skipped round {epoch}")
                return
            for index, raw in enumerate(go["pairs"]):
                world = World.from_json(json.dumps(raw))
                if self.me in world.members:
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
        host_of_rank0 = world.members[0] == self.me
        devices = [str(d) for m in world.members for d in devices_of.get(m, [])]

        def publish(kind: str, fields: dict[str, Any]) -> None:
            if kind == "store":
                self.link.put(leader, port_key, {"port": int(fields["port"])})

        outcome = self._run(
            probe,
            world,
            devices,
            on_event=publish if host_of_rank0 else None,
            port_source=(
                None if host_of_rank0 else self._port_source(leader, port_key, world.members[0])
            ),
        )
        peer = world.members[1] if host_of_rank0 else world.members[0]
        self.results.finished(probe, outcome, "node_pair", export=False)
        largest = max(outcome.results, key=lambda r: r.size_bytes, default=None)
        value = largest.busbw_bytes_per_second if largest and outcome.ok else None
        if host_of_rank0:
            self.results.peer_measured(probe.name, peer, outcome)
            with contextlib.suppress(GroupError):
                self.link.put(leader, prefix + f"result/{index}", {"busbw": value})
        event(
            log,
            "node pair measured",
            level=logging.INFO if outcome.ok else logging.WARNING,
            group=self.group.name,
            probe=probe.name,
            peer=peer,
            outcome="ok" if outcome.ok else "failed",
            busbw_gbps=round(value / 1e9, 4) if value else None,
        )
        return value

    def _gather_ready(
        self, probe: ProbeConfig, prefix: str, epoch: int, members: Sequence[str], got_lock: bool
    ) -> dict[str, dict[str, Any]] | None:
        """Every member's readiness within ready_timeout; None (skip written) if any is missing
        or cannot take part."""
        ready: dict[str, dict[str, Any]] = {}
        if self.me in members:
            ready[self.me] = self._readiness(probe, got_lock)
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
        self._skip(probe, reason, detail)

    def _skip(self, probe: ProbeConfig, reason: str, detail: str) -> None:
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
        probe = self.probes.get(str(plan.get("probe")))
        if probe is None or self._too_late(leader, prefix, epoch):
            return
        if "pairs" in plan:
            self._follow_pairs(leader, prefix, probe, plan, epoch)
            return
        spec = spec_for(probe, self.config)
        with self.locks.hold(device_keys(spec), timeout=self.group.ready_timeout / 2) as got:
            go = self._answer_plan(leader, prefix, probe, got)
            if go is None:
                return
            if "skip" in go:
                self._skip(probe, str(go["skip"]), f"the leader {leader} skipped round {epoch}")
                return
            world = World.from_json(json.dumps(go))
            outcome = self._run(
                probe,
                world,
                [str(d) for d in go.get("devices", [])],
                on_event=None,
                port_source=self._port_source(leader, prefix + "port"),
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

    def _answer_plan(
        self, leader: str, prefix: str, probe: ProbeConfig, got_lock: bool
    ) -> dict[str, Any] | None:
        """Tell the leader what this member can give; its go (or skip), or None when it never
        came (the skip is counted here)."""
        try:
            self.link.put(leader, prefix + f"ready/{self.me}", self._readiness(probe, got_lock))
            return self.link.take(leader, prefix + "go", self.group.ready_timeout + 2.0, leader)
        except GroupError as exc:
            self._skip(probe, "member_absent", f"leader {leader} stopped answering: {exc}")
            return None

    def _port_source(
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

    def _group_spec(self, probe: ProbeConfig, world: World, devices: list[str]) -> ProbeSpec:
        base = spec_for(probe, self.config)
        env = dict(base.env)
        if self.group.interface:
            env.setdefault("GLOO_SOCKET_IFNAME", self.group.interface)
            env.setdefault("NCCL_SOCKET_IFNAME", self.group.interface)
        nccl = base.backend == "nccl"
        return base.model_copy(
            update={
                "ranks": world.size,
                "devices": tuple(devices) if nccl and len(devices) == world.size else (),
                "host": world.host,
                "reporters": world.reporters,
                "env": tuple(sorted(env.items())),
                "path": "group",
            }
        )

    def _run(
        self,
        probe: ProbeConfig,
        world: World,
        devices: list[str],
        on_event: Callable[[str, dict[str, Any]], None] | None,
        port_source: Callable[[], int | None] | None,
    ) -> ProbeOutcome:
        spec = self._group_spec(probe, world, devices)
        self.results.started(probe.name)
        local_abort = self.runner._abort_check(spec.devices)

        def abort() -> str | None:
            # A member that left mid-round: stop now rather than wait for a deadline.
            if any(member not in self.seen for member in world.members):
                return "member_absent"
            return local_abort()

        launcher = Launcher(
            spec,
            abort=abort,
            on_event=on_event,
            local_ranks=world.ranks_of[self.me],
            port_source=port_source,
            python=self.config.rank_python or _python(),
        )
        return launcher.run()

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


def _python() -> str:
    import sys

    return sys.executable
