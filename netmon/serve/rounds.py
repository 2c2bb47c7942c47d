"""The machinery of one group round, whatever its kind (netmon.serve.coordinator's whole-group
rounds, netmon.serve.node_pairs'): its keys in the leader's store, what each member offers,
the go a follower joins, and this member's ranks run in it.

Each round has its own epoch and key prefix (netmon/<epoch>/...) in the leader's store:
`plan` (which probe), `ready/<member>` (what each member can give now), `go` (the world, or why
the round is skipped) and `port` (where rank 0's rendezvous store listens); `netmon/current`
names the latest epoch. A member that does not answer makes the round fail fast with skip reason
`member_absent`; a crashed round leaves only its own keys behind. Every value is sealed
(netmon.group.auth): a forged or replayed one counts as missing.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import sys
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from typing import Any

from netmon.config import NetmonConfig, ProbeConfig
from netmon.group import members
from netmon.group.link import GroupError, SealedLink
from netmon.group.members import GroupConfig, Transport, World
from netmon.logs import event
from netmon.probe.build import Placement, build_spec
from netmon.probe.crossnode import INTENT_OF_TRANSPORT, transport_checked
from netmon.probe.forking import Zygote
from netmon.probe.launcher import Launcher
from netmon.probe.spec import ProbeOutcome, ProbeSpec
from netmon.serve.current import CurrentConfig
from netmon.serve.readiness import Readiness, device_keys, first_reason
from netmon.serve.results import Results
from netmon.topology.model import Topology

log = logging.getLogger(__name__)

PING_TIMEOUT_S = 0.5
CURRENT_KEY = "netmon/current"
# Rounds whose keys stay in the leader's store; older ones are deleted, so that a daemon
# running for months does not grow its store by a round's keys every interval.
ROUNDS_KEPT = 2
# Per node pair: where its rank 0 published its port, and its result.
_PAIR_KEYS = (("pair", "/port"), ("result/", ""))


class Rounds:
    """This member's side of a group's rounds: it leads them (`open_round`, `gather_ready`) or
    joins them (`joined`), offering its devices and running its ranks in either case."""

    def __init__(
        self,
        current: CurrentConfig,
        group: GroupConfig,
        me: str,
        link: SealedLink,
        readiness: Readiness,
        results: Results,
        *,
        topology: Topology | None,
        zygote: Zygote | None,
        transport: Transport,
        mnnvl_env: dict[str, str],
        seen: Callable[[], Collection[str]],
    ) -> None:
        self.current = current
        self.group = group
        self.me = me
        self.link = link
        self.readiness = readiness
        self.results = results
        self.topology = topology
        self.zygote = zygote
        # What NCCL must show between nodes, and the MNNVL setting every round's ranks get.
        self.transport = transport
        self.mnnvl_env = mnnvl_env
        # The members that answer now (the coordinator's membership): a round stops without one.
        self.seen = seen
        self.stopping = readiness.stopping
        self._epoch = 0
        self._round_keys: collections.deque[list[str]] = collections.deque()

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

    # ---- a round in the leader's store ----

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

    # ---- joining the leader's round ----

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
            seen = self.seen()
            if any(member not in seen for member in world.members):
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
