"""One scheduled probe run: pause and idle checks, device locks, the probe, and its bookkeeping.

Data flows one way: config -> (pause, idle) -> launcher -> outcome -> baseline -> snapshot. The
runner never raises into the scheduler: every way a run can end is a counted skip or failure.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from netmon.config import NetmonConfig, ProbeConfig
from netmon.gpu import idle
from netmon.logs import event
from netmon.probe.launcher import Launcher
from netmon.probe.pairs import PairOutcome, best_per_pair, run_pair_rounds, verdict_at_largest
from netmon.probe.paths import intent, variant_env
from netmon.probe.spec import ProbeOutcome, ProbeSpec
from netmon.serve.results import Results
from netmon.topology.model import Topology, plan_rounds, uniform

log = logging.getLogger(__name__)

STATE_FILE = "baselines.json"


def spec_for(probe: ProbeConfig, config: NetmonConfig) -> ProbeSpec:
    """The ProbeSpec a configured probe runs on this node."""
    backend = config.backend or "gloo"
    devices: tuple[str, ...] = ()
    if backend == "nccl":
        devices = tuple(probe.devices or config.devices or ())
        ranks = len(devices)
    else:
        ranks = probe.ranks or config.ranks or 2
    spec = ProbeSpec(
        op=probe.op,
        sizes=probe.sizes,
        dtype=probe.dtype,
        warmup=probe.warmup,
        iters=probe.iters,
        batch=probe.batch,
        timing=probe.timing,
        rank_stat=probe.rank_stat,
        chunks=probe.chunks,
        backend=backend,
        ranks=ranks,
        devices=devices,
        env={**config.env, **probe.env},
        check=probe.check,
        timeout=probe.timeout,
        wrapper=config.rank_wrapper,
        host=config.rendezvous_host.format(gpu=devices[0] if devices else 0, rank=0),
    )
    return spec.model_copy(update={"deadlines": spec.deadlines.capped(probe.timeout)})


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


class ProbeRunner:
    """Runs a configured probe when the scheduler says so; never raises."""

    def __init__(
        self,
        config: NetmonConfig,
        results: Results,
        locks: DeviceLocks,
        idle_source: idle.IdleSource,
        stopping: threading.Event,
        launcher: Callable[..., Launcher] = Launcher,
    ) -> None:
        self.config = config
        self.results = results
        self.locks = locks
        self.idle_source = idle_source
        self.stopping = stopping
        self.launcher = launcher
        self._probes = {p.name: p for p in config.probes or ()}
        self.topology: Topology | None = None
        self.link_health_reader: Callable[[bool], Any] | None = None
        # How often a running probe re-reads NVML for foreign processes (the pause file is
        # checked at every launcher poll, as a stat is cheap).
        self.foreign_check_s = 1.0

    def reconfigure(self, config: NetmonConfig) -> None:
        self.config = config
        self._probes = {p.name: p for p in config.probes or ()}

    def paused(self) -> bool:
        pause = self.config.pause_file
        return bool(pause and pause.exists())

    def run(self, name: str) -> None:
        probe = self._probes[name]
        try:
            self._run(probe)
        except Exception:  # a bug here must not kill the scheduler thread or the daemon
            log.exception("probe %s: internal error", name)
            self.results.failed_internally(name)

    def _skip(self, probe: ProbeConfig, reason: str, detail: str) -> None:
        self.results.skip(probe.name, reason)
        event(
            log, "probe skipped", probe=probe.name, outcome="skipped", reason=reason, detail=detail
        )

    def _run(self, probe: ProbeConfig) -> None:
        if self.stopping.is_set():
            return self._skip(probe, "shutting_down", "the daemon is stopping")
        if self.paused():
            return self._skip(probe, "paused", f"pause file {self.config.pause_file} exists")
        spec = spec_for(probe, self.config)
        with self.locks.hold(device_keys(spec), timeout=min(probe.interval, 60.0)) as got:
            if not got:
                return self._skip(probe, "devices_busy", "another probe holds the devices")
            decision = idle.check(self.idle_source, spec.devices, {os.getpid()}, self.config.idle)
            if not decision.idle:
                return self._skip(probe, decision.reason or "gpu_unknown", decision.detail)
            if probe.kind == "pairs":
                self._pairs(probe, spec)
            else:
                self._variants(probe, spec)
        return None

    def _variants(self, probe: ProbeConfig, spec: ProbeSpec) -> None:
        """Every path variant of the probe, one after the other, each in fresh ranks."""
        abort = self._abort_check(spec.devices)
        all_nvlink = self.topology is not None and all_nvlink_between(self.topology, spec.devices)
        for path in probe.paths:
            if abort() is not None and path != probe.paths[0]:
                break
            variant = spec.model_copy(
                update={
                    "env": tuple(sorted({**variant_env(path), **spec.env_dict()}.items())),
                    "intent": intent(path, all_nvlink),
                    "path": path,
                }
            )
            self.results.started(probe.name)
            launcher = self.launcher(
                variant, abort=abort, python=self._python(), on_event=self._on_measure(variant)
            )
            outcome = launcher.run()
            self.results.finished(probe, outcome, path)
            self._log_outcome(probe, outcome, path)

    def _pairs(self, probe: ProbeConfig, spec: ProbeSpec) -> None:
        topo = self.topology or uniform(spec.ranks, "CPU")
        rounds = plan_rounds(topo)
        paths = {pair: str(path) for pair, path in topo.pairs().items()}
        devices = tuple(str(i) for i in topo.indices) if spec.backend == "nccl" else ()
        abort = self._abort_check(devices)
        self.results.started(probe.name)
        started = time.monotonic()
        measured: list[PairOutcome] = []
        for _ in range(probe.passes):
            measured += run_pair_rounds(
                spec,
                rounds,
                paths,
                topology=topo,
                host_template=self.config.rendezvous_host,
                abort=abort,
                python=self._python(),
            )
        results = best_per_pair(measured)
        verdict = verdict_at_largest(results, probe.suspect_ratio)
        self.results.finished_pairs(probe, results, verdict, time.monotonic() - started)
        failed = [item for item in results if not item.outcome.ok]
        fields: dict[str, Any] = dict(
            probe=probe.name, pairs=len(results), failed=len(failed), verdict=verdict.describe()
        )
        level = (
            logging.WARNING
            if failed or verdict.suspect_pairs or verdict.suspect_members
            else logging.INFO
        )
        event(log, "pair probes done", level=level, outcome="failed" if failed else "ok", **fields)

    def _python(self) -> str:
        return self.config.rank_python or sys.executable

    def _on_measure(self, spec: ProbeSpec) -> Callable[[str, dict[str, Any]], None] | None:
        """Read link health once traffic flows: an idle GPU lowers its PCIe generation."""
        if self.link_health_reader is None or spec.backend != "nccl":
            return None
        reader = self.link_health_reader
        taken = threading.Event()

        def on_event(kind: str, fields: dict[str, Any]) -> None:
            if kind == "phase" and fields.get("phase") == "measure" and not taken.is_set():
                taken.set()

                def read() -> None:
                    try:
                        self.results.set_link_health(reader(True))
                    except Exception as exc:  # NVML trouble must never touch the probe
                        log.debug("link health read failed: %s", exc)

                threading.Thread(target=read, name="link-health", daemon=True).start()

        return on_event

    def _abort_check(self, devices: Sequence[str]) -> Callable[[], str | None]:
        """Stop for shutdown, pause, or a foreign process on our GPUs or a pod given one (NVML
        and, when configured, the kubelet; once a second)."""
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

    def _log_outcome(self, probe: ProbeConfig, outcome: ProbeOutcome, path: str) -> None:
        fields: dict[str, Any] = dict(
            probe=probe.name,
            path=path,
            op=outcome.spec.op,
            wall_s=round(outcome.wall_s, 3),
            collective_s=round(outcome.collective_s, 3),
        )
        if outcome.failure is not None:
            fields.update(
                outcome="failed", reason=outcome.failure.reason, detail=outcome.failure.describe()
            )
            event(log, "probe failed", level=logging.WARNING, **fields)
            return
        largest = max(outcome.results, key=lambda r: r.size_bytes, default=None)
        if largest is not None:
            fields.update(
                size_bytes=largest.size_bytes,
                busbw_gbps=round(largest.busbw_bytes_per_second / 1e9, 4),
                latency_us=round(outcome.results[0].time_s * 1e6, 1),
            )
        event(log, "probe ok", outcome="ok", **fields)


def own_processes() -> set[int]:
    """This process and its children: rank processes (in their own sessions, but still ours)."""
    me = os.getpid()
    found = {me}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == me:
            found.add(int(entry.name))
    return found


def all_nvlink_between(topology: Topology, devices: Sequence[str]) -> bool:
    indices = [int(d) for d in devices if d.isdigit() and int(d) in topology.indices]
    if len(indices) < 2:
        return False
    return all(topology.is_nvlink(a, b) for a in indices for b in indices if a < b)
