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
            yield Decision(True)

    def abort_check(self, devices: Sequence[str]) -> AbortCheck:
        """Stop for shutdown, pause, or a foreign process on our GPUs or a pod given one (NVML
        and, when configured, the kubelet; at most once per foreign_check_s)."""
        next_look = [time.monotonic() + self.foreign_check_s]

        def abort() -> str | None:
            if self.stopping.is_set():
                return "shutdown"
            if self.paused():
                return "paused"
            if devices and time.monotonic() >= next_look[0]:
                next_look[0] = time.monotonic() + self.foreign_check_s
                try:
                    reading = self.idle_source.read()
                except Exception:  # NVML hiccup: keep probing; the next look may succeed
                    return None
                if idle.foreign_processes(reading, devices, own_processes()):
                    return "preempted"
                if idle.allocated_devices(reading, devices):
                    return "preempted"
            return None

        return abort


def own_processes() -> set[int]:
    """This process and its children: rank processes (in their own sessions, but still ours)."""
    return {os.getpid(), *children_of(os.getpid())}
