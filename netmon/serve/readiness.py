"""The one decision whether a probe may start now, and whether a running one must stop: the
daemon is not stopping, the operator has not paused the node or these GPUs, the probe holds its
devices, and NVML (and the kubelet) show them idle. Local runs, pair sweeps and group rounds all
ask here; a survey says which of several GPUs are idle, for probes that run on whatever is."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Collection, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

from netmon.gpu import idle, idle_sources
from netmon.gpu.compat import FAULT_REASONS
from netmon.probe.launcher import AbortCheck
from netmon.probe.processes import descends_from
from netmon.probe.spec import ProbeSpec
from netmon.serve.current import CurrentConfig
from netmon.serve.pausing import Pause, read_pause
from netmon.topology.model import Topology

# How often a running probe re-reads NVML for foreign processes (the pause file is checked at
# every launcher poll, as a stat is cheap).
FOREIGN_CHECK_S = 0.5
# NVML averages a GPU's utilization over a sample period of 1/6 s to 1 s, by product (nvml.h,
# nvmlDeviceGetUtilizationRates): a GPU one of our probes left this long ago may still read
# busy with no process on it, and that load is ours. A margin over the longest period.
OWN_LOAD_S = 1.5
# How long a claim or a survey waits for ranks of our own last probe that are still on its GPUs
# (exiting after their result was in) before it skips them as `own_probe`.
OWN_EXIT_S = 5.0
OWN_EXIT_POLL_S = 0.1


@dataclass(frozen=True)
class Decision:
    """May the probe start: `ready`, or the counted skip `reason` with a detail for the log."""

    ready: bool
    reason: str = ""
    detail: str = ""


@dataclass(frozen=True)
class Survey:
    """Which of some GPUs may be probed now: `blocked` when none may (the daemon stops, the node
    is paused), else `busy` maps each GPU that may not to its skip reason."""

    devices: tuple[str, ...]
    blocked: Decision | None = None
    busy: dict[str, str] = field(default_factory=dict)
    detail: str = ""

    @property
    def idle(self) -> tuple[str, ...]:
        if self.blocked is not None:
            return ()
        return tuple(d for d in self.devices if d not in self.busy)


def device_keys(spec: ProbeSpec) -> frozenset[str]:
    """What two probes must not share at once: GPUs, or for CPU ranks the host's CPUs."""
    return frozenset(spec.devices) if spec.backend == "nccl" else frozenset({"cpu"})


class DeviceLocks:
    """Exclusive use of device sets, first come first served.

    A probe waits until none of its devices is held and no earlier waiter wants one of them, so a
    frequent probe cannot starve a rare one that shares its devices.
    """

    def __init__(self) -> None:
        self._held: set[str] = set()
        self._queue: list[tuple[int, frozenset[str]]] = []
        self._tickets = 0
        self._changed = threading.Condition()

    def held(self) -> frozenset[str]:
        with self._changed:
            return frozenset(self._held)

    def waiting(self) -> tuple[frozenset[str], ...]:
        """The device sets probes wait for now, first come first."""
        with self._changed:
            return tuple(keys for _, keys in sorted(self._queue, key=lambda t: t[0]))

    def wait_unwanted(self, keys: frozenset[str], timeout: float) -> bool:
        """Wait until no probe holds or waits for any of `keys`; False at the timeout."""

        def free() -> bool:
            return not (self._held & keys) and not any(k & keys for _, k in self._queue)

        with self._changed:
            return self._changed.wait_for(free, timeout=timeout)

    def _may_take(self, ticket: int, keys: frozenset[str]) -> bool:
        if self._held & keys:
            return False
        earlier = (k for t, k in self._queue if t < ticket)
        return not any(other & keys for other in earlier)

    @contextmanager
    def hold(self, keys: frozenset[str], timeout: float) -> Iterator[bool]:
        with self._changed:
            self._tickets += 1
            ticket = (self._tickets, keys)
            self._queue.append(ticket)
            got = self._changed.wait_for(lambda: self._may_take(*ticket), timeout=timeout)
            self._queue.remove(ticket)
            if got:
                self._held |= keys
            self._changed.notify_all()
        try:
            yield got
        finally:
            if got:
                with self._changed:
                    self._held -= keys
                    self._changed.notify_all()


class Readiness:
    def __init__(
        self,
        current: CurrentConfig,
        locks: DeviceLocks,
        idle_source: idle.IdleSource,
        stopping: threading.Event,
        topology: Topology | None = None,
    ) -> None:
        self.current = current
        self.topology = topology  # how a GPU's index and UUID name the same GPU in a pause
        self.locks = locks
        self.idle_source = idle_source
        self.stopping = stopping
        self.foreign_check_s = FOREIGN_CHECK_S
        # GPUs on which a job appeared while we probed them: off limits to every probe and every
        # launcher at once, until the full idle check of a later claim finds them idle again.
        self._preempted: dict[str, str] = {}
        self._preempted_lock = threading.Lock()
        # When our last probe on each GPU (its lock key) let go of it: its utilization lingers.
        self._released: dict[str, float] = {}
        # Why no rank may start on this node at all (netmon.gpu.compat), found at start.
        self.fault: Decision | None = None

    def pause(self) -> Pause:
        config = self.current.get()
        return read_pause(config.pause_file, config.pause_dir)

    def paused(self) -> bool:
        """Whether the whole node is paused."""
        return self.pause().node is not None

    def _names(self, device: str) -> tuple[str, ...]:
        """Every id a pause file may give this GPU: its NVML index and its UUID."""
        if self.topology is None:
            return (device,)
        for gpu in self.topology.gpus:
            if device in (str(gpu.index), gpu.uuid) or device.lower() == (gpu.uuid or "").lower():
                return (str(gpu.index), *((gpu.uuid,) if gpu.uuid else ()))
        return (device,)

    def _lock_keys(self, keys: frozenset[str]) -> frozenset[str]:
        """One key per GPU however it is named (a pair names it by index, a probe maybe by
        UUID), so two probes on one GPU always exclude each other."""
        return frozenset(self._names(key)[0] for key in keys)

    def _paused_gpus(self, pause: Pause, devices: Sequence[str]) -> dict[str, str]:
        found = {d: pause.covers(self._names(d)) for d in devices}
        return {d: why for d, why in found.items() if why is not None}

    def _blocked(self) -> Decision | None:
        if self.stopping.is_set():
            return Decision(False, "shutting_down", "the daemon is stopping")
        pause = self.pause()
        if pause.node is not None:
            return Decision(False, "paused", pause.node)
        return self.fault

    @contextmanager
    def claim(
        self,
        keys: frozenset[str],
        devices: Sequence[str],
        lock_timeout: float,
        samples: int | None = None,
    ) -> Iterator[Decision]:
        """Decide, holding the devices `keys` while the caller runs when ready; `devices` are
        the GPUs that must be idle (all of them, or the ones this node gives to a round).
        `samples` overrides the idle policy's, for a claim right after a survey."""
        blocked = self._blocked()
        if blocked is not None:
            yield blocked
            return
        paused = self._paused_gpus(self.pause(), devices)
        if paused:
            yield Decision(False, "paused", "; ".join(paused.values()))
            return
        with self.locks.hold(self._lock_keys(keys), timeout=lock_timeout) as got:
            if not got:
                yield Decision(False, "devices_busy", "another probe holds the devices")
                return
            found = self._idle_check(devices, samples)
            if not found.idle:
                why = first_reason(found.busy.values()) or found.reason or "gpu_unknown"
                yield Decision(False, why, found.detail)
                return
            self._forgive(devices)
            try:
                yield Decision(True)
            finally:
                self._note_released(devices)

    def await_own_probes(self, devices: Sequence[str], timeout: float) -> None:
        """Wait, up to `timeout` or the daemon's stop, until none of our other probes holds or
        waits for any of `devices`. A survey (a pair sweep, `gpus: idle`) takes the GPUs that
        are free at once: one that starts while a collective runs on them, as it does whenever
        the two share an interval, would find every GPU devices_busy, every time."""
        keys = self._lock_keys(frozenset(devices))
        deadline = time.monotonic() + timeout
        while not self.stopping.is_set():
            left = deadline - time.monotonic()
            if left <= 0 or self.locks.wait_unwanted(keys, min(left, 0.5)):
                return

    def _idle_check(self, devices: Sequence[str], samples: int | None) -> idle.IdleDecision:
        """The idle check of `devices`, netmon's own processes apart: ranks of our last probe
        still on a GPU (exiting) are waited for up to OWN_EXIT_S and are never a job; the
        utilization they leave is ours (`_own_load`). Still there after that: `own_probe`."""
        if not devices:
            return idle.IdleDecision(idle=True, reason=None, detail="no GPUs used", busy={})
        policy = self.current.get().idle
        if samples is not None:
            policy = policy.model_copy(update={"samples": samples})
        deadline = time.monotonic() + OWN_EXIT_S
        while True:
            try:
                readings = idle_sources.sample(self.idle_source, policy)
            except idle.IdleSourceError as exc:
                return idle.source_failed(devices, exc)
            flat = [r for taken in readings for r in taken]
            own = own_of(flat)
            lingering = self._own_on(flat, devices, own)
            # A PID NVML listed that has no /proc entry a moment later exited in between (a rank
            # of ours, most often): read again rather than call it a job. One that stays listed
            # is a job, or a PID namespace that compat.node_fault should have refused.
            vanished = _listing(flat, devices, exited(flat, own))
            if not (lingering or vanished) or time.monotonic() >= deadline:
                break
            if self.stopping.wait(OWN_EXIT_POLL_S):
                break
        found = idle.decide(readings, devices, own, policy, self._own_load(devices))
        return _with_own_probes(found, lingering)

    def _own_on(
        self, reading: Sequence[idle.GpuReading], devices: Sequence[str], own: set[int]
    ) -> frozenset[str]:
        """Which of `devices` list a process of ours (besides the daemon) in `reading`; noted,
        as their utilization is ours for a while after."""
        seen = _listing(reading, devices, own - {os.getpid()})
        self._note_released(seen)
        return seen

    def _note_released(self, devices: Iterable[str]) -> None:
        now = time.monotonic()
        with self._preempted_lock:
            for device in devices:
                self._released[self._names(device)[0]] = now

    def _own_load(self, devices: Sequence[str]) -> frozenset[str]:
        """The devices one of our probes left, or where its ranks were last seen, within NVML's
        utilization window."""
        now = time.monotonic()
        with self._preempted_lock:
            released = dict(self._released)
        recent = (
            d for d in devices if now - released.get(self._names(d)[0], -OWN_LOAD_S) < OWN_LOAD_S
        )
        return frozenset(recent)

    def survey(self, devices: Sequence[str]) -> Survey:
        """Which of `devices` may be probed now, each by itself: one full idle check of them all
        (no device is held: the caller claims the ones it then uses)."""
        devices = tuple(dict.fromkeys(devices))
        blocked = self._blocked()
        if blocked is not None:
            return Survey(devices, blocked=blocked)
        busy = {d: "paused" for d in self._paused_gpus(self.pause(), devices)}
        held = self.locks.held()
        busy.update({d: "devices_busy" for d in devices if self._names(d)[0] in held})
        # GPUs another probe of ours holds are out already: their ranks are not waited for.
        found = self._idle_check([d for d in devices if d not in busy], None)
        for device in devices:
            if device in found.busy:
                busy.setdefault(device, found.busy[device])
        self._forgive([d for d in devices if d not in busy])
        return Survey(devices, busy=busy, detail=found.detail)

    def preempted(self) -> dict[str, str]:
        """GPUs a job took from a probe (device -> what was seen), until found idle again."""
        with self._preempted_lock:
            return dict(self._preempted)

    def _mark_preempted(self, found: dict[str, str]) -> None:
        with self._preempted_lock:
            self._preempted.update(found)

    def _forgive(self, devices: Sequence[str]) -> None:
        with self._preempted_lock:
            for device in devices:
                self._preempted.pop(device, None)

    def abort_check(self, devices: Sequence[str]) -> AbortCheck:
        """Stop for shutdown, pause, or a job on our GPUs: a foreign process, or a pod the
        kubelet gave one to. NVML is read at most once per foreign_check_s by each check, and
        what it finds is remembered for every probe: a GPU once taken stops every launcher on it
        at its next poll, and no later path, pair or round starts on it until a claim's full idle
        check finds it idle again."""
        next_look = [time.monotonic() + self.foreign_check_s]
        mine = frozenset(devices)

        def abort() -> str | None:
            if self.stopping.is_set():
                return "shutdown"
            pause = self.pause()
            if pause.node is not None or self._paused_gpus(pause, devices):
                return "paused"
            if not mine:
                return None
            if mine & self.preempted().keys():
                return "preempted"
            if time.monotonic() >= next_look[0]:
                next_look[0] = time.monotonic() + self.foreign_check_s
                taken = self._taken(devices)
                if taken:
                    self._mark_preempted(taken)
                    return "preempted"
            return None

        return abort

    def _taken(self, devices: Sequence[str]) -> dict[str, str]:
        """Devices a job holds now, by NVML and the kubelet; nothing when NVML cannot answer
        (a hiccup must not stop a probe: the next look may succeed)."""
        try:
            reading = self.idle_source.read()
        except Exception:
            return {}
        self._own_on(reading, devices, own_of(reading))
        taken = {
            device: f"process {', '.join(map(str, pids))}"
            for device, pids in idle.foreign_processes(reading, devices, own_of(reading)).items()
        }
        for device, pod in idle.allocated_devices(reading, devices).items():
            taken.setdefault(device, f"given to {pod}")
        return taken


# Skip reasons by precedence when several GPUs are out for different ones: the operator's pause
# and our own probes first, then NVML's order (what will not clear by itself first).
_PRECEDENCE = ("paused", *FAULT_REASONS, "devices_busy", "own_probe", *idle.REASONS)


def _with_own_probes(found: idle.IdleDecision, lingering: frozenset[str]) -> idle.IdleDecision:
    """`found`, with the GPUs where ranks of ours stayed past OWN_EXIT_S out as `own_probe`
    (unless out for a job's reason as well: a job's process came with them)."""
    if not lingering:
        return found
    busy = {**{d: "own_probe" for d in lingering}, **found.busy}
    lines = [found.detail] if not found.idle else []
    lines.append(f"ranks of netmon's last probe still on GPU(s) {', '.join(sorted(lingering))}")
    # `reason` stays NVML's (None for our own ranks alone): claims report first_reason(busy).
    return idle.IdleDecision(idle=False, reason=found.reason, detail=" | ".join(lines), busy=busy)


def first_reason(reasons: Iterable[str]) -> str:
    """The reason to report for several GPUs out at once; "" for none."""
    found = set(reasons)
    return min(found, key=lambda r: _PRECEDENCE.index(r) if r in _PRECEDENCE else 99, default="")


def _listing(
    reading: Sequence[idle.GpuReading], devices: Sequence[str], pids: Collection[int]
) -> frozenset[str]:
    """Which of `devices` list one of `pids` in `reading` (several samples flattened)."""
    if not pids:
        return frozenset()
    return frozenset(
        device
        for device in devices
        for r in reading
        if idle.reads_as(r, device) and any(pid in pids for pid in r.compute_pids)
    )


def exited(reading: Sequence[idle.GpuReading], own: Collection[int]) -> set[int]:
    """The listed PIDs, not ours, that have no /proc entry now."""
    listed = {pid for r in reading for pid in r.compute_pids}
    return {pid for pid in listed - set(own) if not os.path.exists(f"/proc/{pid}")}


def own_of(reading: Sequence[idle.GpuReading]) -> set[int]:
    """Which of the PIDs NVML lists are ours, each traced up its own parents: a few /proc reads
    per listed process, where the whole tree would read every process of the host (hostPID)."""
    me = os.getpid()
    listed = {pid for r in reading for pid in r.compute_pids}
    return {pid for pid in listed if pid == me or descends_from(pid, me)}
