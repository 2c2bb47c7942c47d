"""The one decision whether a probe may start now, and whether a running one must stop: the
daemon is not stopping, the operator has not paused it, the probe holds its devices, and NVML
(and the kubelet) show them idle. Local runs and group rounds both ask here."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from netmon.gpu import idle
from netmon.probe.launcher import AbortCheck
from netmon.probe.processes import children_of
from netmon.probe.spec import ProbeSpec
from netmon.serve.current import CurrentConfig

# How often a running probe re-reads NVML for foreign processes (the pause file is checked at
# every launcher poll, as a stat is cheap).
FOREIGN_CHECK_S = 1.0


@dataclass(frozen=True)
class Decision:
    """May the probe start: `ready`, or the counted skip `reason` with a detail for the log."""

    ready: bool
    reason: str = ""
    detail: str = ""


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
    ) -> None:
        self.current = current
        self.locks = locks
        self.idle_source = idle_source
        self.stopping = stopping
        self.foreign_check_s = FOREIGN_CHECK_S
        # GPUs on which a job appeared while we probed them: off limits to every probe and every
        # launcher at once, until the full idle check of a later claim finds them idle again.
        self._preempted: dict[str, str] = {}
        self._preempted_lock = threading.Lock()

    def paused(self) -> bool:
        pause = self.current.get().pause_file
        return bool(pause and pause.exists())

    @contextmanager
    def claim(
        self, keys: frozenset[str], devices: Sequence[str], lock_timeout: float
    ) -> Iterator[Decision]:
        """Decide, holding the devices `keys` while the caller runs when ready; `devices` are
        the GPUs that must be idle (all of them, or the ones this node gives to a round)."""
        if self.stopping.is_set():
            yield Decision(False, "shutting_down", "the daemon is stopping")
            return
        if self.paused():
            yield Decision(False, "paused", f"pause file {self.current.get().pause_file} exists")
            return
        with self.locks.hold(keys, timeout=lock_timeout) as got:
            if not got:
                yield Decision(False, "devices_busy", "another probe holds the devices")
                return
            found = idle.check(self.idle_source, devices, {os.getpid()}, self.current.get().idle)
            if not found.idle:
                yield Decision(False, found.reason or "gpu_unknown", found.detail)
                return
            self._forgive(devices)
            yield Decision(True)

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
            if self.paused():
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
        taken = {
            device: f"process {', '.join(map(str, pids))}"
            for device, pids in idle.foreign_processes(reading, devices, own_processes()).items()
        }
        for device, pod in idle.allocated_devices(reading, devices).items():
            taken.setdefault(device, f"given to {pod}")
        return taken


def own_processes() -> set[int]:
    """This process and its children: rank processes (in their own sessions, but still ours)."""
    return {os.getpid(), *children_of(os.getpid())}
